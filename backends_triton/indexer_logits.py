"""indexer_logits in Triton: DSA indexer scores with tensor cores (DeepGEMM's fp8_mqa_logits contract).

    out[t, j] = sum_h w[t, h] * relu(dot(q[t, h], kv[j]) * kv_scale[j])   for ks[t] <= j < ke[t]

Design (q stationary, keys streamed; the head reduction stays inside each warp):
- A program owns BLOCK_T query rows and one split of the key axis. Its q tile [BLOCK_T*H, D] and the
  weights [BLOCK_T*H] are loaded once; the program then streams key tiles kv[BLOCK_N, D] through the
  software pipeline and, per tile, computes ONE tensor-core dot
      acc[BLOCK_N, BLOCK_T*H] = kv_tile @ q_tile^T          (fp8 or bf16 operands, fp32 accumulate)
  with keys as the M dimension and (rows, heads) as the N dimension. The epilogue scales each key row
  by kv_scale (after the head sum on the widened path below), applies relu (as (x + |x|) / 2 there),
  multiplies by the per-(row, head) weight, and reduces over heads with a
  reshape to [BLOCK_N, BLOCK_T, H] + sum: on the MMA accumulator layout the N dimension lives inside a
  thread and across the 4 lanes of a quad, so the head sum needs no shared-memory round trip (the
  transposed layout, (rows*heads) as M, would reduce across warps).
- Exact fp8 (fp16 MMA): with enough rows, kv is widened to fp16 once before the kernel (widen_kv, one
  pass), negating the rows whose scale is negative, so that relu(dot * s) = |s| * relu(dot * sign(s))
  lets the kernel apply |s| once per key after the head sum instead of once per (key, head); the MMA
  then reads 16-bit operands from shared memory, as for bf16. With few rows each program widens its key
  tiles in registers (see WIDEN_MIN_HEAD_ROWS).
- Windows: the program computes only the key tiles that meet the hull of its rows' windows; every
  other tile of its split is written -inf without any math (when `clean`). Inside computed tiles each
  row's own window masks the result.
- Grid: axis 0 = row tiles (unbounded, so 100k+ rows are fine), axis 1 = key splits (at most a few
  hundred). Consecutive programs share the same key range, so the concurrently streamed kv stays in L2.
- All row-dependent offsets are int64 (T * N passes 2**31 at 16k x 131k).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from ._launch import cdiv, next_pow2

# Config per head count: (BLOCK_T, BLOCK_N, num_warps, num_stages), BLOCK_T * H = the MMA N width.
# fp8 operands in memory (widened in the loop, or fp8 MMA): 2 rows x 64 heads = N 128, 64 keys = M for one
# warpgroup, 64 accumulator registers a thread. (N 256 here needs a 255-register stack frame.)
_CONFIGS = {
    16: (8, 64, 4, 3),
    32: (4, 64, 4, 3),
    64: (2, 64, 4, 3),
    128: (1, 64, 4, 3),
}
# 16-bit operands in memory (bf16, or fp8 widened once before the kernel): N 256 (e.g. 4 rows x 64 heads),
# 64 keys, 2 warpgroups each 64 x 128 of it. On SM90 at H 32 and 64, 128 keys (each warpgroup 64 x 256:
# 128 accumulator registers a thread, 251-255 in all; sm_100a needs a stack frame for it). H200 sweeps
# (tools/probe_indexer_triton.py), exact fp8 4096 x 32768, H 64: (4, 128, 8, 3) 4275 us, (4, 64, 8, 3) 4634,
# (2, 64, 4, 3) 4445, (2, 128, 8, 3) 5147; bf16: (4, 128, 8, 3) 3849 us, (2, 64, 4, 3) 4217; H 32:
# (8, 128, 8, 3) 2126 us, (8, 64, 8, 3) 2325.
_CONFIGS_16BIT = {
    16: (16, 64, 8, 3),
    32: (8, 64, 8, 3),
    64: (4, 64, 8, 3),
    128: (2, 64, 8, 3),
}
_CONFIGS_16BIT_SM90 = {32: (8, 128, 8, 3), 64: (4, 128, 8, 3)}
# Exact fp8 widens kv to fp16 once (widen_kv: 6.8 us at 32768 keys, 15.1 us at 131072 on the H200) when the
# call has at least this many (row, head) pairs; below it each program widens its key tiles in registers,
# ~25% slower a row (H200, 4096 x 131072, H 64: 20806 us in the loop, 15523 widened once, ~1.3 us a row).
# At full rate that breaks even near 12 rows at H 64; the threshold (128 rows) leaves room for small grids.
# Widened once, the scale's sign is folded into kv and |s| applied after the head sum (SIGNS_IN_KV): the same
# as the per-head form up to rounding for finite scales (past ~1e36 the per-head products overflow first),
# but an inf scale gives +-inf where the reference's inf * 0 and inf - inf terms give NaN (a known difference).
WIDEN_MIN_HEAD_ROWS = 8192
# (BLOCK_T, BLOCK_N, num_warps, num_stages) for every head count when set: for benchmark sweeps.
CONFIG_OVERRIDE: Optional[tuple[int, int, int, int]] = None

# fp8 operands, by the op's `precise` argument (the only switch): precise=False (default) feeds them to
# the fp8 tensor cores (2x the fp16 rate), whose accumulation inside an MMA keeps only about 14 mantissa
# bits on Hopper (DeepGEMM's finding): errors near 1e-4 of the largest product, within the op's 1e-3 of
# the row's largest |score|. precise=True widens fp8 to fp16 (exact; in registers, or once before the
# kernel: see WIDEN_MIN_HEAD_ROWS) for fp16 MMAs with true fp32 accumulation (1e-5 of the row norm).
# H200, 4096 x 32768, 64 heads: 2859 us fp8, ~3920 us exact.


@triton.jit
def load_query_tile(q_ptr, w_ptr, m_row, m_head, m_ok, d, stride_qt, stride_qh, stride_wt, stride_wh,
                    F16_MMA: tl.constexpr, SIGNS_IN_KV: tl.constexpr):
    """The stationary operands of a program's (row, head) pairs m: q^T [D, TH] (K-major B operand) and the
    weights [TH] (halved for the (x + |x|) relu of SIGNS_IN_KV). Shared with indexer_topk."""
    m_head = m_head.to(tl.int64)  # head x head stride can pass 2^31 (a head-major q of 132105 rows at H 128)
    w = tl.load(w_ptr + m_row * stride_wt + m_head * stride_wh, mask=m_ok, other=0.0)  # [TH] fp32
    if SIGNS_IN_KV:  # relu(x) w as (x + |x|) (w / 2) below, exactly (2x and w / 2 round as x and w)
        w = 0.5 * w
    q = tl.load(q_ptr + (m_row * stride_qt + m_head * stride_qh)[:, None] + d[None, :],
                mask=m_ok[:, None], other=0.0)  # [TH, D]
    if F16_MMA:
        q = q.to(tl.float16)
    return tl.trans(q), w


@triton.jit
def score_keys(kv_ptr, scale_ptr, n, n_ok, d, qt, w, stride_kn, stride_s, H: tl.constexpr, BLOCK_T: tl.constexpr,
               BLOCK_N: tl.constexpr, HAS_SCALE: tl.constexpr, F16_MMA: tl.constexpr, SIGNS_IN_KV: tl.constexpr):
    """Scores [BLOCK_N, BLOCK_T] of keys n (any BLOCK_N key ids, e.g. a strided sample) for the program's
    rows, before any window mask. Each key's score depends only on its own kv row and scale, never on the
    other keys of the tile, so indexer_topk's sample, filter and rescan score a key bitwise alike."""
    kv = tl.load(kv_ptr + n.to(tl.int64)[:, None] * stride_kn + d[None, :], mask=n_ok[:, None], other=0.0)
    if F16_MMA:
        kv = kv.to(tl.float16)
    acc = tl.dot(kv, qt, out_dtype=tl.float32)  # [BLOCK_N, TH]
    if HAS_SCALE:
        s = tl.load(scale_ptr + n.to(tl.int64) * stride_s, mask=n_ok, other=0.0)
        if not SIGNS_IN_KV:
            acc = acc * s[:, None]
    if SIGNS_IN_KV:  # H200: -2.5% on this path, +37% on the in-loop widening path (as max there)
        acc = (acc + tl.abs(acc)) * w[None, :]
    else:
        acc = tl.maximum(acc, 0.0) * w[None, :]
    score = tl.sum(tl.reshape(acc, (BLOCK_N, BLOCK_T, H)), axis=2)  # [BLOCK_N, BLOCK_T]
    if HAS_SCALE and SIGNS_IN_KV:  # relu(x s) = |s| relu(x sign(s)): the scale after the head sum
        score = score * tl.abs(s)[:, None]
    return score


@triton.jit
def indexer_logits_kernel(
    q_ptr,  # [T, H, D] fp8 e4m3 or bf16, unit last stride
    kv_ptr,  # [N, D], unit last stride
    scale_ptr,  # fp32 [N] (unused unless HAS_SCALE)
    w_ptr,  # fp32 [T, H], any strides
    ks_ptr,  # int32 [T]
    ke_ptr,  # int32 [T]
    out_ptr,  # fp32 [T, N] rows of stride stride_ot, unit last stride
    T,
    N,
    stride_qt,
    stride_qh,
    stride_kn,
    stride_s,
    stride_wt,
    stride_wh,
    stride_ks,
    stride_ke,
    stride_ot,
    tiles_per_split,  # key tiles of BLOCK_N per program along axis 1
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    CLEAN: tl.constexpr,
    F16_MMA: tl.constexpr,  # fp8 operands widened (exactly) to fp16 before the MMA: the op's precise=True
    SIGNS_IN_KV: tl.constexpr = False,  # kv rows of negative scale were negated (widen_kv): use |scale|
):
    pid_t = tl.program_id(0)
    pid_s = tl.program_id(1)
    TH: tl.constexpr = BLOCK_T * H

    # ---- the program's rows: windows, weights and the stationary q tile --------------------------
    rows = pid_t.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    row_ok = rows < T
    ks = tl.load(ks_ptr + rows * stride_ks, mask=row_ok, other=0)
    ke = tl.load(ke_ptr + rows * stride_ke, mask=row_ok, other=0)
    lo = tl.minimum(tl.maximum(ks, 0), N)
    hi = tl.maximum(tl.minimum(tl.maximum(ke, 0), N), lo)
    hi = tl.where(row_ok, hi, lo)  # padding rows have empty windows
    # Hull of the non-empty windows (empty windows do not widen it).
    nonempty = hi > lo
    lo_min = tl.min(tl.where(nonempty, lo, N), axis=0)
    hi_max = tl.max(tl.where(nonempty, hi, 0), axis=0)

    m = tl.arange(0, TH)  # (row, head) pairs, row-major: m = r * H + h
    m_row = pid_t.to(tl.int64) * BLOCK_T + m // H
    m_head = m % H
    m_ok = m_row < T
    d = tl.arange(0, D)
    qt, w = load_query_tile(q_ptr, w_ptr, m_row, m_head, m_ok, d, stride_qt, stride_qh, stride_wt, stride_wh,
                            F16_MMA, SIGNS_IN_KV)

    # ---- this split's key tiles: [ts, te); computed ones: [a, b) --------------------------------
    n_tiles = tl.cdiv(N, BLOCK_N)
    ts = pid_s * tiles_per_split
    te = tl.minimum(ts + tiles_per_split, n_tiles)
    a = tl.minimum(tl.maximum(lo_min // BLOCK_N, ts), te)
    b = tl.minimum(tl.maximum(tl.cdiv(hi_max, BLOCK_N), a), te)  # no window at all: b == a, all filled

    out_rows = out_ptr + rows * stride_ot  # [BLOCK_T] row bases (int64 offsets)
    nn = tl.arange(0, BLOCK_N)

    for tile in tl.range(a, b):
        n = tile * BLOCK_N + nn  # [BLOCK_N] int32 (N < 2**31)
        n_ok = n < N
        score = score_keys(kv_ptr, scale_ptr, n, n_ok, d, qt, w, stride_kn, stride_s, H, BLOCK_T, BLOCK_N,
                           HAS_SCALE, F16_MMA, SIGNS_IN_KV)  # [BLOCK_N, BLOCK_T]
        inside = (n[:, None] >= lo[None, :]) & (n[:, None] < hi[None, :])
        score = tl.where(inside, score, float("-inf"))
        tl.store(out_rows[None, :] + n[:, None], score, mask=n_ok[:, None] & row_ok[None, :])

    if CLEAN:  # tiles of the split that no row's window meets: -inf, no math
        ninf = tl.full((BLOCK_N, BLOCK_T), float("-inf"), tl.float32)
        for tile in tl.range(ts, a):
            n = tile * BLOCK_N + nn
            tl.store(out_rows[None, :] + n[:, None], ninf, mask=(n < N)[:, None] & row_ok[None, :])
        for tile in tl.range(b, te):
            n = tile * BLOCK_N + nn
            tl.store(out_rows[None, :] + n[:, None], ninf, mask=(n < N)[:, None] & row_ok[None, :])


@triton.jit
def widen_kv_kernel(kv_ptr, scale_ptr, out_ptr, N, stride_kn, stride_s, D: tl.constexpr, BLOCK: tl.constexpr):
    """out[j] = fp16(kv[j]), negated where scale[j] has its sign bit set (exact: e4m3 is a subset of fp16)."""
    n = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    n_ok = n < N
    s = tl.load(scale_ptr + n * stride_s, mask=n_ok, other=0.0)
    neg = (s.to(tl.int32, bitcast=True) < 0)[:, None]
    d = tl.arange(0, D)
    x = tl.load(kv_ptr + n[:, None] * stride_kn + d[None, :], mask=n_ok[:, None], other=0.0).to(tl.float16)
    tl.store(out_ptr + n[:, None] * D + d[None, :], tl.where(neg, -x, x), mask=n_ok[:, None])


def widen_kv(kv, kv_scale, wrap=None):
    """kv as fp16 [N, D], rows of negative scale negated, so the kernel may take |scale| after the head sum."""
    n, d = kv.shape
    out = torch.empty((n, d), dtype=torch.float16, device=kv.device)
    block = 64
    kernel = widen_kv_kernel if wrap is None else wrap(widen_kv_kernel)
    kernel[(cdiv(n, block),)](kv, kv_scale, out, n, kv.stride(0), kv_scale.stride(0), D=d, BLOCK=block)
    return out


@functools.lru_cache(maxsize=None)
def _device_info(index: Optional[int]) -> tuple[int, int]:
    """(SMs, compute capability major) of CUDA device `index`; (132, 9) when no device answers (it then
    only shapes a grid)."""
    try:
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(index if index is not None else 0)
            return p.multi_processor_count, p.major
    except Exception:  # noqa: BLE001  (no device: only the grid shape is affected)
        pass
    return 132, 9


def _sm_count(index: Optional[int]) -> int:
    return _device_info(index)[0]


def config(h: int, sixteen_bit: bool = False, sm90: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_T, BLOCK_N, num_warps, num_stages) for h heads, kv in memory as 16-bit values or fp8, on an
    SM90 device or another; CONFIG_OVERRIDE wins (for sweeps)."""
    if CONFIG_OVERRIDE is not None:
        return CONFIG_OVERRIDE
    if sixteen_bit and sm90 and h in _CONFIGS_16BIT_SM90:
        return _CONFIGS_16BIT_SM90[h]
    table = _CONFIGS_16BIT if sixteen_bit else _CONFIGS
    if h in table:
        return table[h]
    bt = max(1, 128 // next_pow2(h))
    return bt, 128, 8, 3


def split_count(row_tiles: int, key_tiles: int, sms: int) -> int:
    """Key splits so that the grid has about 2 programs per SM or more (1 when rows alone fill it)."""
    want = 2 * sms
    if row_tiles >= want:
        return 1
    return max(1, min(key_tiles, cdiv(want, max(row_tiles, 1)), 65535))


def launch(q, kv, kv_scale, weights, ks, ke, clean, precise, *, out=None, wrap=None):
    """Functional kernel form of dsa::indexer_logits (arguments already validated by the op)."""
    t, h, d = q.shape
    n = kv.shape[0]
    if out is None:
        out = torch.empty((t, n), dtype=torch.float32, device=q.device)
    if t == 0 or n == 0:
        return out
    f16_mma = q.dtype == torch.float8_e4m3fn and bool(precise)
    has_scale = kv_scale is not None
    widened = f16_mma and has_scale and t * h >= WIDEN_MIN_HEAD_ROWS
    if widened:  # a temporary of N * D * 2 bytes
        kv = widen_kv(kv, kv_scale, wrap)
    sms, major = _device_info(q.device.index) if q.device.type == "cuda" else (132, 0)
    bt, bn, nw, ns = config(h, sixteen_bit=widened or q.dtype == torch.bfloat16, sm90=major == 9)
    row_tiles = cdiv(t, bt)
    key_tiles = cdiv(n, bn)
    splits = split_count(row_tiles, key_tiles, sms)
    per_split = cdiv(key_tiles, splits)
    splits = cdiv(key_tiles, per_split)
    kernel = indexer_logits_kernel if wrap is None else wrap(indexer_logits_kernel)
    kernel[(row_tiles, splits)](
        q, kv, kv_scale if has_scale else weights, weights, ks, ke, out,
        t, n,
        q.stride(0), q.stride(1), kv.stride(0), kv_scale.stride(0) if has_scale else 0,
        weights.stride(0), weights.stride(1), ks.stride(0), ke.stride(0), out.stride(0),
        per_split,
        H=h, D=d, BLOCK_T=bt, BLOCK_N=bn, HAS_SCALE=has_scale, CLEAN=bool(clean),
        F16_MMA=f16_mma, SIGNS_IN_KV=widened,
        num_warps=nw, num_stages=ns,
    )
    return out


@torch.library.triton_op("dsa_triton::indexer_logits", mutates_args=())
def indexer_logits(
    q: torch.Tensor,
    kv: torch.Tensor,
    kv_scale: Optional[torch.Tensor],
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    clean: bool,
    precise: bool,
) -> torch.Tensor:
    return launch(q, kv, kv_scale, weights, ks, ke, clean, precise, wrap=torch.library.wrap_triton)


def supports(q, kv, kv_scale, weights, ks, ke, clean, precise) -> Optional[str]:
    h, d = q.shape[1], q.shape[2]
    if d not in (64, 128):
        return f"head dim {d} (the Triton kernel takes D 64 or 128)"
    if h & (h - 1) or h > 128:
        return f"{h} heads (the Triton kernel takes a power of two up to 128)"
    if kv.shape[0] >= 2**31 - 2 * 128:
        return "more than 2**31 keys"
    return None


_GATE_SIG = {
    "q_ptr": "*fp8e4nv", "kv_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "w_ptr": "*fp32", "ks_ptr": "*i32",
    "ke_ptr": "*i32", "out_ptr": "*fp32", "T": "i32", "N": "i32", "stride_qt": "i32", "stride_qh": "i32",
    "stride_kn": "i32", "stride_s": "i32", "stride_wt": "i32", "stride_wh": "i32", "stride_ks": "i32",
    "stride_ke": "i32", "stride_ot": "i32", "tiles_per_split": "i32",
    "H": "constexpr", "D": "constexpr", "BLOCK_T": "constexpr", "BLOCK_N": "constexpr",
    "HAS_SCALE": "constexpr", "CLEAN": "constexpr", "F16_MMA": "constexpr", "SIGNS_IN_KV": "constexpr",
}
_STRIDES = ["N", "stride_qt", "stride_qh", "stride_kn", "stride_ot"]


def _gate(name, dtype, h, f16_mma=False, widened=False, sm90=False):
    bt, bn, nw, ns = config(h, sixteen_bit=widened or dtype == "bf16", sm90=sm90)
    sig = dict(_GATE_SIG)
    if dtype == "bf16":
        sig["q_ptr"] = sig["kv_ptr"] = "*bf16"
    if widened:
        sig["kv_ptr"] = "*fp16"
    constexprs = {"H": h, "D": 128, "BLOCK_T": bt, "BLOCK_N": bn, "HAS_SCALE": dtype == "fp8", "CLEAN": True,
                  "F16_MMA": f16_mma, "SIGNS_IN_KV": widened}
    options = {"num_warps": nw, "num_stages": ns}
    if sm90:
        options["targets"] = ("sm_90a",)
    return name, indexer_logits_kernel, sig, constexprs, _STRIDES, options


# For the compile gates, each with the launcher's config (the _sm90 ones for sm_90a only): fp8 widened in
# the loop (fp16 MMA), fp8 widened once (fp16 kv), fp8 MMA (the default mode), bf16; D 128.
GATE_KERNELS = [
    _gate("indexer_logits_fp8_h64", "fp8", 64, f16_mma=True),
    _gate("indexer_logits_fp8_h32", "fp8", 32, f16_mma=True),
    _gate("indexer_logits_fp8wide_h64", "fp8", 64, f16_mma=True, widened=True),
    _gate("indexer_logits_fp8wide_h64_sm90", "fp8", 64, f16_mma=True, widened=True, sm90=True),
    _gate("indexer_logits_fp8wide_h32", "fp8", 32, f16_mma=True, widened=True),
    _gate("indexer_logits_fp8wide_h32_sm90", "fp8", 32, f16_mma=True, widened=True, sm90=True),
    _gate("indexer_logits_fp8wide_h16", "fp8", 16, f16_mma=True, widened=True),
    _gate("indexer_logits_fp8wide_h128", "fp8", 128, f16_mma=True, widened=True),
    _gate("indexer_logits_fp8mma_h64", "fp8", 64),
    _gate("indexer_logits_fp8mma_h32", "fp8", 32),
    _gate("indexer_logits_bf16_h64", "bf16", 64),
    _gate("indexer_logits_bf16_h64_sm90", "bf16", 64, sm90=True),
    ("widen_kv", widen_kv_kernel,
     {"kv_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "out_ptr": "*fp16", "N": "i32", "stride_kn": "i32",
      "stride_s": "i32", "D": "constexpr", "BLOCK": "constexpr"}, {"D": 128, "BLOCK": 64}, ["stride_kn"]),
]
