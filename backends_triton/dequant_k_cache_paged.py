"""dequant_k_cache_paged in Triton: gather tokens of a paged fp8 MLA cache by slot, dequantise to bf16.

Contract: ``dsa_ops.ops.dequant_k_cache_paged`` (its ``dequant_slots`` is the spec). One flat 1-D grid;
each program takes TOKENS consecutive slots and handles a token as one [groups, group width] tile:
v32 [4, 128] (one fp32 scale a group of 128, rope stored apart), v4 [8, 64] (seven ue8m0 groups of 64
and the 64 bf16 rope values as group 7, so a v4 row leaves in one store).

- Addresses: page = slot // P and offset = slot % P in int32 (slots are int32 and checked >= 0), the
  page's byte address page * page_stride in int64 (it passes 2**31 for caches over 2 GiB). The page
  stride is the cache's stride(0), never derived from P.
- Invalid slots (< 0 or >= num_blocks * P) and the tail past n are masked before any address is used:
  nothing of theirs is loaded, their rows are written as zeros (+0.0).
- Wide loads: when the cache base and the page stride are multiples of 16 bytes (ALIGNED), every
  token's fields start on 16-byte boundaries (656 = 41 * 16, 576 = 36 * 16) and the offsets carry that
  divisibility, so the fp8 bytes, the v32 fp32 scales and the bf16 rope values load as 16-byte vectors
  and the v4 scale bytes as one 8-byte vector. Otherwise every field is read byte by byte and the fp32
  scales and bf16 rope values are assembled from their bytes (no misaligned typed access).
- Arithmetic: ``bf16(f32(x) * scale)`` with one fp32 multiply and a round-to-nearest-even conversion,
  exactly the reference's. e4m3 -> fp32 is exact (subnormals included). ue8m0 e -> 2^(e - 127) is built
  from bits: e << 23, and e = 0 the subnormal 2^-127 (bits 1 << 22), e = 255 +inf, as the reference
  (exp2 would flush 2^-127 to zero). The rope values are copied as 16-bit integers, bit for bit.
- NaN: torch's fp32 -> bf16 conversion, which the reference ends with, writes one NaN pattern per
  device whatever the input NaN (an e4m3 0x7f / 0xff code, a NaN fp32 scale, 0 * inf): 0x7FFF on CUDA
  (cvt.rn.bf16.f32), 0xFFFF on the CPU (ATen's vectorised conversion, what the interpreter tests compare
  with), 0x7FC0 on ROCm (c10's scalar conversion; not checked on a ROCm device). The kernel writes the
  pattern of the device it runs on (NAN_BITS).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ._launch import cdiv, unit_last_stride

LAYOUTS = {"v32": (656, 576), "v4": (584, 512)}  # bytes a token, output width
# (TOKENS, num_warps) per layout, from the H200 sweep (benchmarks/results/h200.json, dequant_k_cache_paged rows:
# 262144 distinct random slots over 8192 pages of 64, cold L2, device copy 4254 GB/s in the same run):
# v32 8 x 4 warps 128.6 us = 86.7% of the copy rate (4 x 4: 135.6; 1 x 4: 227.2; 1 x 2: 164.8);
# v4 2 x 2 warps 114.4 us = 86.6% (4 x 2: 115.1; 4 x 4: 115.8; 1 x 2: 162.7), vLLM's slot kernel 592.0.
# A token's fp8 bytes are 32 (v32) or 28 (v4) 16-byte vectors: 8 warps at 1-4 tokens leave most threads
# without one (v32 4 x 8: 168.0 us).
CONFIGS = {"v32": (8, 4), "v4": (2, 2)}
# Streaming cache hints: loads of the cache evict_first, row stores .cs (neither is re-read by this
# kernel). Off: within the sweep's noise (v4 4 x 4: 115.6 us with, 115.8 without; v32 8 x 4: 132.5, 128.6).
STREAM = False
# Sweeps and tests only: {"tokens": int, "num_warps": int, "stream": bool} replaces the above when set.
CONFIG_OVERRIDE: Optional[dict] = None


def nan_bits(device: torch.device) -> int:
    """The bf16 NaN pattern (as a signed 16-bit int) torch's fp32 -> bf16 conversion writes on `device`."""
    if device.type == "cuda":
        return 0x7FC0 if torch.version.hip else 0x7FFF
    return -1  # 0xFFFF


@triton.jit
def _rope_bits(cache_ptr, off, mask, j, ALIGNED: tl.constexpr):
    """int16 bits of the bf16 rope value j of each token, whose rope part starts at byte `off`."""
    if ALIGNED:
        p = (cache_ptr + off).to(tl.pointer_type(tl.int16))
        return tl.load(p + j, mask=mask, other=0)
    lo = tl.load(cache_ptr + off + 2 * j, mask=mask, other=0).to(tl.int16)
    hi = tl.load(cache_ptr + off + 2 * j + 1, mask=mask, other=0).to(tl.int16)
    return lo | (hi << 8)


@triton.jit
def _finish(y, NAN_BITS: tl.constexpr):
    """int16 bits of bf16(y), NaN written as NAN_BITS."""
    bits = y.to(tl.bfloat16).to(tl.int16, bitcast=True)
    return tl.where(y != y, NAN_BITS, bits).to(tl.int16)


@triton.jit(do_not_specialize=["n", "nslots"])
def dequant_k_cache_paged_kernel(
    cache_ptr,  # uint8; page p starts at byte p * page_stride, the inside of a page is contiguous
    slots_ptr,  # int32 [n]
    out_ptr,  # bf16 [n, 576 (v32) or 512 (v4)], contiguous
    n,
    nslots,  # num_blocks * P
    page_stride,  # bytes
    P: tl.constexpr,
    V4: tl.constexpr,  # layout "v4" (else "v32")
    TOKENS: tl.constexpr,
    ALIGNED: tl.constexpr,  # cache base and page stride are multiples of 16 bytes
    NAN_BITS: tl.constexpr,
    EVICT: tl.constexpr,  # eviction policy of the cache loads ("" or "evict_first")
    STORE_CM: tl.constexpr,  # cache modifier of the row stores ("" or ".cs": streaming)
):
    t = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    live = t < n
    slot = tl.load(slots_ptr + t, mask=live, other=-1)
    ok = live & (slot >= 0) & (slot.to(tl.int64) < nslots)
    s = tl.where(ok, slot, 0)
    page = s // P
    base = page.to(tl.int64) * page_stride
    if ALIGNED:
        base = tl.multiple_of(base, 16)
    ok3 = ok[:, None, None]
    if V4:
        G: tl.constexpr = 8
        W: tl.constexpr = 64
        tok = base + (s - page * P) * 576
        sc = base + P * 576 + (s - page * P) * 8
        if ALIGNED:
            tok = tl.multiple_of(tok, 16)
            sc = tl.multiple_of(sc, 8)
        g = tl.arange(0, G)[None, :, None]
        j = tl.arange(0, W)[None, None, :]
        # The 8 scale bytes of each token (the pad byte's "scale" only meets group 7, the rope values).
        e = tl.load(cache_ptr + sc[:, None] + tl.arange(0, G)[None, :], mask=ok[:, None], other=127)
        e = e.to(tl.int32)
        scale = tl.where(e == 0, 1 << 22, e << 23).to(tl.float32, bitcast=True)
        x = tl.load(cache_ptr + tok[:, None, None] + g * W + j, mask=ok3 & (g < 7), other=0, eviction_policy=EVICT)
        y = x.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale[:, :, None]
        bits = _finish(y, NAN_BITS)
        rope = _rope_bits(cache_ptr, tok[:, None, None] + 448, ok3 & (g == 7), j, ALIGNED)
        bits = tl.where(g == 7, rope, bits)
        row = out_ptr + t[:, None, None] * 512
        tl.store(row + g * W + j, bits.to(tl.bfloat16, bitcast=True), mask=live[:, None, None], cache_modifier=STORE_CM)
    else:
        G: tl.constexpr = 4
        W: tl.constexpr = 128
        tok = base + (s - page * P) * 656
        if ALIGNED:
            tok = tl.multiple_of(tok, 16)
        g = tl.arange(0, G)[None, :, None]
        j = tl.arange(0, W)[None, None, :]
        x = tl.load(cache_ptr + tok[:, None, None] + g * W + j, mask=ok3, other=0, eviction_policy=EVICT)
        gs = tl.arange(0, G)[None, :]
        if ALIGNED:
            sp = (cache_ptr + tok + 512).to(tl.pointer_type(tl.float32))
            scale = tl.load(sp[:, None] + gs, mask=ok[:, None], other=0.0)
        else:
            sb = cache_ptr + tok[:, None] + 512 + 4 * gs
            w = tl.load(sb, mask=ok[:, None], other=0).to(tl.int32)
            w = w | (tl.load(sb + 1, mask=ok[:, None], other=0).to(tl.int32) << 8)
            w = w | (tl.load(sb + 2, mask=ok[:, None], other=0).to(tl.int32) << 16)
            w = w | (tl.load(sb + 3, mask=ok[:, None], other=0).to(tl.int32) << 24)
            scale = w.to(tl.float32, bitcast=True)
        y = x.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale[:, :, None]
        bits = _finish(y, NAN_BITS)
        row = out_ptr + t[:, None, None] * 576
        tl.store(row + g * W + j, bits.to(tl.bfloat16, bitcast=True), mask=live[:, None, None], cache_modifier=STORE_CM)
        jr = tl.arange(0, 64)[None, :]
        rope = _rope_bits(cache_ptr, tok[:, None] + 528, ok[:, None], jr, ALIGNED)
        tl.store(out_ptr + t[:, None] * 576 + 512 + jr, rope.to(tl.bfloat16, bitcast=True), mask=live[:, None],
                 cache_modifier=STORE_CM)


def config(layout: str) -> tuple:
    """(TOKENS, num_warps, stream) the launcher uses for `layout`."""
    o = CONFIG_OVERRIDE or {}
    tokens, warps = CONFIGS[layout]
    return int(o.get("tokens", tokens)), int(o.get("num_warps", warps)), bool(o.get("stream", STREAM))


def launch(kv_cache, slots, layout, *, out: Optional[torch.Tensor] = None, wrap=None) -> torch.Tensor:
    """Kernel form of dsa::dequant_k_cache_paged (arguments validated by the op): returns out.

    `out` (bf16 [n, width], contiguous) is written in place when given (tests poison it first); a fresh
    tensor otherwise. `wrap` is torch.library.wrap_triton inside the triton_op; the provider calls this
    directly to keep the dispatcher off the per-call path."""
    bpt, width = LAYOUTS[layout]
    slots = unit_last_stride(slots)
    n = slots.shape[0]
    nb, p = kv_cache.shape[0], kv_cache.shape[1]
    if out is None:
        out = torch.empty((n, width), dtype=torch.bfloat16, device=kv_cache.device)
    elif out.shape != (n, width) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"`out` must be contiguous bf16 [{n}, {width}], got {out.dtype} {list(out.shape)} "
                         f"strides {out.stride()}")
    if n == 0:
        return out
    if nb == 0 or p == 0:  # every slot is past the cache
        return out.zero_()
    # One page: page * stride is 0 whatever stride(0) says.
    page_stride = kv_cache.stride(0) if nb > 1 else 0
    aligned = kv_cache.data_ptr() % 16 == 0 and page_stride % 16 == 0
    tokens, warps, stream = config(layout)
    kernel = dequant_k_cache_paged_kernel if wrap is None else wrap(dequant_k_cache_paged_kernel)
    kernel[(cdiv(n, tokens),)](
        kv_cache, slots, out, n, nb * p, page_stride,
        P=p, V4=layout == "v4", TOKENS=tokens, ALIGNED=aligned, NAN_BITS=nan_bits(kv_cache.device),
        EVICT="evict_first" if stream else "", STORE_CM=".cs" if stream else "",
        num_warps=warps, num_stages=1,
    )
    return out


@torch.library.triton_op("dsa_triton::dequant_k_cache_paged", mutates_args=())
def dequant_k_cache_paged(kv_cache: torch.Tensor, slots: torch.Tensor, layout: str) -> torch.Tensor:
    return launch(kv_cache, slots, layout, wrap=torch.library.wrap_triton)


def supports(kv_cache, slots, layout) -> Optional[str]:
    # The op has validated dtypes, shapes and the page layout; every such call is served (any alignment,
    # any page stride, any number of slots below 2**31) unless a page spans 2**31 bytes: a token's offset
    # inside its page is int32.
    if kv_cache.shape[1] * kv_cache.shape[3] >= 2**31:
        return f"pages of {kv_cache.shape[1]} tokens: 2**31 bytes or more (an int32 offset inside the page)"
    return None


# For the compile gates (ops_core/gates.py): what the launcher launches for pages of 64 on caches
# torch allocates (16-byte aligned base, page stride 64 x 656 or 64 x 584 bytes: multiples of 16),
# and the byte-by-byte form for caches that are not.
_SIG = {
    "cache_ptr": "*u8", "slots_ptr": "*i32", "out_ptr": "*bf16", "n": "i32", "nslots": "i32",
    "page_stride": "i32", "P": "constexpr", "V4": "constexpr", "TOKENS": "constexpr", "ALIGNED": "constexpr",
    "NAN_BITS": "constexpr", "EVICT": "constexpr", "STORE_CM": "constexpr",
}


def _gate(layout, aligned, nan):
    tokens, warps = CONFIGS[layout]
    name = f"dequant_k_cache_paged_{layout}" + ("" if aligned else "_unaligned")
    return (name, dequant_k_cache_paged_kernel, _SIG,
            {"P": 64, "V4": layout == "v4", "TOKENS": tokens, "ALIGNED": aligned, "NAN_BITS": nan,
             "EVICT": "evict_first" if STREAM else "", "STORE_CM": ".cs" if STREAM else ""},
            ["page_stride"] if aligned else [], {"num_warps": warps, "num_stages": 1})


GATE_KERNELS = [
    _gate("v32", True, 0x7FFF),
    _gate("v4", True, 0x7FFF),
    _gate("v32", False, 0x7FFF),
    _gate("v4", False, 0x7FFF),
]
