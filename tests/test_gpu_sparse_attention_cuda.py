"""dsa.sparse_attention's CUDA provider (fp8 caches) on the GPU against the reference (fp32 on dequantised values).

Inputs from tests/sparse_attention_cases.py, as the Triton provider's tests: unreferenced pages NaN, permuted
block tables with invalid entries, indices -1 / INT32_MIN / INT32_MAX / past the table, rows with no valid
index, padding rows. Outputs NaN-poisoned before each call. Tolerance (bf16 output): per (row, head) the
largest error at most 2e-2 of the largest reference value, cosine similarity at least 0.999, exact 0 where the
reference is 0. Every case runs the single pass and forced split counts (the combine kernel), in CTAs of 4 and of
16 warps.
"""

from __future__ import annotations

import dsa_ops
import pytest
import torch
from dsa_ops import registry
from dsa_ops.ops.sparse_attention import reference
from sparse_attention_cases import FP8, compare, every_code_cases, make_case
from sparse_attention_cases import SHAPES as CASE_SHAPES

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
if torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("the CUDA sparse attention kernel runs on SM90 here (SM100: compiled, not run)",
                allow_module_level=True)

cu = pytest.importorskip("dsa_ops.backends.cuda.providers_sparse_attention")
from dsa_ops.backends.cuda import sm_count  # noqa: E402

SCALES = (128**-0.5, 0.7, 1.9)
SHAPES = {**CASE_SHAPES, "topk-odd": (9, 24, 2, 128, 128, 64, 300, 4, 40, 37)}  # + top-k off the 16-token step
SPLITS = (None, 1, 3, 64)
WARPS = (0, 4, 16)  # 0: the launcher's rule


def _case(shape, seed=0, layout="plain", hostile=True):
    rows, hq, hkv, d, dv, page, nb, nreq, mp, topk = SHAPES[shape] if isinstance(shape, str) else shape
    return make_case(rows, hq, hkv, d, dv, page=page, num_blocks=nb, num_reqs=nreq, max_pages=mp, topk=topk,
                     dtype=FP8, seed=seed, device="cuda", cache_layout=layout, hostile=hostile)


def _run(case, scales=SCALES, splits=None, whole=0, warps=0):
    q, kc, vc, idx, bt, t2r = case
    out = torch.full((q.shape[0], q.shape[1], vc.shape[3]), float("nan"), dtype=torch.bfloat16, device=q.device)
    cu.launch(q, kc, vc, idx, bt, t2r, *scales, out, splits=splits, whole=whole, warps=warps)
    return out


def _check(case, scales=SCALES, splits=None, whole=0, warps=0):
    out = _run(case, scales, splits, whole, warps)
    err = compare(out, reference(*case, *scales))
    assert err is None, err


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("warps", WARPS)
def test_matches_reference(shape, splits, warps):
    _check(_case(shape, seed=len(shape)), splits=splits, warps=warps)


@pytest.mark.parametrize("shape", [(600, 16, 1, 128, 128, 64, 900, 9, 40, 384),
                                   (80, 64, 8, 128, 128, 16, 900, 5, 90, 500),
                                   (300, 24, 2, 128, 128, 64, 1500, 11, 64, 2048),
                                   (150, 12, 2, 128, 128, 64, 1500, 11, 64, 1536),
                                   (170, 8, 1, 128, 128, 32, 3000, 13, 80, 1551),
                                   (560, 16, 1, 128, 128, 64, 900, 9, 40, 641)])
@pytest.mark.parametrize("warps", WARPS)
def test_several_units_a_cta(shape, warps):
    """More (row, KV head) items than CTA slots (4 a multiprocessor): the persistent grid of 4-warp CTAs hands
    each CTA several units, with the next unit's lookups and first copies issued under the current one's last
    steps (top-k 641: 41 steps, 10 or 11 a warp); 16-warp CTAs forced run one a unit, in several waves. Hostile rows
    (padding rows, invalid indices, NaN-filled unused pages) land in later units too."""
    rows, _, hkv = shape[:3]
    assert rows * hkv > sm_count(None)
    _check(_case(shape, seed=rows), warps=warps)


@pytest.mark.parametrize("splits,whole", [(2, 1), (3, 17), (4, 40), (8, 45), (2, 46), (4, 10**6)])
def test_split_tail(splits, whole):
    """A split tail: the first `whole` (row, KV head) items unsplit, the rest split, their partials combined
    (whole past the item count: every item unsplit, no combine). Hostile rows on both sides of the boundary."""
    _check(_case((23, 24, 2, 128, 128, 64, 900, 7, 40, 700), seed=whole % 97 + splits), splits=splits, whole=whole)


def test_split_tail_plan():
    """A shape 74 items past one wave of slots: the automatic plan (split_plan's split tail), the split tail
    forced, and the persistent grid."""
    slots = cu.CTAS_PER_SM * sm_count(None)
    case = _case((slots // 2 + 37, 24, 2, 128, 128, 64, 1500, 11, 64, 2048), seed=5)
    for splits, whole in ((None, 0), (1, 0), (2, slots), (4, slots)):
        _check(case, splits=splits, whole=whole)


def test_output_off_16_byte_alignment():
    """An out view 2 bytes past an aligned base, and one on an aligned base whose head stride (129 elements) is
    not a multiple of 16 bytes: the outputs are stored without 16-byte stores, same values."""
    case = _case("verify5", seed=9)
    q = case[0]
    ref = reference(*case, *SCALES)
    for splits in (1, 2):
        flat = torch.full((q.numel() + 1,), float("nan"), dtype=torch.bfloat16, device=q.device)
        shifted = flat[1:].view(q.shape[0], q.shape[1], 128)
        strided = torch.full((q.shape[0], q.shape[1], 129), float("nan"), dtype=torch.bfloat16, device=q.device)
        for out in (shifted, strided[..., :128]):
            cu.launch(*case, *SCALES, out, splits=splits)
            assert compare(out, ref) is None, compare(out, ref)


@pytest.mark.parametrize("splits", SPLITS)
def test_vllm_strided_cache_views(splits):
    """K and V as views of one [num_blocks, Hkv, P, D + Dv] buffer (vLLM's layout)."""
    _check(_case((64, 24, 2, 128, 128, 64, 500, 6, 64, 2048), seed=3, layout="vllm"), splits=splits)


@pytest.mark.parametrize("heads", [(16, 1), (12, 1), (8, 8), (6, 2), (32, 2), (1, 1)])
def test_head_groups(heads):
    hq, hkv = heads
    for splits in (1, 2):
        _check(_case((23, hq, hkv, 128, 128, 16, 400, 5, 50, 300), seed=hq * 7 + hkv), splits=splits)


@pytest.mark.parametrize("page", [1, 16, 48, 64, 128])
def test_page_sizes(page):
    for splits in (None, 1, 2):
        _check(_case((19, 24, 2, 128, 128, page, 3000 // page + 40, 4, 2000 // page, 512), seed=page), splits=splits)


def test_every_code_and_nan():
    """Every e4m3 code in valid tokens (subnormals, +-0, +-448), then NaN codes in a valid token's K and V:
    NaN exactly where the reference has it, the rest within tolerance."""
    finite, case = every_code_cases("cuda")
    scales = (0.01, 1.0, 1.0)
    for splits, warps in ((1, 4), (1, 16), (4, 4)):
        _check(finite, scales, splits, warps=warps)
    ref = reference(*case, *scales)
    assert ref.isnan().any()
    for splits, warps in ((1, 4), (1, 16), (4, 4)):
        out = _run(case, scales, splits, warps=warps)
        nan, ref_nan = out.isnan(), ref.isnan()
        assert torch.equal(nan, ref_nan), f"NaN at {int(nan.sum())}, reference {int(ref_nan.sum())}"
        err = compare(out.nan_to_num(0.0), ref.nan_to_num(0.0))
        assert err is None, err


def test_q_extremes():
    """q with one huge and many tiny bf16 values (the power-of-two shift into fp16), and an all-zero q."""
    case = list(_case((12, 24, 2, 128, 128, 64, 300, 3, 40, 512), seed=5, hostile=False))
    q = case[0]
    q[0] *= 1e-30
    q[1, :, 0] = 3.0e4
    q[2] = 0
    q[3, 5, 7] = 2.0**-100
    for splits, warps in ((1, 4), (1, 16), (2, 4)):
        _check(tuple(case), splits=splits, warps=warps)


def test_heads_of_a_group_scaled_apart():
    """q is scaled into fp16 per head: heads of one KV group 2^36 apart each keep their precision, and an inf in
    one head gives NaN in that head only (as the reference), not a flushed q in the others."""
    case = list(_case((12, 24, 2, 128, 128, 64, 300, 3, 40, 512), seed=6, hostile=False))
    q = case[0]
    q[:, 0::2] *= 2.0**18
    q[:, 1::2] *= 2.0**-18
    for splits, warps in ((1, 4), (1, 16), (2, 4)):
        _check(tuple(case), scales=(2.0**14, 1.0, 1.0), splits=splits, warps=warps)
    q = _case((12, 24, 2, 128, 128, 64, 300, 3, 40, 512), seed=6, hostile=False)[0].clone()
    q[0, 2, 3] = float("inf")
    case[0] = q
    ref = reference(*case, 0.1, 1.0, 1.0)
    assert ref[0, 2].isnan().all() and not ref[0, 3].isnan().any()
    for splits, warps in ((1, 4), (1, 16), (2, 4)):
        out = _run(tuple(case), (0.1, 1.0, 1.0), splits, warps=warps)
        assert torch.equal(out.isnan(), ref.isnan())
        err = compare(out.nan_to_num(0.0), ref.nan_to_num(0.0))
        assert err is None, err


@pytest.mark.parametrize("rows", [1, 8, 64, 200, 1600])
def test_dispatch_through_the_op(rows):
    """The automatic choice outside a capture: the CUDA kernel at every row count (fp8); the CUDA provider forced
    serves every row count, out= and functional forms."""
    q, kc, vc, idx, bt, t2r = _case((rows, 24, 2, 128, 128, 64, 2000, 7, 256, 2048), seed=rows)
    kw = dict(softmax_scale=SCALES[0], k_scale=SCALES[1], v_scale=SCALES[2])
    ref = reference(q, kc, vc, idx, bt, t2r, *SCALES)
    assert registry.select("sparse_attention", (q, kc, vc, idx, bt, t2r, *SCALES, None)).backend == "cuda"
    with registry.use_backend("cuda"):
        out = torch.full_like(ref, float("nan"))
        got = dsa_ops.sparse_attention(q, kc, vc, idx, bt, t2r, out=out, **kw)
        assert got is out
        assert compare(out, ref) is None, compare(out, ref)
        fresh = dsa_ops.sparse_attention(q, kc, vc, idx, bt, t2r, **kw)
        assert compare(fresh, ref) is None, compare(fresh, ref)


@pytest.mark.parametrize("compiled", [False, True])
def test_capture_takes_triton_split_once_compiled(monkeypatch, compiled):
    """In a CUDA-graph capture the fewest rows go to Triton's split-K path once its kernels are compiled, to the
    CUDA kernel before (no JIT compile inside a capture); the replay matches the reference either way."""
    from dsa_ops.backends.triton import sparse_attention as sa

    case = _case((4, 24, 2, 128, 128, 64, 1500, 5, 256, 2048), seed=11)
    args = (*case, *SCALES, None)
    kw = dict(softmax_scale=SCALES[0], k_scale=SCALES[1], v_scale=SCALES[2])
    if compiled:
        sa.warmup(24, 2, 128, page_size=64, topk=2048, kv_dtypes=(FP8,))
    else:
        monkeypatch.setattr(sa, "split_compiled", lambda *a: False)
    out = torch.empty((4, 24, 128), dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        dsa_ops.sparse_attention(*case, out=out, **kw)  # eager: the CUDA kernel
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chosen = registry.select("sparse_attention", args).backend
        dsa_ops.sparse_attention(*case, out=out, **kw)
    assert chosen == ("triton" if compiled else "cuda")
    assert registry.select("sparse_attention", args).backend == "cuda"
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert compare(out, reference(*case, *SCALES)) is None, compare(out, reference(*case, *SCALES))


def test_bf16_cache_declined_with_reason():
    q, kc, vc, idx, bt, t2r = _case("verify5")
    kb, vb = kc.to(torch.bfloat16), vc.to(torch.bfloat16)
    why = cu.supports(q, kb, vb, idx, bt, t2r, *SCALES)
    assert why is not None and "fp8" in why


def test_cuda_graph_capture():
    """Capture the split path, the split tail and the persistent grid (400 rows: 800 items past one wave); replays
    follow new inputs written into the captured buffers, twice."""
    for rows in (4, 300, 400):
        case = _case((rows, 24, 2, 128, 128, 64, 1500, 5, 256, 2048), seed=rows)
        q, kc, vc, idx, bt, t2r = case
        out = torch.empty((rows, 24, 128), dtype=torch.bfloat16, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            cu.launch(*case, *SCALES, out)
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            cu.launch(*case, *SCALES, out)
        fresh = _case((rows, 24, 2, 128, 128, 64, 1500, 5, 256, 2048), seed=rows + 1)
        for dst, src in zip(case, fresh):
            dst.copy_(src)
        want = reference(*fresh, *SCALES)
        for _ in range(2):
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert compare(out, want) is None
