"""GPU tests of the Triton dequant_k_cache_paged provider, bitwise against the reference run on the GPU tensors.

Adversarial caches of random bytes (tests/dequant_cases.py: e4m3 NaN codes, subnormals, NaN / inf /
subnormal fp32 scales, every ue8m0 byte, NaN rope payloads) at serving sizes: 262144 slots over 8192
pages of 64, packed, padded and misaligned pages, TOKENS 1 to 16, with and without streaming hints; a
v4 cache past 2**31 bytes (64-bit page addresses); slots -1, INT_MIN, INT_MAX, the slot count and past
it; the op's routing and CUDA-graph capture. Outputs are NaN-poisoned before every call.
"""

from __future__ import annotations

import pytest
import torch
from dequant_cases import bit_mismatch, make_cache, make_slots, poisoned_out

pytestmark = pytest.mark.gpu

DEV = "cuda"
N = 262144


@pytest.fixture(scope="module")
def m():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from dsa_ops.backends.triton import dequant_k_cache_paged

    return dequant_k_cache_paged


def _check(m, cache, slots, layout, tokens=None, warps=None, stream=None):
    from dsa_ops.ops.dequant_k_cache_paged import dequant_slots

    o = {}
    if tokens is not None:
        o["tokens"] = tokens
    if warps is not None:
        o["num_warps"] = warps
    if stream is not None:
        o["stream"] = stream
    m.CONFIG_OVERRIDE = o or None
    try:
        out = poisoned_out(slots.shape[0], layout, DEV)
        m.launch(cache, slots, layout, out=out)
    finally:
        m.CONFIG_OVERRIDE = None
    ref = dequant_slots(cache, slots, layout)
    assert not bit_mismatch(out, ref), bit_mismatch(out, ref)


@pytest.mark.parametrize("layout", ["v32", "v4"])
@pytest.mark.parametrize("pad,offset", [(0, 0), (4096, 0), (48, 16), (3, 5)])
def test_serving_size(m, layout, pad, offset):
    cache = make_cache(layout, 8192, 64, pad=pad, offset=offset, seed=pad + 1, device=DEV)
    _check(m, cache, make_slots(8192, 64, N, seed=pad, device=DEV), layout)


@pytest.mark.parametrize("layout", ["v32", "v4"])
@pytest.mark.parametrize("tokens,warps,stream", [(1, 4, False), (2, 4, False), (8, 4, False), (16, 8, False),
                                                  (4, 2, False), (4, 4, True), (8, 8, True)])
def test_configs(m, layout, tokens, warps, stream):
    cache = make_cache(layout, 2048, 64, seed=3, device=DEV)
    _check(m, cache, make_slots(2048, 64, N + 7, seed=tokens, device=DEV), layout, tokens, warps, stream)


def test_reference_nan_pattern(m):
    """The NaN pattern the kernel writes on this device is the one torch's conversion gives here."""
    got = torch.tensor([float("nan"), -float("nan")], device=DEV).to(torch.bfloat16).view(torch.int16)
    assert got.tolist() == [m.nan_bits(torch.device(DEV))] * 2, [hex(v & 0xFFFF) for v in got.tolist()]


def test_every_token_every_scale(m):
    """Every token of the cache once, in random order: every ue8m0 byte and every edge token."""
    for layout in ("v32", "v4"):
        cache = make_cache(layout, 512, 64, seed=11, device=DEV)
        slots = torch.randperm(512 * 64, device=DEV).to(torch.int32)
        _check(m, cache, slots, layout)


def test_cache_past_2gib(m):
    """A v4 cache of 60000 pages of 64 (2.24 GB): pages past 2**31 bytes need 64-bit addresses."""
    nb = 60000
    cache = make_cache("v4", nb, 64, seed=12, device=DEV)
    assert nb * cache.stride(0) > 2**31
    slots = make_slots(nb, 64, N, seed=12, device=DEV)
    high = torch.randint(57500 * 64, nb * 64, (N // 2,), device=DEV, dtype=torch.int32)
    slots[N // 2:] = high  # half of them in the pages past 2**31 bytes
    _check(m, cache, slots, "v4")
    del cache
    torch.cuda.empty_cache()


def test_op_routes_to_triton_and_captures(m):
    import dsa_ops
    from dsa_ops import registry
    from dsa_ops.ops.dequant_k_cache_paged import dequant_slots

    for layout in ("v32", "v4"):
        cache = make_cache(layout, 256, 64, seed=13, device=DEV)
        slots = make_slots(256, 64, 4099, seed=13, device=DEV)
        ref = dequant_slots(cache, slots, layout)
        assert registry.select("dequant_k_cache_paged", (cache, slots, layout)).backend == "triton"
        out = dsa_ops.dequant_k_cache_paged(cache, slots, layout=layout)
        assert not bit_mismatch(out, ref), bit_mismatch(out, ref)
        static = poisoned_out(slots.shape[0], layout, DEV)
        m.launch(cache, slots, layout, out=static)  # compile outside the capture
        static.fill_(float("nan"))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            m.launch(cache, slots, layout, out=static)
        g.replay()
        torch.cuda.synchronize()
        assert not bit_mismatch(static, ref), bit_mismatch(static, ref)
