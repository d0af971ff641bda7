"""GPU tests of the sparse_mla_decode providers (triton and cuda) against a float64 oracle on the dequantised rows.

Every case runs for both providers (the `m` fixture: each provider module's `launch`, and the op forced to
that backend through the registry's `use_backend`), and once more for the CUDA kernel variant the op does not
pick on SM90 (`cuda_v0`: `launch(..., variant=0)`, sm90_sparse_mla_decode.cuh; the op and `cuda` pick variant 3,
the three-role kernel, by providers_sparse_mla_decode.variant_for). Caches are NaN-filled except the slots in use
(tests/sparse_mla_decode_cases.py), so a read of an unused slot, of a page's padding or of a position past
topk_lens shows as NaN. Invalid indices: -1, INT_MIN, INT_MAX, the slot count and past it; rows with no
valid token; 64 and 128 heads; both layouts; both paths (single pass, split-KV forced, and the heuristic);
attn_sink; batch 1 to 256; the kernels' dequant bit for bit on every finite e4m3 code, subnormal to near-overflow
scales (rows of one token, weight 1). Outputs are poisoned (NaN) before each call. Tolerances: compare() in the cases
module (bf16 out 1e-3 absolute or 2/128 relative or the bf16-probability bound, 1 - cosine below 1e-5 a
row, lse 1e-5 relative).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from sparse_mla_decode_cases import code_sweep_mismatch, compare, make_case, make_code_sweep, oracle

pytestmark = pytest.mark.gpu

DEV = "cuda"
SCALE = {"v32": 576**-0.5, "v4": 512**-0.5}
PROVIDERS = ("triton", "cuda", "cuda_v0")  # cuda_vN: the CUDA provider's kernel variant N


def _module(name):
    if name == "triton":
        from dsa_ops.backends.triton import sparse_mla_decode

        return sparse_mla_decode
    from dsa_ops.backends.cuda import providers_sparse_mla_decode

    return providers_sparse_mla_decode


def _provider(name):
    """The provider `name` as (name, launch, supports); skips where it cannot run. "cuda_v0" is the cuda provider
    with its launch bound to variant 0 (PROVIDER stays "cuda": registry routing is the provider's)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    if name in ("cuda", "cuda_v0"):
        from dsa_ops.backends import cuda

        why = cuda.available(torch.device(DEV)) or cuda.sm90_only(torch.zeros(1, device=DEV), "CUDA sparse MLA decode")
        if why is not None:
            pytest.skip(f"cuda provider unavailable here: {why}")
    mod = _module(name)
    if name == "cuda_v0":
        return SimpleNamespace(PROVIDER="cuda", launch=functools.partial(mod.launch, variant=int(name[-1])),
                               supports=mod.supports, module=mod, forced_variant=True)
    return SimpleNamespace(PROVIDER=name, launch=mod.launch, supports=mod.supports, module=mod, forced_variant=False)


@pytest.fixture(scope="module", params=PROVIDERS)
def m(request):
    return _provider(request.param)


@pytest.fixture(scope="module", params=("cuda", "cuda_v0"))
def mc(request):
    return _provider(request.param)


def _run(m, case, layout, split=None):
    q, cache, idx, lens, sink = case
    b, s_q, h, _ = q.shape
    out = torch.full((b, s_q, h, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    lse = torch.full((b, h, s_q), float("nan"), dtype=torch.float32, device=DEV)
    m.launch(q, cache, idx, SCALE[layout], layout, lens, sink, split=split, out=out, lse=lse)
    torch.cuda.synchronize()
    return out, lse


def _check(out, lse, case, layout):
    q, cache, idx, lens, sink = case
    err = compare(out, lse, *oracle(q, cache, idx, SCALE[layout], layout, lens, sink))
    assert err is None, err


@pytest.mark.parametrize("split", [False, True, None], ids=["single", "split", "heuristic"])
@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_matches_oracle(m, layout, heads, split):
    # request 0 full, 1 cut at 1000 (its tail points at NaN slots), 2 length 0, 3 past top-k
    case = make_case(layout, 4, 2, heads, 2048, page=64, num_blocks=96, lens=[2048, 1000, 0, 4096],
                     seed=heads + (split is True), device=DEV)
    out, lse = _run(m, case, layout, split)
    _check(out, lse, case, layout)


@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_dequant_bitwise_on_every_code(m, layout):
    # Each row attends to one token with weight 1, so its output is that token's V as the kernel dequantised it:
    # every finite e4m3 code under scales from the subnormal to near bf16 overflow, equal bit for bit to the
    # reference's bf16(f32(x) * scale) (and the bf16 rope columns of v4 copied).
    q, cache, idx = make_code_sweep(layout, device=DEV)
    out, lse = _run(m, (q, cache, idx, None, None), layout, split=False)
    err = code_sweep_mismatch(out, lse, cache, layout)
    assert err is None, err


@pytest.mark.parametrize("split", [False, True], ids=["single", "split"])
@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_rows_without_a_token(m, layout, split):
    q, cache, idx, lens, sink = make_case(layout, 3, 2, 64, 512, page=64, num_blocks=16, lens=[512, 512, 0],
                                          seed=3, device=DEV)
    idx[0, 1] = -1
    idx[1, 0] = torch.tensor([-1, -(2**31), 2**31 - 1, 16 * 64], dtype=torch.int32, device=DEV).repeat(128)
    case = (q, cache, idx, lens, sink)
    out, lse = _run(m, case, layout, split)
    _check(out, lse, case, layout)
    assert torch.all(out[0, 1] == 0) and torch.all(out[1, 0] == 0) and torch.all(out[2] == 0)
    assert torch.all(lse[0, :, 1] == float("inf")) and torch.all(lse[2] == float("inf"))


@pytest.mark.parametrize("split", [False, True], ids=["single", "split"])
@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_tokenless_rows_ignore_nonfinite_sink(m, layout, split):
    q, cache, idx, lens, _ = make_case(layout, 2, 1, 64, 128, page=64, num_blocks=4, seed=9, device=DEV)
    idx.fill_(-1)
    sink = torch.tensor([float("nan"), float("inf"), float("-inf"), 3.0] * 16, device=DEV)
    out, lse = _run(m, (q, cache, idx, lens, sink), layout, split)
    assert torch.all(out == 0) and torch.all(lse == float("inf"))


@pytest.mark.parametrize("split", [False, True], ids=["single", "split"])
@pytest.mark.parametrize("page", [48, 2, 98])
@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_odd_tiles_and_pages(m, layout, page, split):
    """Requests of 7, 2 and 1 tiles (top-k 448, topk_lens 448 / 65 / 1: variant 3 works in pairs of tiles and
    pads an odd count with an all-invalid one) on pages of 48, 2 and 98 slots (48 and 98: the slot -> page
    division by a non-power of two, which variant 3 makes a multiply-shift)."""
    case = make_case(layout, 3, 2, 128, 448, page=page, num_blocks=2304 // page + 1, lens=[448, 65, 1],
                     seed=11 + page, device=DEV)
    out, lse = _run(m, case, layout, split)
    _check(out, lse, case, layout)


@pytest.mark.parametrize("split", [False, True], ids=["single", "split"])
@pytest.mark.parametrize("q_scale", [8.0, 32.0])
@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_wide_scores_and_late_valid_tiles(m, layout, q_scale, split):
    """Scores spread over tens to hundreds in log2 units (q scaled by 8 and 32), so a row's running max keeps
    growing past the first tile by more than variant 3's lazy-rescale slack (2^8: O and l rescaled in some tiles,
    not in others, alpha strictly between 0 and 1); and request 1's first 320 positions invalid (its first tiles
    hold no valid token, the running max starts later)."""
    q, cache, idx, lens, sink = make_case(layout, 2, 2, 128, 1024, page=64, num_blocks=40, lens=[1024, 1024],
                                          seed=int(q_scale), device=DEV, q_scale=q_scale)
    idx[1, :, :320] = -1
    case = (q, cache, idx, lens, sink)
    out, lse = _run(m, case, layout, split)
    _check(out, lse, case, layout)


@pytest.mark.parametrize("batch,s_q,heads", [(1, 1, 128), (1, 2, 64), (4, 1, 64), (32, 2, 128), (256, 1, 64)])
def test_batches(m, batch, s_q, heads):
    layout = "v32"
    case = make_case(layout, batch, s_q, heads, 2048, page=64, num_blocks=256, seed=batch, sink=batch % 2 == 0,
                     invalid_every=7, device=DEV)
    out, lse = _run(m, case, layout)
    _check(out, lse, case, layout)


@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_padded_pages(m, layout):
    case = make_case(layout, 2, 1, 128, 1024, page=64, num_blocks=40, lens=[1024, 700], pad=64, seed=9, device=DEV)
    assert case[1].stride(0) == 64 * {"v32": 656, "v4": 584}[layout] + 64
    for split in (False, True):
        out, lse = _run(m, case, layout, split)
        _check(out, lse, case, layout)


@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_op_routes_to_provider_and_captures(m, layout):
    import dsa_ops
    from dsa_ops import registry

    q, cache, idx, lens, sink = case = make_case(layout, 2, 1, 64, 2048, page=64, num_blocks=64, lens=[2048, 1500],
                                                  seed=11, device=DEV)
    args = (q, cache, idx, SCALE[layout], layout, lens, sink)
    with registry.use_backend(m.PROVIDER):
        assert registry.select_on("sparse_mla_decode", q.device, args).backend == m.PROVIDER
        out, lse = dsa_ops.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE[layout], layout=layout,
                                             topk_lens=lens, attn_sink=sink)
        _check(out, lse, case, layout)
        out2, lse2 = m.launch(*args)
        if not m.forced_variant:  # the op and the provider's launch make the same choice
            assert torch.equal(out, out2) and torch.equal(lse, lse2)
        else:  # the op picks variant 3; variant 0 sums differently: the oracle's tolerance
            _check(out2, lse2, case, layout)
        # CUDA-graph capture and replay of the op (split path: its workspace comes from the graph's pool)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            dsa_ops.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE[layout], layout=layout, topk_lens=lens,
                                      attn_sink=sink)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            go, gl = dsa_ops.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE[layout], layout=layout,
                                               topk_lens=lens, attn_sink=sink)
        go.fill_(float("nan"))
        gl.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(go, out) and torch.equal(gl, lse)


def test_auto_order_prefers_cuda_on_sm90():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    import dsa_ops  # noqa: F401  (registers every backend)
    from dsa_ops import registry
    from dsa_ops.backends import cuda

    q, cache, idx, lens, sink = make_case("v32", 1, 1, 128, 256, page=64, num_blocks=8, seed=2, device=DEV)
    args = (q, cache, idx, SCALE["v32"], "v32", lens, sink)
    want = "cuda" if cuda.available(q.device) is None and cuda.sm90_only(q, "x") is None else "triton"
    assert registry.select_on("sparse_mla_decode", q.device, args).backend == want


def test_supports_declines_misaligned_cache(m):
    raw = torch.zeros(2 * 64 * 656 + 2, dtype=torch.uint8, device=DEV)
    cache = raw[2:].view(2, 64, 1, 656)
    q = torch.zeros(1, 1, 64, 576, dtype=torch.bfloat16, device=DEV)
    idx = torch.zeros(1, 1, 16, dtype=torch.int32, device=DEV)
    want = "multiples of 4" if m.PROVIDER == "triton" else "multiples of 16"
    assert want in m.supports(q, cache, idx, 1.0, "v32", None, None)


def test_cuda_supports_declines_head_counts():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from dsa_ops.backends.cuda import providers_sparse_mla_decode as pm

    cache = torch.zeros(2, 64, 1, 656, dtype=torch.uint8, device=DEV)
    idx = torch.zeros(1, 1, 16, dtype=torch.int32, device=DEV)
    for h in (16, 96):
        q = torch.zeros(1, 1, h, 576, dtype=torch.bfloat16, device=DEV)
        assert "multiple of 64" in pm.unsupported_shape(q, cache, idx, "v32", None)
    q = torch.zeros(1, 1, 128, 576, dtype=torch.bfloat16, device=DEV)
    assert pm.unsupported_shape(q, cache, idx, "v32", None) is None


@pytest.mark.parametrize("splits", [3, 7, 32])
@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_cuda_split_counts(mc, layout, splits):
    """Uneven and empty splits (request 1 ends inside a split, request 2 has no token): the combine skips
    splits without a token."""
    q, cache, idx, lens, sink = case = make_case(layout, 3, 2, 128, 2048, page=64, num_blocks=96,
                                                  lens=[2048, 700, 0], seed=splits, device=DEV)
    b, s_q, h, _ = q.shape
    out = torch.full((b, s_q, h, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    lse = torch.full((b, h, s_q), float("nan"), dtype=torch.float32, device=DEV)
    mc.launch(q, cache, idx, SCALE[layout], layout, lens, sink, splits=splits, out=out, lse=lse)
    torch.cuda.synchronize()
    _check(out, lse, case, layout)


def test_providers_agree(mc):
    """Both providers on one case: within the tolerance of each other (not bitwise: their tiles differ)."""
    case = make_case("v32", 2, 2, 128, 2048, page=64, num_blocks=96, seed=21, device=DEV)
    o1, l1 = _run(mc, case, "v32")
    o2, l2 = _run(_provider("triton"), case, "v32")
    assert (o1.float() - o2.float()).abs().max().item() < 2e-2
    assert ((l1 - l2).abs() / l2.abs().clamp(min=1)).max().item() < 1e-5


def test_unknown_variant_rejected():
    """Only variants 0 and 3 exist (4, the CTA pairs, is removed): the binding names them."""
    m = _provider("cuda")
    q, cache, idx, lens, sink = make_case("v32", 1, 1, 128, 128, page=64, num_blocks=4, seed=1, device=DEV)
    for variant in (1, 4):
        with pytest.raises(RuntimeError, match="must be 0 or 3"):
            m.launch(q, cache, idx, SCALE["v32"], "v32", lens, sink, variant=variant)
