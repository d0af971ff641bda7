"""The top-k family's references against brute force: ties, NaN, +-0, windows, page mapping."""

import math

import dsa_ops
import dsa_ops.testing
import pytest
import torch
from brute import page_map, topk_row
from hypothesis import given, settings
from hypothesis import strategies as st

VALUES = st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, 1e30, -1e30, 70000.0, math.inf, -math.inf, math.nan, 1.0 + 2**-20])


@st.composite
def topk_case(draw):
    rows = draw(st.integers(1, 4))
    width = draw(st.integers(0, 24))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    vals = draw(st.lists(st.one_of(VALUES, st.floats(-4, 4, width=32)), min_size=rows * width, max_size=rows * width))
    scores = torch.tensor(vals, dtype=torch.float32).view(rows, width).to(dtype)
    k = draw(st.integers(1, 10))
    use_len = draw(st.booleans())
    lengths = torch.tensor(draw(st.lists(st.integers(-3, 30), min_size=rows, max_size=rows)), dtype=torch.int32)
    starts = torch.tensor(draw(st.lists(st.integers(-5, 26), min_size=rows, max_size=rows)), dtype=torch.int32)
    use_start = draw(st.booleans())
    return scores, k, (lengths if use_len else None), (starts if use_start else None)


def _expected(scores, k, lengths, starts, nan_first=False):
    f = scores.float()
    out = []
    for r in range(scores.shape[0]):
        s = int(starts[r]) if starts is not None else 0
        n = int(lengths[r]) if lengths is not None else None
        out.append(topk_row(f[r].tolist(), k, s, n, nan_first))
    return out


@settings(max_examples=300, deadline=None)
@given(topk_case())
def test_topk_matches_brute_force(case):
    scores, k, lengths, starts = case
    got = dsa_ops.topk(scores, k, lengths=lengths, row_starts=starts, deterministic=True)
    for r, want in enumerate(_expected(scores, k, lengths, starts)):
        row = got[r].tolist()
        picked = [i for i in row if i != -1]
        assert set(picked) == want and len(picked) == len(want)
        assert row == sorted(want) + [-1] * (k - len(want))  # deterministic: ascending, then -1


@settings(max_examples=300, deadline=None)
@given(topk_case(), st.integers(0, 2))
def test_nan_first_matches_brute_force_in_every_op(case, which):
    scores, k, lengths, starts = case
    if which == 0:
        got = dsa_ops.topk(scores, k, lengths=lengths, row_starts=starts, deterministic=True, nan_first=True)
    else:
        rows = scores.shape[0]
        lengths = lengths if lengths is not None else torch.full((rows,), scores.shape[1], dtype=torch.int32)
        if which == 1:  # an identity table: slot == relative index
            pt = torch.arange(64, dtype=torch.int32).repeat(rows, 1)
            got = dsa_ops.topk_page_table_transform(scores, pt, lengths, k, row_starts=starts, page_size=1,
                                                    deterministic=True, nan_first=True)
        else:
            got = dsa_ops.topk_ragged_transform(scores, torch.zeros(rows, dtype=torch.int32), lengths, k,
                                                row_starts=starts, nan_first=True)
    for r, want in enumerate(_expected(scores, k, lengths, starts, nan_first=True)):
        picked = [i for i in got[r].tolist() if i != -1]
        assert set(picked) == {i for i in want if i >= 0} and len(picked) == len([i for i in want if i >= 0])


def test_nan_first_hand_worked():
    s = torch.tensor([[1.0, math.nan, 3.0, math.nan, math.inf, math.nan, -math.inf]])
    assert dsa_ops.topk(s, 2, nan_first=True).tolist() == [[1, 3]]  # NaNs first, ties to the smaller index
    assert dsa_ops.topk(s, 4, nan_first=True).tolist() == [[1, 3, 4, 5]]  # then +inf
    assert dsa_ops.topk(s, 5, nan_first=True).tolist() == [[1, 2, 3, 4, 5]]
    assert dsa_ops.topk(s, 2).tolist() == [[2, 4]]
    win = dict(lengths=torch.tensor([3], dtype=torch.int32), row_starts=torch.tensor([2], dtype=torch.int32))
    assert dsa_ops.topk(s, 2, nan_first=True, **win).tolist() == [[1, 2]]  # columns 3, 4: NaN, +inf
    for bad in (None, 1, torch.tensor(True), "yes"):
        with pytest.raises(dsa_ops.DsaArgumentError, match="nan_first"):
            dsa_ops.topk(s, 2, nan_first=bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_nan_first_is_torch_topk_set(dtype):
    """Whole rows of distinct numbers and NaNs (fewer than k, k, more than k): torch.topk's set, values
    compared where NaNs tie (torch returns any k of them)."""
    g = torch.Generator().manual_seed(3)
    scores = torch.randperm(4 * 500, generator=g).view(4, 500).to(torch.float32).to(dtype)  # distinct in fp16
    scores[1, ::97] = math.nan
    scores[2, 10:42] = math.nan
    scores[3, 5:400:3] = math.nan
    for k in (1, 32, 200):
        got = dsa_ops.topk(scores, k, nan_first=True).long()
        want = torch.topk(scores, k, sorted=False).indices
        gv, wv = scores.gather(1, got).float().sort(1).values, scores.gather(1, want).float().sort(1).values
        assert torch.equal(gv.isnan(), wv.isnan()) and torch.equal(gv.nan_to_num(), wv.nan_to_num())


def test_topk_hand_worked():
    s = torch.tensor([[1.0, math.nan, 3.0, -0.0, 0.0, 3.0, -math.inf]])
    assert dsa_ops.topk(s, 4).tolist() == [[0, 2, 3, 5]]  # 3,3 then 1 then -0 (ties: smaller index)
    assert dsa_ops.topk(s, 7).tolist() == [[0, 1, 2, 3, 4, 5, 6]]
    # NaN is below -inf: with 6 picks the NaN (index 1) is the one left out.
    assert dsa_ops.topk(s, 6).tolist() == [[0, 2, 3, 4, 5, 6]]
    one = torch.tensor([2], dtype=torch.int32)
    assert dsa_ops.topk(s, 3, lengths=one, row_starts=torch.tensor([4], dtype=torch.int32)).tolist() == [[0, 1, -1]]


def test_topk_window_edges():
    s = torch.arange(10, dtype=torch.float32).view(1, 10)
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    assert dsa_ops.topk(s, 2, lengths=i32(-5)).tolist() == [[-1, -1]]  # negative length: empty
    assert dsa_ops.topk(s, 2, lengths=i32(100), row_starts=i32(8)).tolist() == [[0, 1]]  # past the end: clipped
    # A negative start: indices stay relative to it, so the clipped window [0, 3) reads as 5..7.
    assert dsa_ops.topk(s, 5, lengths=i32(8), row_starts=i32(-5)).tolist() == [[5, 6, 7, -1, -1]]
    # int32 overflow of start + length must not wrap.
    assert dsa_ops.topk(s, 1, lengths=i32(2**31 - 1), row_starts=i32(5)).tolist() == [[4]]
    assert dsa_ops.topk(torch.empty(3, 0), 2).tolist() == [[-1, -1]] * 3


def test_topk_non_contiguous_rows():
    base = torch.randn(6, 40)
    view = base[::2, 5:35]
    assert view.stride() == (80, 1)
    got = dsa_ops.topk(view, 5)
    want = dsa_ops.topk(view.contiguous(), 5)
    assert torch.equal(got, want)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_page_mapping_matches_brute_force(data):
    rows, k = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 6))
    nb, mp = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4))
    p = data.draw(st.sampled_from([1, 2, 4, 64]))
    idx = data.draw(st.lists(st.integers(-3, 4 * p + 3), min_size=rows * k, max_size=rows * k))
    pt = data.draw(st.lists(st.sampled_from([-1, 0, 1, 2, 5, 2**30, 2**31 - 1]), min_size=nb * mp, max_size=nb * mp))
    rtb = data.draw(st.lists(st.integers(-1, nb), min_size=rows, max_size=rows))
    prs = data.draw(st.lists(st.integers(-1, mp), min_size=rows, max_size=rows))
    use_rtb, use_prs = data.draw(st.booleans()), data.draw(st.booleans())
    t = lambda v, *shape: torch.tensor(v, dtype=torch.int32).view(*shape)  # noqa: E731
    got = dsa_ops.page_table_transform(
        t(idx, rows, k), t(pt, nb, mp), row_to_batch=t(rtb, rows) if use_rtb else None,
        page_table_row_starts=t(prs, rows) if use_prs else None, page_size=p)
    table = t(pt, nb, mp).tolist()
    for r in range(rows):
        b = rtb[r] if use_rtb else r
        ps = prs[r] if use_prs else 0
        for j in range(k):
            assert got[r, j].item() == page_map(idx[r * k + j], table, b, ps, p)


@pytest.mark.parametrize("log2", [30, 31, 32, 62])
def test_page_sizes_past_int32_do_not_wrap(log2):
    """page * P leaves int64 at P = 2^62, page 2: such slots are -1, as every slot id past int32 is."""
    idx = torch.tensor([[0, 5, 2**31 - 1, -1]], dtype=torch.int32)
    pt = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    got = dsa_ops.page_table_transform(idx, pt, page_size=2**log2)
    want = [[page_map(i, pt.tolist(), 0, 0, 2**log2) for i in idx[0].tolist()]]
    assert got.tolist() == want
    assert (got == -1).all() if log2 >= 31 else got[0, 0] == -1  # 2 * 2^30 + 0 is 2^31: past int32 too


def test_page_table_transform_in_place_and_strided_table():
    idx = torch.tensor([[0, 65, -1, 300]], dtype=torch.int32)
    big = torch.tensor([[7, 8, 9, 10, 11, 12]], dtype=torch.int32)
    pt = big[:, ::1][:, :3]
    want = [[7 * 64, 8 * 64 + 1, -1, -1]]
    out = dsa_ops.page_table_transform(idx, pt, page_size=64, out=idx)
    assert out.data_ptr() == idx.data_ptr() and idx.tolist() == want


def test_topk_page_table_and_ragged_transforms():
    torch.manual_seed(0)
    s = torch.randn(3, 300)
    lengths = torch.tensor([300, 100, 5], dtype=torch.int32)
    starts = torch.tensor([0, 50, 290], dtype=torch.int32)
    pt = torch.randint(0, 100, (2, 8), dtype=torch.int32)
    rtb = torch.tensor([1, 0, 1], dtype=torch.int32)
    k = 16
    raw = dsa_ops.topk(s, k, lengths=lengths, row_starts=starts)
    out_raw = torch.full((3, k), -7, dtype=torch.int32)
    mapped = dsa_ops.topk_page_table_transform(s, pt, lengths, k, row_starts=starts, row_to_batch=rtb,
                                               page_size=64, out_raw=out_raw)
    assert torch.equal(out_raw, raw)
    assert torch.equal(mapped, dsa_ops.page_table_transform(raw, pt, row_to_batch=rtb, page_size=64))
    offsets = torch.tensor([0, 1000, 2**31 - 3], dtype=torch.int32)
    rag = dsa_ops.topk_ragged_transform(s, offsets, lengths, k, row_starts=starts)
    r64 = raw.long() + offsets.long()[:, None]
    want = torch.where((raw >= 0) & (r64 <= 2**31 - 1), r64, -1)
    assert torch.equal(rag.long(), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_topk_half_dtypes_rank_as_fp32(dtype):
    s = torch.tensor([[1.0, 1.0078125, 1.0, 65504.0, -65504.0, 0.0]]).to(dtype)
    assert set(dsa_ops.topk(s, 2)[0].tolist()) == {1, 3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dist", list(dsa_ops.testing.TOPK_DISTRIBUTIONS))
def test_reference_on_shared_distributions(dist, dtype):
    # The distributions the GPU tests and the benchmarks draw from (dsa_ops.testing), on the CPU: the
    # reference against brute force, and the draw reproducible from the generator's seed.
    g = torch.Generator().manual_seed(3)
    scores = dsa_ops.testing.topk_scores(dist, 3, 300, dtype, generator=g, device="cpu")
    again = dsa_ops.testing.topk_scores(dist, 3, 300, dtype, generator=torch.Generator().manual_seed(3), device="cpu")
    assert scores.shape == (3, 300) and scores.dtype == dtype
    assert torch.equal(scores.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       again.view(torch.int16 if dtype != torch.float32 else torch.int32))  # (bitwise: NaN too)
    got = dsa_ops.reference.topk(scores, 40)
    f = scores.float()
    for r in range(3):
        assert set(got[r].tolist()) == topk_row(f[r].tolist(), 40, 0, None), (dist, r)
