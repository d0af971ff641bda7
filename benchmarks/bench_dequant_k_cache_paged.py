"""dequant_k_cache_paged: the Triton provider against the memory floor, plain torch and vLLM's V4 kernels.

262144 distinct slots drawn at random from a cache of 8192 pages of 64 (half of its tokens, in random
order), both layouts, realistic values (e4m3 codes of N(0, 1) data, v32 fp32 scales near 1/448, v4
ue8m0 bytes 110-130). CUDA events after an L2 flush, median. The floor is bytes read plus bytes written
(656 + 1152 a token for v32, 584 + 1024 for v4) at the device-copy rate of the same run. Rows: the
launcher's (TOKENS, num_warps, streaming hints) per layout and TOKENS = 1 beside it; with
DSA_DEQUANT_SWEEP=1 every TOKENS in 1, 2, 4, 8, 16 at 2, 4 and 8 warps, and at 4 warps with the
streaming hints (evict_first loads, .cs stores). Baselines: `torch` (the reference, dequant_slots, on the GPU
tensors); for v4, when .peer/dequant_peer.py is present (a measuring stick, never imported by project
code), `vllm` (its one-program-a-slot _dequant_gather_slots_kernel on the same slots) and `vllm_gather`
(its per-request gather through a block table, timed on 4096 whole pages: the same byte count, read
page by page rather than slot by slot). Every timed output is checked bitwise against the reference.

    python -m pytest benchmarks/bench_dequant_k_cache_paged.py -m gpu -s --dsa-results OUT.json
"""

from __future__ import annotations

import functools
import importlib.util
import os

import pytest
import torch
from harness import record

pytestmark = pytest.mark.gpu

PAGES, PAGE, N = 8192, 64, 262144
LAYOUTS = {"v32": (656, 576), "v4": (584, 512)}
SWEEP = [(t, w, False) for t in (1, 2, 4, 8, 16) for w in (2, 4, 8)] + [(t, 4, True) for t in (1, 2, 4, 8, 16)]
_PEER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".peer", "dequant_peer.py")


@functools.lru_cache(maxsize=1)
def _peer():
    """vLLM's dequant kernels from .peer/dequant_peer.py, or None."""
    if not os.path.exists(_PEER):
        return None
    spec = importlib.util.spec_from_file_location("dequant_peer", _PEER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=2)
def _cache(layout: str) -> torch.Tensor:
    """uint8 [PAGES, PAGE, 1, bytes] with realistic values."""
    g = torch.Generator(device="cuda").manual_seed(0)
    bpt = LAYOUTS[layout][0]
    tokens = PAGES * PAGE
    codes = torch.randn((tokens, 512), generator=g, device="cuda").mul_(100).clamp_(-448, 448)
    codes = codes.to(torch.float8_e4m3fn).view(torch.uint8)
    rope = torch.randn((tokens, 64), generator=g, device="cuda").to(torch.bfloat16).view(torch.uint8)
    if layout == "v32":
        sc = (torch.rand((tokens, 4), generator=g, device="cuda") + 0.5) / 448
        tok = torch.cat([codes, sc.view(torch.uint8), rope], dim=1)
        return tok.view(PAGES, PAGE, 1, bpt)
    e = torch.randint(110, 131, (tokens, 8), generator=g, device="cuda", dtype=torch.uint8)
    data = torch.cat([codes[:, :448], rope], dim=1).view(PAGES, PAGE * 576)
    return torch.cat([data, e.view(PAGES, PAGE * 8)], dim=1).view(PAGES, PAGE, 1, bpt)


def _slots() -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(1)
    return torch.randperm(PAGES * PAGE, generator=g, device="cuda")[:N].to(torch.int32)


def _configs(layout, m):
    if os.environ.get("DSA_DEQUANT_SWEEP") == "1":
        return SWEEP
    tokens, warps = m.CONFIGS[layout]
    return [(tokens, warps, m.STREAM)] + ([(1, warps, m.STREAM)] if tokens != 1 else [])


@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_dequant_k_cache_paged(bench, layout):
    from dsa_ops.backends.triton import dequant_k_cache_paged as m
    from dsa_ops.ops.dequant_k_cache_paged import dequant_slots

    cache, slots = _cache(layout), _slots()
    bpt, width = LAYOUTS[layout]
    ref = dequant_slots(cache, slots, layout)
    baselines = {"torch": bench.timer.median_us(lambda: dequant_slots(cache, slots, layout), iters=10)}
    peer = _peer() if layout == "v4" else None
    extra = {}
    if peer is not None:
        out_p = torch.empty((N, width), dtype=torch.bfloat16, device="cuda")
        baselines["vllm"] = bench.timer.median_us(lambda: peer.dequant_gather_slots(out_p, cache, slots, PAGE))
        extra["vllm_bitwise_equal"] = bool(torch.equal(out_p.view(torch.int16), ref.view(torch.int16)))
        g = torch.Generator(device="cuda").manual_seed(2)
        table = torch.randperm(PAGES, generator=g, device="cuda")[:N // PAGE].to(torch.int32)[None]
        lens = torch.tensor([N], dtype=torch.int32, device="cuda")
        out_g = torch.empty((1, N, width), dtype=torch.bfloat16, device="cuda")
        baselines["vllm_gather"] = bench.timer.median_us(lambda: peer.dequantize_and_gather_k_cache_triton(
            out_g, cache, lens, None, table, PAGE, 0, max_gather_len=N))
    nbytes = N * (bpt + 2 * width)
    out = torch.empty((N, width), dtype=torch.bfloat16, device="cuda")
    for tokens, warps, stream in _configs(layout, m):
        m.CONFIG_OVERRIDE = {"tokens": tokens, "num_warps": warps, "stream": stream}
        try:
            fn = lambda: m.launch(cache, slots, layout, out=out)  # noqa: E731
            out.fill_(float("nan"))
            fn()
            equal = bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))
            us = bench.timer.median_us(fn)
        finally:
            m.CONFIG_OVERRIDE = None
        assert equal, (layout, tokens, warps, stream)
        bench.add(record(
            "dequant_k_cache_paged", "triton",
            {"layout": layout, "tokens": N, "pages": PAGES, "page_size": PAGE, "distribution": "distinct random slots",
             "tokens_per_program": tokens, "num_warps": warps, "stream": stream},
            us, floor_us=bench.floor_us(nbytes), floor_kind="memory (cache bytes read + bf16 rows written)",
            baselines=baselines, timing="cuda events, cold L2",
            achieved_gbps=round(nbytes / (us * 1e-6) / 1e9, 1),
            copy_fraction=round(bench.floor_us(nbytes) / us, 3), bitwise_equal=equal, **extra))
