"""sparse_mla_decode in Triton: FlashMLA's sparse decode over a paged fp8 MLA cache, both cache layouts.

Contract: ``dsa_ops.ops.sparse_mla_decode`` (the reference there is the spec). Two paths, one kernel:

- Single pass (``mla_decode_kernel`` with SPLIT=False): one program per (request b, query token i, block
  of BLOCK_H = 64 heads, half of V); 128 heads are four programs. The heads are the MMA M side. A
  program keeps one [64, 256] fp32 accumulator (its 256 output columns): the whole 512-wide one is 256
  registers a thread at 4 warps and spilled in every sm_90a build tried, while the two halves of a token
  run side by side and read its cache bytes once from HBM, the second from L2. The token's selected
  slots are taken in tiles of BLOCK_N; each tile is gathered by slot and dequantised in registers as two
  [BLOCK_N, 256] halves (its own half first), ``bf16(f32(x) * scale)`` exactly as the reference: v32 reads
  e4m3 bytes with one fp32 scale per 128 and, for QK^T only, the 64 bf16 rope values; v4 reads 448 e4m3
  bytes with one ue8m0 scale per 64 and its 64 bf16 rope values as columns 448-511 of the upper half.
  QK^T is two (v4) or three (v32) chained bf16 MMAs with fp32 accumulation; the softmax is an fp32 online
  softmax in base 2 (log2(e) folded into the score scale); PV reuses the program's own dequantised half.
- Split-KV (SPLIT=True plus ``mla_combine_kernel``): when the programs are too few to fill the SMs, the
  top-k axis is cut into splits; each split writes its unnormalised fp32 output, its running max (log2
  domain) and its sum into a workspace sized from the shapes; the combine kernel weights the splits by
  2^(m_s - M), writes out and lse, and applies attn_sink.

Invalid positions (slot < 0, slot >= num_blocks * P, position >= topk_lens[b]) are masked before any
cache address is formed: their loads are predicated off and their scores take the finite sentinel NEG,
their probabilities exactly 0. The running max starts at NEG, so no exp2(-inf - -inf) appears; a row
with no valid token ends with sum 0 and writes out 0 and lse +inf (attn_sink then leaves it 0).
The cache is read as bytes; the fp32 v32 scales and the bf16 rope values are loaded through typed
pointers, so the cache base and page stride must be multiples of 4 bytes (``supports`` declines others).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from ._launch import FirstLaunchLog, cdiv, unit_last_stride

NEG = tl.constexpr(-1.0e30)  # masked-score sentinel (log2 domain); finite, far below any real score
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
INT32_MAX = 2**31 - 1
DV = 512  # output width of both layouts
PIECE = 64  # columns of one K/V piece
LAYOUTS = {"v32": (656, 576), "v4": (584, 512)}  # bytes a token, q head dim

BLOCK_H = 64  # heads a program: the MMA M side (128 heads = two programs)
COMBINE_HEADS = 16  # heads a combine program
# (BLOCK_N, num_warps, num_stages) per layout, both paths. A program's [64, 256] fp32 accumulator is 128
# registers a thread at 4 warps. Triton 3.9 builds (compile gates): 16/4/1 is the largest tile with no
# spill and no stack on sm_90a, sm_100a and gfx950 for both layouts (sm_90a 254-255 registers; 32/4/1
# leaves a 24-40 byte stack frame on sm_90a and spills SGPRs on gfx950; 64/8/2 spills everywhere).
# Shared memory (Triton's figure): v32 88 KiB, v4 80 KiB (Q 72 / 64 KiB + the K tile); gfx950 32 KiB LDS.
CONFIGS = {"v32": (16, 4, 1), "v4": (16, 4, 1)}
# Split-KV when the programs (two a head block) fill less than one wave of PROGRAMS_PER_SM a SM; each split
# keeps at least MIN_SPLIT_TOKENS selected tokens, as a split's partial ([64, 512] fp32, 128 KiB written and
# read back) costs about as much traffic as 200 tokens of v32 cache bytes (656 each). Two programs fit an
# SM (88 KiB of shared memory each) and run side by side at little cost: H200, v32, 64 heads, s_q 1, one
# split: 128 programs (batch 64) 337.2 us, 256 (batch 128) 375.2.
MIN_SPLIT_TOKENS = 256
PROGRAMS_PER_SM = 2
MAX_SPLITS = 64
# Sweeps and tests only: replaces BLOCK_H, the configs or the split count when set.
CONFIG_OVERRIDE: Optional[dict] = None


@triton.jit
def _ue8m0(cache_ptr, sc, ok):
    """2^(e - 127) of the scale byte at `sc` of each token, built from its bits (e = 0: the subnormal 2^-127)."""
    e = tl.load(cache_ptr + sc, mask=ok, other=127).to(tl.int32)
    return tl.where(e == 0, 1 << 22, e << 23).to(tl.float32, bitcast=True)


@triton.jit
def _kv_half(cache_ptr, tok, sc, ok, c0, V4: tl.constexpr):
    """Columns [c0, c0 + 256) of each token's dequantised row, bf16 [BLOCK_N, 256] (masked tokens 0).

    v32: e4m3 bytes tok + c, fp32 scale (c // 128) at tok + 512. v4: e4m3 bytes tok + c for c < 448,
    ue8m0 scale byte (c // 64) at sc, the bf16 rope values from tok + 448 for c >= 448.
    ``bf16(f32(x) * scale)``, as the reference."""
    j = tl.arange(0, 256)
    c = c0 + j
    if V4:
        is_fp8 = c < 448
        x = tl.load(cache_ptr + tok[:, None] + c[None, :], mask=ok[:, None] & is_fp8[None, :], other=0)
        g = sc + c0 // 64
        e0 = _ue8m0(cache_ptr, g, ok)
        e1 = _ue8m0(cache_ptr, g + 1, ok)
        e2 = _ue8m0(cache_ptr, g + 2, ok)
        e3 = _ue8m0(cache_ptr, sc + tl.minimum(c0 // 64 + 3, 6), ok)  # upper half: rope columns, never the pad
        q4 = (j // 64)[None, :]
        scale = tl.where(q4 < 2, tl.where(q4 == 0, e0[:, None], e1[:, None]),
                         tl.where(q4 == 2, e2[:, None], e3[:, None]))
        v = (x.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale).to(tl.bfloat16)
        rope = (cache_ptr + tok + 448).to(tl.pointer_type(tl.bfloat16))
        # Columns >= 448 take the rope values; the others keep v (the load's `other`).
        return tl.load(rope[:, None] + (c - 448)[None, :], mask=ok[:, None] & (c >= 448)[None, :], other=v)
    else:
        x = tl.load(cache_ptr + tok[:, None] + c[None, :], mask=ok[:, None], other=0)
        sp = (cache_ptr + tok + 512 + 4 * (c0 // 128)).to(tl.pointer_type(tl.float32))
        s0 = tl.load(sp, mask=ok, other=0.0)
        s1 = tl.load(sp + 1, mask=ok, other=0.0)
        scale = tl.where((j < 128)[None, :], s0[:, None], s1[:, None])
        return (x.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale).to(tl.bfloat16)


# page_stride stays specialised (Triton's multiple-of-16 flag): without it no token address is known to be
# 16-byte aligned and the sm_90a build gathers the cache with byte loads (triton 3.6 PTX of one v4 program:
# 192 ld.global.b8 + 64 .b16 + 32 .v4 against 16 .b8 + 44 .v4 with it; v32: 64 .b8 + 95 .b32 + 36 .v4
# against 18 .b32 + 41 .v4), as the compile gates always assumed.
@triton.jit(do_not_specialize=["s_q", "topk", "nslots", "tiles_per_split", "qk_scale"])
def mla_decode_kernel(
    q_ptr,  # bf16 [B, s_q, H, D]
    cache_ptr,  # uint8 paged cache; page p starts at byte p * page_stride
    idx_ptr,  # int32 [B, s_q, topk] physical slots
    lens_ptr,  # int32 [B] (read only when HAS_LENS)
    sink_ptr,  # fp32 [H] (read only when HAS_SINK)
    out_ptr,  # bf16 [B, s_q, H, 512] (SPLIT=False)
    lse_ptr,  # fp32 [B, H, s_q] contiguous (SPLIT=False)
    part_ptr,  # fp32 [B * s_q * head blocks * splits, BLOCK_H, 512] unnormalised partial outputs (SPLIT=True)
    ml_ptr,  # fp32 [B * s_q * head blocks * splits, 2, BLOCK_H] running max (log2 domain) and sum (SPLIT=True)
    s_q,
    topk,
    nslots,  # num_blocks * P, at most 2**31 - 1
    page_stride,  # bytes
    stride_qb,
    stride_qs,
    stride_qh,
    stride_qd,
    stride_ib,
    stride_is,
    stride_in,
    stride_ob,
    stride_os,
    stride_oh,
    tiles_per_split,
    qk_scale,  # softmax_scale * log2(e)
    H: tl.constexpr,
    PAGE: tl.constexpr,
    V4: tl.constexpr,  # layout "v4" (else "v32")
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_LENS: tl.constexpr,
    HAS_SINK: tl.constexpr,
):
    HB: tl.constexpr = (H + BLOCK_H - 1) // BLOCK_H
    # (b, i, head block, V half), V half fastest: a token's programs run together and share its K in L2.
    pid = tl.program_id(0)
    half = pid % 2
    prog = pid // 2  # (b, i, head block)
    bi = prog // HB
    h0 = (prog - bi * HB) * BLOCK_H
    b = bi // s_q
    i = bi - b * s_q
    split = tl.program_id(1)
    b64 = b.to(tl.int64)
    i64 = i.to(tl.int64)
    c_own = half * 256  # this program's output columns: its V half; the other half enters QK^T only
    c_other = 256 - c_own

    n_end = topk
    if HAS_LENS:
        n_end = tl.minimum(tl.maximum(tl.load(lens_ptr + b), 0), topk)
    t0 = split * tiles_per_split
    t1 = tl.minimum(t0 + tiles_per_split, tl.cdiv(n_end, BLOCK_N))

    hh = tl.arange(0, BLOCK_H)
    h_ok = h0 + hh < H
    # int64 heads: head x head stride can pass 2^31 (a head-major q).
    qrow = q_ptr + b64 * stride_qb + i64 * stride_qs + (h0 + hh).to(tl.int64)[:, None] * stride_qh
    dq = tl.arange(0, 256)[None, :]
    q_own = tl.load(qrow + (c_own + dq) * stride_qd, mask=h_ok[:, None], other=0.0)  # [BLOCK_H, 256]
    q_other = tl.load(qrow + (c_other + dq) * stride_qd, mask=h_ok[:, None], other=0.0)
    if not V4:
        q_rope = tl.load(qrow + (512 + tl.arange(0, 64)[None, :]) * stride_qd, mask=h_ok[:, None], other=0.0)

    idx_row = idx_ptr + b64 * stride_ib + i64 * stride_is
    nn = tl.arange(0, BLOCK_N)
    m_i = tl.full((BLOCK_H,), NEG, tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, 256), tl.float32)

    for t in tl.range(t0, t1):
        n = t * BLOCK_N + nn
        live = n < n_end
        slot = tl.load(idx_row + n * stride_in, mask=live, other=-1)
        ok = live & (slot >= 0) & (slot < nslots)
        slot = tl.where(ok, slot, 0)  # invalid tokens address slot 0 with every load masked off
        page = slot // PAGE
        pbase = page.to(tl.int64) * page_stride
        off = slot - page * PAGE
        if V4:
            tok = pbase + off * 576
            sc = pbase + PAGE * 576 + off * 8
        else:
            tok = pbase + off * 656
            sc = tok  # unused
        k_own = _kv_half(cache_ptr, tok, sc, ok, c_own, V4)
        k_other = _kv_half(cache_ptr, tok, sc, ok, c_other, V4)
        s = tl.dot(q_own, tl.trans(k_own), out_dtype=tl.float32)  # [BLOCK_H, BLOCK_N]
        s = tl.dot(q_other, tl.trans(k_other), s)
        if not V4:
            rope = (cache_ptr + tok + 528).to(tl.pointer_type(tl.bfloat16))
            k_rope = tl.load(rope[:, None] + tl.arange(0, 64)[None, :], mask=ok[:, None], other=0.0)
            s = tl.dot(q_rope, tl.trans(k_rope), s)
        s = tl.where(ok[None, :], s * qk_scale, NEG)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.where(ok[None, :], tl.math.exp2(s - m_new[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
        acc = tl.dot(p.to(tl.bfloat16), k_own, acc * alpha[:, None])

    first = (hh * 0 + half) == 0  # [BLOCK_H]: lse, m and l are written by the first half only
    dv = tl.arange(0, 256)[None, :]
    if SPLIT:
        pidx = prog.to(tl.int64) * tl.num_programs(1) + split
        tl.store(part_ptr + pidx * (BLOCK_H * 512) + hh[:, None] * 512 + c_own + dv, acc)
        tl.store(ml_ptr + pidx * (2 * BLOCK_H) + hh, m_i, mask=first)
        tl.store(ml_ptr + pidx * (2 * BLOCK_H) + BLOCK_H + hh, l_i, mask=first)
    else:
        valid = l_i > 0
        lse2 = m_i + tl.math.log2(tl.where(valid, l_i, 1.0))  # log2 domain
        inv = tl.where(valid, 1.0 / tl.where(valid, l_i, 1.0), 0.0)
        if HAS_SINK:
            sink = tl.load(sink_ptr + h0 + hh, mask=h_ok, other=0.0)
            # exp(lse) / (exp(lse) + exp(sink)) = 1 / (1 + 2^(sink log2(e) - lse2)); rows without a token stay 0,
            # whatever the sink (NaN included).
            inv = tl.where(valid, inv / (1.0 + tl.math.exp2(sink * 1.4426950408889634 - lse2)), 0.0)
        o = (acc * inv[:, None]).to(tl.bfloat16)
        tl.store(out_ptr + b64 * stride_ob + i64 * stride_os + (h0 + hh)[:, None] * stride_oh + c_own + dv, o,
                 mask=h_ok[:, None])
        lse = tl.where(valid, lse2 * 0.6931471805599453, float("inf"))
        tl.store(lse_ptr + (b64 * H + h0 + hh) * s_q + i64, lse, mask=h_ok & first)


@triton.jit(do_not_specialize=["s_q", "splits"])
def mla_combine_kernel(
    part_ptr,  # fp32 [programs * splits, BLOCK_H, 512]
    ml_ptr,  # fp32 [programs * splits, 2, BLOCK_H]
    sink_ptr,  # fp32 [H] (read only when HAS_SINK)
    out_ptr,  # bf16 [B, s_q, H, 512]
    lse_ptr,  # fp32 [B, H, s_q] contiguous
    s_q,
    splits,
    stride_ob,
    stride_os,
    stride_oh,
    H: tl.constexpr,
    BLOCK_H: tl.constexpr,
    CH: tl.constexpr,  # heads a program
    HAS_SINK: tl.constexpr,
):
    """out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s per head; lse = (M + log2 of the sum) ln 2."""
    HB: tl.constexpr = (H + BLOCK_H - 1) // BLOCK_H
    CB: tl.constexpr = (H + CH - 1) // CH
    pid = tl.program_id(0)  # (b, i, head chunk)
    bi = pid // CB
    hc = (pid - bi * CB) * CH + tl.arange(0, CH)  # absolute heads
    h_ok = hc < H
    hb = hc // BLOCK_H  # head block of the decode program
    hr = hc - hb * BLOCK_H  # row inside it
    b = bi // s_q
    i = bi - b * s_q
    prog = bi.to(tl.int64) * HB + hb  # [CH]

    m = tl.full((CH,), NEG, tl.float32)
    for s in tl.range(0, splits):
        ms = tl.load(ml_ptr + (prog * splits + s) * (2 * BLOCK_H) + hr, mask=h_ok, other=NEG)
        m = tl.maximum(m, ms)
    c = tl.arange(0, 512)
    denom = tl.zeros((CH,), tl.float32)
    acc = tl.zeros((CH, 512), tl.float32)
    for s in tl.range(0, splits):
        row = prog * splits + s
        ms = tl.load(ml_ptr + row * (2 * BLOCK_H) + hr, mask=h_ok, other=NEG)
        ls = tl.load(ml_ptr + row * (2 * BLOCK_H) + BLOCK_H + hr, mask=h_ok, other=0.0)
        w = tl.math.exp2(ms - m)
        denom += w * ls
        a = tl.load(part_ptr + row[:, None] * (BLOCK_H * 512) + hr[:, None] * 512 + c[None, :],
                    mask=h_ok[:, None], other=0.0)
        acc += a * w[:, None]
    valid = denom > 0
    lse2 = m + tl.math.log2(tl.where(valid, denom, 1.0))
    inv = tl.where(valid, 1.0 / tl.where(valid, denom, 1.0), 0.0)
    if HAS_SINK:
        sink = tl.load(sink_ptr + hc, mask=h_ok, other=0.0)
        inv = tl.where(valid, inv / (1.0 + tl.math.exp2(sink * 1.4426950408889634 - lse2)), 0.0)
    b64 = b.to(tl.int64)
    i64 = i.to(tl.int64)
    tl.store(out_ptr + b64 * stride_ob + i64 * stride_os + hc[:, None] * stride_oh + c[None, :],
             (acc * inv[:, None]).to(tl.bfloat16), mask=h_ok[:, None])
    lse = tl.where(valid, lse2 * 0.6931471805599453, float("inf"))
    tl.store(lse_ptr + (b64 * H + hc) * s_q + i64, lse, mask=h_ok)


# ------------------------------------------------------------------------------------------------
# host side


@functools.lru_cache(maxsize=None)
def _sm_count(index: Optional[int]) -> int:
    """SMs of CUDA device `index`; 132 when no device answers (it then only sizes the split count)."""
    try:
        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(index if index is not None else 0).multi_processor_count
    except Exception:  # noqa: BLE001  (no device: only the split count is affected)
        pass
    return 132


def _block_h() -> int:
    return int((CONFIG_OVERRIDE or {}).get("block_h", BLOCK_H))


def _config(layout: str) -> tuple:
    return (CONFIG_OVERRIDE or {}).get("config", CONFIGS[layout])


def split_count(batch: int, s_q: int, heads: int, topk: int, sms: int = 132, layout: str = "v32") -> int:
    """Splits of each (b, i, head block)'s top-k axis; 1 is the single pass. A function of shapes only.

    As many splits as leave the programs within one wave of PROGRAMS_PER_SM x `sms`, each split holding at
    least MIN_SPLIT_TOKENS positions, at most MAX_SPLITS."""
    o = CONFIG_OVERRIDE or {}
    programs = 2 * batch * s_q * cdiv(heads, _block_h())  # two V halves a head block
    tiles = max(1, cdiv(topk, _config(layout)[0]))
    if o.get("splits") is not None:
        want = int(o["splits"])
    else:
        want = min(PROGRAMS_PER_SM * sms // max(1, programs), topk // MIN_SPLIT_TOKENS)
    want = max(1, min(want, tiles, MAX_SPLITS))
    per = cdiv(tiles, want)
    return cdiv(tiles, per)  # no empty split


def workspace_bytes(batch: int, s_q: int, heads: int, topk: int, sms: int = 132, layout: str = "v32") -> int:
    """Device workspace one call allocates beyond out and lse (the split-KV partials; 0 on the single pass)."""
    s = split_count(batch, s_q, heads, topk, sms, layout)
    if s == 1:
        return 0
    bh = _block_h()
    return batch * s_q * cdiv(heads, bh) * s * bh * (DV + 2) * 4


_LAUNCHES = FirstLaunchLog("sparse_mla_decode")
_COMPILED = _LAUNCHES.seen  # the specialisations launched so far
_run = _LAUNCHES.run


def launch(q, kv_cache, indices, softmax_scale, layout="v32", topk_lens=None, attn_sink=None, *, wrap=None,
           split: Optional[bool] = None, out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None):
    """Kernel form of dsa::sparse_mla_decode (arguments validated by the op): returns (out, lse).

    `split` forces a path (None: the heuristic of split_count); `wrap` is torch.library.wrap_triton
    inside the triton_op. `out` (bf16 [B, s_q, H, 512], unit last stride) and `lse` (fp32 [B, H, s_q],
    contiguous) are written in place when given (tests poison them first); fresh tensors otherwise."""
    q, indices, topk_lens, attn_sink = (unit_last_stride(x) for x in (q, indices, topk_lens, attn_sink))
    b, s_q, h, _ = q.shape
    topk = indices.shape[2]
    nb, page = kv_cache.shape[0], kv_cache.shape[1]
    if out is None:
        out = torch.empty((b, s_q, h, DV), dtype=torch.bfloat16, device=q.device)
    if lse is None:
        lse = torch.empty((b, h, s_q), dtype=torch.float32, device=q.device)
    if out.shape != (b, s_q, h, DV) or out.dtype != torch.bfloat16 or out.stride(3) != 1:
        raise ValueError(f"`out` must be bf16 [{b}, {s_q}, {h}, {DV}] with unit last stride, got "
                         f"{out.dtype} {list(out.shape)} strides {out.stride()}")
    if lse.shape != (b, h, s_q) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(f"`lse` must be contiguous fp32 [{b}, {h}, {s_q}], got {lse.dtype} {list(lse.shape)}")
    if b * s_q * h == 0:
        return out, lse
    bh = _block_h()
    programs = b * s_q * cdiv(h, bh)
    sms = _sm_count(q.device.index) if q.device.type == "cuda" else 132
    bn, nw, ns = _config(layout)
    splits = split_count(b, s_q, h, topk, sms, layout)
    if split is not None:
        if not split:
            splits = 1
        elif splits == 1:
            splits = min(2, max(1, cdiv(topk, bn)))
    use_split = split if split is not None else splits > 1
    tiles = max(1, cdiv(topk, bn))
    per = cdiv(tiles, splits)
    splits = cdiv(tiles, per)
    if use_split:
        part = torch.empty((programs * splits, bh, DV), dtype=torch.float32, device=q.device)
        ml = torch.empty((programs * splits, 2, bh), dtype=torch.float32, device=q.device)
    else:
        part = ml = lse  # never touched
    lens = topk_lens if topk_lens is not None else indices
    sink = attn_sink if attn_sink is not None else lse
    # Pages of one cache are byte rows stride(0) apart (padded pages are views), the inside contiguous.
    page_stride = kv_cache.stride(0) if nb > 1 else page * LAYOUTS[layout][0]
    nslots = min(nb * page, INT32_MAX)
    v4 = layout == "v4"
    wrap = wrap or (lambda f: f)
    key = ("decode", layout, use_split, h, page, bh, bn, nw, ns, topk_lens is not None, attn_sink is not None)
    _run(wrap(mla_decode_kernel), (2 * programs, splits), key,
         (q, kv_cache, indices, lens, sink, out, lse, part, ml,
          s_q, topk, nslots, page_stride,
          q.stride(0), q.stride(1), q.stride(2), q.stride(3),
          indices.stride(0), indices.stride(1), indices.stride(2),
          out.stride(0), out.stride(1), out.stride(2),
          per, float(softmax_scale) * LOG2E),
         dict(H=h, PAGE=page, V4=v4, BLOCK_H=bh, BLOCK_N=bn, SPLIT=use_split, HAS_LENS=topk_lens is not None,
              HAS_SINK=attn_sink is not None, num_warps=nw, num_stages=ns))
    if use_split:
        _run(wrap(mla_combine_kernel), (b * s_q * cdiv(h, COMBINE_HEADS),), ("combine", h, bh,
                                                                                   attn_sink is not None),
             (part, ml, sink, out, lse, s_q, splits, out.stride(0), out.stride(1), out.stride(2)),
             dict(H=h, BLOCK_H=bh, CH=COMBINE_HEADS, HAS_SINK=attn_sink is not None, num_warps=4, num_stages=1))
    return out, lse


@torch.library.triton_op("dsa_triton::sparse_mla_decode", mutates_args=())
def sparse_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    layout: str,
    topk_lens: Optional[torch.Tensor],
    attn_sink: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(q, kv_cache, indices, softmax_scale, layout, topk_lens, attn_sink, wrap=torch.library.wrap_triton)


def supports(q, kv_cache, indices, softmax_scale, layout="v32", topk_lens=None, attn_sink=None) -> Optional[str]:
    if kv_cache.data_ptr() % 4 or (kv_cache.shape[0] > 1 and kv_cache.stride(0) % 4):
        return (f"kv_cache at byte offset {kv_cache.data_ptr() % 16} mod 16 with page stride {kv_cache.stride(0)}: "
                "the Triton kernel needs both multiples of 4 (fp32 scales and bf16 rope values are loaded typed)")
    b, s_q, h, _ = q.shape
    if 2 * b * s_q * cdiv(h, BLOCK_H) >= 2**31:
        return f"{b} x {s_q} tokens x {cdiv(h, BLOCK_H)} head blocks x 2 V halves: 2**31 programs or more"
    if indices.shape[2] >= 2**31 - 1024:
        return f"top-k {indices.shape[2]}: 2**31 - 1024 or more positions"
    if kv_cache.shape[1] * kv_cache.shape[3] >= 2**31:
        return f"pages of {kv_cache.shape[1]} tokens: 2**31 bytes or more (a token's offset inside its page is int32)"
    return None


def warmup(heads: int = 128, *, layouts=("v32", "v4"), page_size: int = 64, topk: int = 2048,
           device="cuda") -> list:
    """Compile every kernel specialisation a serving engine hits for this head count and page size.

    Call before capturing CUDA graphs, so no JIT compile stalls inside a capture: both paths, with and
    without topk_lens and attn_sink, per layout. Returns the keys it compiled (each first compile is
    logged with its time)."""
    dev = torch.device(device)
    before = set(_COMPILED)
    for layout in layouts:
        bpt, d = LAYOUTS[layout]
        q = torch.zeros((1, 1, heads, d), dtype=torch.bfloat16, device=dev)
        cache = torch.zeros((2, page_size, 1, bpt), dtype=torch.uint8, device=dev)
        idx = torch.full((1, 1, topk), -1, dtype=torch.int32, device=dev)
        lens = torch.zeros((1,), dtype=torch.int32, device=dev)
        sink = torch.zeros((heads,), dtype=torch.float32, device=dev)
        for split in (False, True):
            for tl_, sk in ((None, None), (lens, None), (None, sink), (lens, sink)):
                launch(q, cache, idx, 1.0, layout, tl_, sk, split=split)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return sorted(_COMPILED - before, key=str)


# ------------------------------------------------------------------------------------------------
# compile gates: what the launcher launches for 128 heads, pages of 64, top-k 2048

_DEC_SIG = {
    "q_ptr": "*bf16", "cache_ptr": "*u8", "idx_ptr": "*i32", "lens_ptr": "*i32", "sink_ptr": "*fp32",
    "out_ptr": "*bf16", "lse_ptr": "*fp32", "part_ptr": "*fp32", "ml_ptr": "*fp32",
    "s_q": "i32", "topk": "i32", "nslots": "i32", "page_stride": "i32",
    "stride_qb": "i32", "stride_qs": "i32", "stride_qh": "i32", "stride_qd": "constexpr",
    "stride_ib": "i32", "stride_is": "i32", "stride_in": "constexpr",
    "stride_ob": "i32", "stride_os": "i32", "stride_oh": "i32", "tiles_per_split": "i32", "qk_scale": "fp32",
    "H": "constexpr", "PAGE": "constexpr", "V4": "constexpr", "BLOCK_H": "constexpr", "BLOCK_N": "constexpr",
    "SPLIT": "constexpr", "HAS_LENS": "constexpr", "HAS_SINK": "constexpr",
}
# Ints Triton sees as multiples of 16 at launch for contiguous inputs of these shapes (page stride 64 x 656
# or 64 x 584 bytes, top-k 2048; topk is not specialised at launch, which changes no load). Unit strides are
# specialised to the constant 1.
_DEC_DIV = ["topk", "page_stride", "stride_qb", "stride_qs", "stride_qh", "stride_ib", "stride_is", "stride_ob",
            "stride_os", "stride_oh"]


def _gate_decode(name, layout, split):
    bn, nw, ns = CONFIGS[layout]
    constexprs = {"stride_qd": 1, "stride_in": 1, "H": 128, "PAGE": 64, "V4": layout == "v4", "BLOCK_H": BLOCK_H,
                  "BLOCK_N": bn, "SPLIT": split, "HAS_LENS": True, "HAS_SINK": True}
    return name, mla_decode_kernel, _DEC_SIG, constexprs, _DEC_DIV, {"num_warps": nw, "num_stages": ns}


GATE_KERNELS = [
    _gate_decode("sparse_mla_decode_v32", "v32", False),
    _gate_decode("sparse_mla_decode_v4", "v4", False),
    _gate_decode("sparse_mla_decode_split_v32", "v32", True),
    _gate_decode("sparse_mla_decode_split_v4", "v4", True),
    ("sparse_mla_decode_combine", mla_combine_kernel,
     {"part_ptr": "*fp32", "ml_ptr": "*fp32", "sink_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32",
      "s_q": "i32", "splits": "i32", "stride_ob": "i32", "stride_os": "i32", "stride_oh": "i32",
      "H": "constexpr", "BLOCK_H": "constexpr", "CH": "constexpr", "HAS_SINK": "constexpr"},
     {"H": 128, "BLOCK_H": BLOCK_H, "CH": COMBINE_HEADS, "HAS_SINK": True}, ["stride_ob", "stride_os", "stride_oh"],
     {"num_warps": 4, "num_stages": 1}),
]
