"""GPU tests of the native HIP top-k family (backends_rocm/kernels/topk.hip) against the exact reference.

On the H200 the hip provider is the HIP source built by nvcc through the compat header (warp 32); on
a gfx950 GPU it is the native build. The reference (window_topk, map_through_page_table) runs on the
GPU tensors themselves. Plain calls are compared as sets, deterministic=True exactly. The `split`
fixture reaches both paths on the same inputs through the one override,
dsa_ops.backends.rocm.topk_heuristics.force: the heuristic, one workgroup per row, 4 parts per row.
Run with `pytest -m gpu tests/test_gpu_topk_hip.py`.
"""

from __future__ import annotations

import dsa_ops
import pytest
import torch
from dsa_ops.ops._common import INT32_MAX, map_through_page_table, window_topk
from dsa_ops.ops.topk_ragged_transform import reference as ragged_reference
from dsa_ops.testing import topk_scores

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (run `pytest -m gpu` on the H200)"),
]
DEV = "cuda"
POISON = 0x7AAAAAAA


@pytest.fixture(autouse=True)
def _hip():
    if torch.version.hip is not None:
        arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
        if arch != "gfx950":
            pytest.skip(f"the native HIP provider is built for gfx950, this GPU is {arch}")
    with dsa_ops.use_backend("hip"):
        yield


def _force(monkeypatch, n):
    from dsa_ops.backends.rocm import topk_heuristics

    monkeypatch.setattr(topk_heuristics, "force", n)


@pytest.fixture(params=[None, 1, 4], ids=["auto", "split1", "split4"])
def split(request, monkeypatch):
    _force(monkeypatch, request.param)
    return request.param


def as_sets(x):
    big = torch.where(x == -1, torch.full_like(x, INT32_MAX, dtype=torch.int64), x.long())
    return torch.sort(big, dim=1).values


def check_topk(scores, k, lengths=None, row_starts=None, what=""):
    ref = window_topk(scores, k, lengths, row_starts)
    got = dsa_ops.topk(scores, k, lengths=lengths, row_starts=row_starts)
    assert got.shape == ref.shape and got.dtype == torch.int32
    bad = (as_sets(got) != as_sets(ref)).any(dim=1)
    assert not bad.any(), f"{what}: rows {bad.nonzero().flatten()[:8].tolist()} differ (as sets)"
    got = dsa_ops.topk(scores, k, lengths=lengths, row_starts=row_starts, deterministic=True)
    bad = (got != ref).any(dim=1)
    assert not bad.any(), f"{what}: rows {bad.nonzero().flatten()[:8].tolist()} differ (deterministic)"


def gen_rows(dist, rows, width, dtype, g):
    return topk_scores(dist, rows, width, dtype, generator=g, device=DEV)


DISTS = ["normal", "equal", "zeros", "mostly_zero", "ties", "narrow", "big", "nan_inf"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("shape", [(4, 3000), (2, 70000)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("dist", DISTS)
def test_distributions(dist, dtype, shape, split):
    g = torch.Generator(device=DEV).manual_seed(10 * DISTS.index(dist) + shape[0])
    x = gen_rows(dist, *shape, dtype, g)
    for k in (1, 64, 2048):
        check_topk(x, k, what=f"{dist} {dtype} {shape} k={k}")


def test_windows(split):
    g = torch.Generator(device=DEV).manual_seed(1)
    rows, width = 64, 20000
    x = torch.randn(rows, width + 7, device=DEV, generator=g)[:, 3:3 + width]  # row stride != width
    lengths = torch.randint(-50, width + 100, (rows,), device=DEV, dtype=torch.int32, generator=g)
    starts = torch.randint(-100, width + 50, (rows,), device=DEV, dtype=torch.int32, generator=g)
    lengths[:8] = torch.tensor([0, -1, 1, 5, 2047, 2048, 2049, width], dtype=torch.int32, device=DEV)
    starts[:8] = torch.tensor([0, 0, 0, width - 2, 10, 0, -1, width + 1], dtype=torch.int32, device=DEV)
    starts[8] = -(2**31)
    lengths[8] = 2**31 - 1
    for k in (1, 100, 2048):
        check_topk(x, k, lengths, starts, what=f"windows k={k}")
        check_topk(x, k, lengths, None, what=f"lengths only k={k}")
        check_topk(x, k, None, starts, what=f"starts only k={k}")


def test_tie_buffer_overflow_and_fit(monkeypatch):
    g = torch.Generator(device=DEV).manual_seed(2)
    for force in (1, 4):
        _force(monkeypatch, force)
        x = torch.full((2, 70000), 0.5, device=DEV)  # the threshold bin holds all keys: full rescans
        x[1, ::3] = 0.25
        check_topk(x, 2048, what=f"overflow force={force}")
        y = torch.randn(2, 70000, device=DEV, generator=g)
        y[0, ::11] = 1.0  # ~6400 ties just above the tie buffer's capacity
        y[1, ::13] = 1.0  # ~5400 ties inside it
        check_topk(y, 2048, what=f"ties near capacity force={force}")
        check_topk(y, 5000, what=f"k=5000 force={force}")


def test_million_keys(split):
    g = torch.Generator(device=DEV).manual_seed(3)
    x = torch.randn(2, 1 << 20, device=DEV, generator=g)
    x[1, 1000:] = x[1, 1000:].clamp(max=0.5)
    check_topk(x, 2048, what="1M")
    check_topk(x.to(torch.bfloat16), 2048, what="1M bf16")


def test_many_rows(monkeypatch):
    _force(monkeypatch, None)
    g = torch.Generator(device=DEV).manual_seed(4)
    rows = 150000
    x = torch.randn(rows, 96, device=DEV, generator=g).to(torch.bfloat16)
    lengths = torch.randint(0, 97, (rows,), device=DEV, dtype=torch.int32, generator=g)
    check_topk(x, 32, lengths, what="150000 rows")


def test_page_table_and_ragged(split):
    g = torch.Generator(device=DEV).manual_seed(5)
    rows, width, k, page = 6, 70000, 2048, 64
    x = torch.randn(rows, width, device=DEV, generator=g)
    x[2] = 0.0
    lengths = torch.tensor([width, 1000, 5000, 0, 2048, 69000], dtype=torch.int32, device=DEV)
    starts = torch.tensor([0, 5, 100, 0, 3, 1000], dtype=torch.int32, device=DEV)
    pages = (width + page - 1) // page
    pt = torch.randint(-1, 1 << 20, (4, pages + 3), device=DEV, dtype=torch.int32, generator=g)
    pt[0, 5] = INT32_MAX // 32  # slot id past int32 for page 64
    rtb = torch.tensor([0, 1, 2, 3, -1, 9], dtype=torch.int32, device=DEV)
    pts = torch.tensor([0, 1, 2, 3, 0, -5], dtype=torch.int32, device=DEV)
    for p, r2b, ps in ((page, None, None), (page, rtb, pts), (1, rtb, None), (256, None, pts)):
        raw = window_topk(x, k, lengths, starts)
        want = map_through_page_table(raw, pt[:, :pages] if r2b is None else pt, r2b, ps, p)
        table = pt[:, :pages] if r2b is None else pt
        kw = dict(row_starts=starts, page_table_row_starts=ps, row_to_batch=r2b, page_size=p)
        out = torch.full((rows, k), POISON, dtype=torch.int32, device=DEV)
        out_raw = torch.full((rows, k), POISON, dtype=torch.int32, device=DEV)
        dsa_ops.topk_page_table_transform(x, table, lengths, k, deterministic=True, out=out, out_raw=out_raw,
                                          **kw)
        assert torch.equal(out, want) and torch.equal(out_raw, raw), f"page_size={p}"
        got = dsa_ops.topk_page_table_transform(x, table, lengths, k, **kw)
        assert torch.equal(as_sets(got), as_sets(want)), f"page_size={p} (sets)"
    offsets = torch.tensor([0, 7, -3, 100, INT32_MAX - 100, -(2**31)], dtype=torch.int32, device=DEV)
    raw = window_topk(x, k, lengths, starts).long()
    shifted = raw + offsets.long()[:, None]
    want = torch.where((raw >= 0) & (shifted >= 0) & (shifted <= INT32_MAX), shifted, -1).to(torch.int32)
    got = dsa_ops.topk_ragged_transform(x, offsets, lengths, k, row_starts=starts)
    assert torch.equal(as_sets(got), as_sets(want))


def test_split_heuristic_is_one_function():
    from dsa_ops.backends.rocm import topk_heuristics as h

    assert h.force is None
    assert h.split_factor(4096, 32768, 132) == 1
    assert h.split_factor(1, 131072, 132) > 1
    assert h.split_factor(64, 1 << 20, 304) > 1
    assert h.split_factor(1000, 1 << 20, 132) == 1


def nan_rows(rows, width, dtype, k, g):
    """Row r % 6: no NaN; 37 NaNs; exactly k; k + 300 with 500 +inf; 90% NaN; all NaN."""
    x = torch.randn(rows, width, device=DEV, generator=g)
    for r in range(rows):
        perm = torch.randperm(width, device=DEV, generator=g)
        n = (0, 37, k, k + 300, width * 9 // 10, width)[r % 6]
        x[r, perm[:n]] = float("nan")
        if r % 6 == 3:
            x[r, perm[n:n + 500]] = float("inf")
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_nan_first(dtype, split):
    g = torch.Generator(device=DEV).manual_seed(77)
    for rows, width in ((12, 3000), (6, 70000)):
        x = nan_rows(rows, width, dtype, 2048, g)
        starts = torch.randint(0, width // 4, (rows,), device=DEV, dtype=torch.int32, generator=g)
        lengths = torch.randint(100, width, (rows,), device=DEV, dtype=torch.int32, generator=g)
        for k, win in ((64, {}), (2048, {}), (2048, dict(lengths=lengths, row_starts=starts))):
            ref = window_topk(x, k, win.get("lengths"), win.get("row_starts"), nan_first=True)
            got = dsa_ops.topk(x, k, deterministic=True, nan_first=True, **win)  # every HIP row is ascending
            bad = (got != ref).any(dim=1)
            assert not bad.any(), f"{dtype} {width} k={k}: rows {bad.nonzero().flatten()[:8].tolist()} differ"
            last = dsa_ops.topk(x, k, **win)
            assert torch.equal(as_sets(last), as_sets(window_topk(x, k, win.get("lengths"), win.get("row_starts"))))
        full = torch.full((rows,), width, dtype=torch.int32, device=DEV)
        table = torch.randint(0, 1 << 20, (rows, (width + 63) // 64), dtype=torch.int32, device=DEV, generator=g)
        got = dsa_ops.topk_page_table_transform(x, table, full, 2048, nan_first=True)
        want = map_through_page_table(window_topk(x, 2048, nan_first=True), table, None, None, 64)
        assert torch.equal(got, want)
        offsets = torch.randint(0, 1 << 20, (rows,), device=DEV, dtype=torch.int32, generator=g)
        got = dsa_ops.topk_ragged_transform(x, offsets, full, 2048, nan_first=True)
        assert torch.equal(as_sets(got), as_sets(ragged_reference(x, offsets, full, 2048, None, True)))
