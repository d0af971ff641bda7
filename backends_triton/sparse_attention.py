"""sparse_attention in Triton: grouped-query attention over each row's selected tokens, fp8 or bf16 cache.

Contract: ``dsa_ops.ops.sparse_attention`` (the reference there is the spec). Two paths, one kernel:

- Slot pass (``slots_kernel``): every (row, j) is mapped once through token_to_req and block_table to a
  physical slot ``page * P + offset`` (int32 workspace [T, topk], -1 where the token is invalid), so the
  attention loop does one dependent load (slot -> K/V) instead of two (index -> page -> K/V) and the
  KV heads of a row share the lookups. Every metadata value is clamped before it addresses memory.
- Single pass (``attention_kernel`` with SPLIT=False): one program per (row, KV head). The group's
  Hq / Hkv query heads, padded to BLOCK_H >= 16, are the MMA M side; K and V tiles of BLOCK_N tokens
  are gathered by slot (cp.async-pipelined, num_stages), QK^T and PV run on the tensor cores with fp32
  accumulation, and the softmax is an fp32 online softmax in base 2 (log2(e) folded into the score
  scale). A bf16 cache feeds bf16 MMAs. An fp8 cache is widened exactly to fp16 (one cvt per pair of
  e4m3 codes; widening to bf16 takes four) with each head's q scaled by a power of two into fp16 (FP8_F16). By
  default (FP8_OPAQUE) K and V codes are loaded as they are, widened in the load layout and staged
  through shared memory as fp16, so both MMAs read their operands by ldmatrix as with a bf16 cache
  (see _opaque); the other forms (V as int16 pairs, V's columns permuted) are kept for sweeps.
- Split-K (SPLIT=True plus ``merge_kernel``): when rows x KV heads are too few to fill the SMs, each
  (row, KV head) is cut into splits of the top-k axis, each writes its unnormalised partial output,
  running max and sum to an fp32 workspace sized from the shapes, and the merge combines them.
  SPLIT_MAX_PROGRAMS chooses between the two paths.

Masked logits take a finite sentinel (NEG) and the running max starts at the same value, so no
exp2(-inf - -inf) appears: a tile with no valid token adds p = 1 for each masked token against values
loaded as 0 (the sum grows, the output stays 0), and the first valid logit later scales that away
(alpha = exp2(NEG - m) = 0). A row with no valid token, or none processed, writes 0.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ._launch import FirstLaunchLog, cdiv, next_pow2, unit_last_stride

NEG = tl.constexpr(-1.0e30)  # masked-logit sentinel (log2 domain); finite, far below any real score
LOG2E = 1.4426950408889634
SLOT_BLOCK = 1024  # slot pass: elements per program (4 warps x 32 lanes x 8 int32)
INT32_MAX = 2**31 - 1

# Path gate: split-K while rows x KV heads <= SPLIT_MAX_PROGRAMS, the single pass above it. H200 (fp8 FP8_OPAQUE
# form, 2 KV heads, the configs below, benchmarks/bench_sparse_attention.py sweep): 32 rows split-K 31.0 us
# against single pass 46.3; 64 rows 53.5 (best split) against 48.8; 128 rows 87.5 against 69.8.
SPLIT_MAX_PROGRAMS = 64
# Split-K: aim for this many programs in all, at most MAX_SPLITS splits of a (row, KV head). H200, FP8_OPAQUE,
# (64, 2, 2): target 528 gives 11.6 / 20.4 / 31.0 us at 1 / 16 / 32 rows, 264 gives 11.5 / 22.5 / 34.7, 132
# gives 11.5 / 28.4 / 42.0 (vLLM's kernel 12.6 / 20.9 / 30.5 in the same run).
SPLIT_TARGET_PROGRAMS = 528
MAX_SPLITS = 64  # a power of two: the merge kernel's split axis

# (BLOCK_N, num_warps, num_stages): the single pass per cache dtype, and the split-K path. H200 sweep of the
# default fp8 form (FP8_OPAQUE; 24 q / 2 kv heads, D 128, top-k 2048 of 65536 tokens, cold-L2 graph replay,
# `python benchmarks/bench_sparse_attention.py sweep OUT opaque`), us at 32 / 64 / 128 / 400 / 1600 / 4096 rows:
#   (32, 1, 3)  88.0 / 91.1 / 104.0 / 193.5 / 669.3 / 1638.4   (more programs an SM: the gathers' latency hides)
#   (128, 4, 3) 46.3 / 48.8 / 69.8 / 217.5 / 729.3 / 1791.5    (fewer, larger programs: best while the grid is small)
#   (128, 4, 2) 55.8 / 59.1 / 76.7 / 215.6 / 707.6 / 1708.1; (64, 2, 3) 60.5 / 63.3 / 79.5 / 227.9 / 720.4 / 1738.3;
#   8 warps or (64, 4, 3) 13-32% slower. vLLM's kernel: 30.5 / 50.3 / 67.3 / 173.5 / 746.4 / 1626.2.
# bf16 cache at 1600 rows: (64, 2, 2) 771.3 us, (128, 4, 2) 776.5. Split-K: (64, 2, 2) (see SPLIT_TARGET_PROGRAMS);
# (32, 4, 2) 10.6 us at 1 row but 22.6 / 35.3 at 16 / 32.
SINGLE_CONFIG = {"fp8": (32, 1, 3), "bf16": (64, 2, 2)}
# Single pass with few programs (rows x KV heads <= FEW_PROGRAMS): the larger tile (128 rows: 69.8 us against
# 104.0; 400 rows: 217.5 against 193.5; the crossover between them is not measured).
SINGLE_CONFIG_FEW = {"fp8": (128, 4, 3), "bf16": (64, 2, 2)}
FEW_PROGRAMS = 512
SPLIT_CONFIG = (64, 2, 2)
# fp8 caches: fp16 MMAs (see attention_kernel, F16), and which of K / V load their codes as int16 pairs.
# Widening to bf16 made the fp8 loop instruction-bound: at (128, 4, 2) its sm_90a SASS issues 1567 thread
# instructions per token (1600 rows: 801.0 us, 2.1 TB/s) against 609 for a bf16 cache (792.6 us for twice
# the bytes); fp16 with V as pairs issues 1057, with K and V loaded directly 1018. Pairs against direct loads with
# bf16 widening, (64, 4, 3): 270.9 / 898.7 / 2185.5 us against 280.9 / 882.6 / 2168.5 at 400 / 1600 / 4096.
# Those counts are triton 3.9's; tools/sass_count_sparse_attention.py with triton 3.6.0 (the GPU's) gives bf16
# cache 577, bf16 widening 1752, fp16 with V pairs 1207, codes loaded directly 1045, V's columns permuted 999,
# FP8_OPAQUE 651 (3.9: 655; 651 at (64, 2, 2) too), all with the same shared memory (72 KiB). Predicted from the
# count: 1600 rows at the fp8 copy floor (~400 us). Measured (H200, benchmarks/bench_sparse_attention.py, (128, 4, 2)):
# 214.6 / 707.2 / 1707.9 us at 400 / 1600 / 4096 rows, 12-14% under the bf16 widening but 1.7-2.2x the floor:
# the issue count is no longer what bounds the loop (next: stall reasons under ncu, and the (64, 2, 2) shape).
FP8_F16 = True
FP8_K_PAIRS = False
FP8_V_PAIRS = True
# V's codes loaded directly with its columns permuted (see _perm_cols; takes precedence over FP8_V_PAIRS).
FP8_V_PERM = False
# K and V codes loaded directly (FP8_K_PAIRS / FP8_V_PAIRS ignored), widened tiles passed through _opaque on CUDA;
# the same loads without the PTX move under the interpreter; ignored on ROCm.
FP8_OPAQUE = True
# Sweeps only: a dict replacing the above (keys single_config, split_config, split_target, splits,
# slots_inline, split, f16, k_pairs, v_pairs, v_perm, opaque) when set.
CONFIG_OVERRIDE: Optional[dict] = None


@triton.jit(do_not_specialize=["numel", "topk", "num_blocks", "num_reqs", "max_pages", "stride_bt"])
def slots_kernel(
    idx_ptr,  # int32 [T, topk] request-relative positions, unit last stride
    bt_ptr,  # int32 [num_reqs, max_pages], unit last stride
    t2r_ptr,  # int32 [T]
    slots_ptr,  # int32 [T * topk] out: page * PAGE + offset, or -1
    numel,
    topk,
    num_blocks,
    num_reqs,
    max_pages,
    stride_it,
    stride_bt,
    stride_tr,
    PAGE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """slots[r, j] = block_table[req(r), idx[r, j] // PAGE] * PAGE + idx[r, j] % PAGE, -1 where invalid."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < numel
    row = offs // topk
    col = offs - row * topk
    req = tl.load(t2r_ptr + row * stride_tr, mask=live, other=-1)
    pos = tl.load(idx_ptr + row * stride_it + col, mask=live, other=-1)
    ok = live & (req >= 0) & (req < num_reqs) & (pos >= 0)
    pos = tl.maximum(pos, 0)
    pslot = pos // PAGE
    ok = ok & (pslot < max_pages)
    page = tl.load(bt_ptr + req.to(tl.int64) * stride_bt + pslot, mask=ok, other=-1)
    ok = ok & (page >= 0) & (page < num_blocks)  # the launcher requires num_blocks * PAGE <= 2**31 - 1
    tl.store(slots_ptr + offs, tl.where(ok, page * PAGE + (pos - pslot * PAGE), -1), mask=live)


@triton.jit
def _perm_cols(x, ROWS: tl.constexpr, DIM: tl.constexpr):
    """y[:, (DIM // 4) * r + c] = x[:, 4 * c + r]: the PV MMA's B fragment gives a thread the columns
    n, n + 8, n + 16, n + 24 of each 32 (4 warps side by side on DV), which this maps onto 4 adjacent
    bytes of a row, so the V codes come out of shared memory as 32-bit words, not bytes."""
    return tl.reshape(tl.permute(tl.reshape(x, (ROWS, DIM // 4, 4)), (0, 2, 1)), (ROWS, DIM))


@triton.jit
def _unperm_cols(y, ROWS: tl.constexpr, DIM: tl.constexpr):
    """The inverse of _perm_cols: x[:, 4 * c + r] = y[:, (DIM // 4) * r + c]."""
    return tl.reshape(tl.permute(tl.reshape(y, (ROWS, 4, DIM // 4)), (0, 2, 1)), (ROWS, DIM))


@triton.jit
def _opaque(x):
    """x unchanged, through a PTX move Triton must keep (side effects): its operand-width analysis stops here.

    Triton picks a dot's operand layout (kWidth) from the narrowest load behind each operand. Behind an fp8
    tile that is 8 bits: kWidth 4, where q's fragments come from shared memory by LDS.64 in an order the MMA
    cannot take (a register move per word) and V's codes by single-byte loads (V is [tokens, DV], the MMA
    wants token pairs). Behind this move the widened tile counts as 16-bit: kWidth 2, so Triton widens in
    the load layout, stages fp16 through shared memory and feeds both MMAs by ldmatrix, as for a bf16 cache.
    CUDA only (PTX); the interpreter cannot run it and the kernel is the same without it."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=x.dtype, is_pure=False, pack=2)


@triton.jit
def _tile(ptr, base, ok, PAIRS: tl.constexpr, F16: tl.constexpr, PERM: tl.constexpr, OPAQUE: tl.constexpr,
          BLOCK_N: tl.constexpr, DIM: tl.constexpr):
    """One [BLOCK_N, DIM] K or V tile, rows gathered at element offsets `base` (masked rows 0), as fp16
    when F16 (fp8 cache) else bf16. Both widenings of e4m3 are exact, NaN included.

    PAIRS: ptr is the fp8 cache viewed as int16 (two e4m3 codes each, little-endian: the even element in
    the low byte) and `base` counts int16 pairs; the bytes are split with shifts, widened, and
    interleaved back. Else the codes are loaded as they are and widened by one cast, after PERM's column
    permutation (_perm_cols) where set; OPAQUE passes the widened tile through _opaque."""
    if PAIRS:
        d = tl.arange(0, DIM // 2)
        x = tl.load(ptr + base[:, None] + d[None, :], mask=ok[:, None], other=0)
        lo = (x & 0xFF).to(tl.int8).to(tl.float8e4nv, bitcast=True)
        hi = (x >> 8).to(tl.int8).to(tl.float8e4nv, bitcast=True)
        if F16:
            return tl.reshape(tl.join(lo.to(tl.float16), hi.to(tl.float16)), (BLOCK_N, DIM))
        else:
            return tl.reshape(tl.join(lo.to(tl.bfloat16), hi.to(tl.bfloat16)), (BLOCK_N, DIM))
    else:
        d = tl.arange(0, DIM)
        x = tl.load(ptr + base[:, None] + d[None, :], mask=ok[:, None], other=0.0)
        if PERM:
            x = _perm_cols(x, BLOCK_N, DIM)
        if F16:
            x = x.to(tl.float16)
        else:
            x = x.to(tl.bfloat16)
        if OPAQUE:
            x = _opaque(x)
        return x


@triton.jit(do_not_specialize=["T", "num_blocks", "num_reqs", "max_pages", "stride_bt", "tiles_per_split",
                               "qk_scale", "out_scale"])
def attention_kernel(
    q_ptr,  # bf16 [T, Hq, D], unit last stride
    k_ptr,  # [num_blocks, PAGE, HKV, D] fp8 e4m3 or bf16 (int16 pairs when K_PAIRS), unit last stride
    v_ptr,  # [num_blocks, PAGE, HKV, DV] likewise (V_PAIRS)
    slots_ptr,  # int32 [T, topk] from slots_kernel (unused when SLOTS_INLINE)
    idx_ptr,  # int32 [T, topk] (used only when SLOTS_INLINE)
    bt_ptr,  # int32 [num_reqs, max_pages] (used only when SLOTS_INLINE)
    t2r_ptr,  # int32 [T]
    out_ptr,  # bf16 [T, Hq, DV] (SPLIT=False)
    part_ptr,  # fp32 [T * HKV * splits, BLOCK_H, DV] unnormalised partial outputs (SPLIT=True)
    ml_ptr,  # fp32 [T * HKV * splits, 2, BLOCK_H] running max (log2 domain) and sum (SPLIT=True)
    T,
    topk,
    num_blocks,
    num_reqs,
    max_pages,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kp,
    stride_kh,
    stride_vb,
    stride_vp,
    stride_vh,
    stride_st,
    stride_it,
    stride_bt,
    stride_tr,
    stride_ot,
    stride_oh,
    tiles_per_split,
    qk_scale,  # softmax_scale * k_scale * log2(e)
    out_scale,  # v_scale
    G: tl.constexpr,  # query heads per KV head
    HKV: tl.constexpr,
    BLOCK_H: tl.constexpr,  # G padded to a power of two >= 16 (the MMA M side)
    D: tl.constexpr,
    DV: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    SLOTS_INLINE: tl.constexpr,  # resolve pages here (split-K: saves the slot pass's launch)
    K_PAIRS: tl.constexpr,  # K codes loaded as int16 pairs (see _tile)
    V_PAIRS: tl.constexpr,
    F16: tl.constexpr,  # fp8 cache: K and V widened to fp16, q scaled by a power of two into fp16
    V_PERM: tl.constexpr,  # V's columns permuted in the loop (see _perm_cols), acc restored after it
    OPAQUE: tl.constexpr,  # fp8 tiles loaded directly pass through _opaque after widening (CUDA only)
):
    pid = tl.program_id(0)  # (row, kv head), kv head fastest: a row's heads share its slots in L2
    row = pid // HKV
    h = pid - row * HKV
    split = tl.program_id(1)
    row64 = row.to(tl.int64)

    req = tl.load(t2r_ptr + row64 * stride_tr)
    req_ok = (req >= 0) & (req < num_reqs)
    n_tiles = tl.cdiv(topk, BLOCK_N)
    t0 = split * tiles_per_split
    t1 = tl.minimum(t0 + tiles_per_split, n_tiles)
    t1 = tl.where(req_ok, t1, t0)  # a padding row reads nothing
    req64 = tl.minimum(tl.maximum(req, 0), tl.maximum(num_reqs - 1, 0)).to(tl.int64)

    hh = tl.arange(0, BLOCK_H)
    h_ok = hh < G
    dq = tl.arange(0, D)
    head64 = (h * G + hh).to(tl.int64)  # head x head stride can pass 2^31 (head-major q or out, 132105 rows)
    q = tl.load(q_ptr + row64 * stride_qt + head64[:, None] * stride_qh + dq[None, :],
                mask=h_ok[:, None], other=0.0)  # [BLOCK_H, D] bf16

    qk_row = tl.zeros((BLOCK_H,), tl.float32) + qk_scale  # per head: F16 scales each head on its own
    if F16:
        # e4m3 -> fp16 is one cvt per pair (-> bf16 takes four). Each head's q is scaled by 2^sh so its largest
        # element lies in [2^14, 2^15) and rounded to fp16: exact for every element above 2^-28 of that head's
        # maximum (bf16's 8 bits fit in fp16's 11); its scores are scaled back by 2^-sh in fp32. Per head, not
        # per group: a head far larger (or inf) must not flush the others' q to zero.
        qf = q.to(tl.float32)
        qmax = tl.max(tl.abs(qf), axis=1)  # [BLOCK_H]
        e = ((qmax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        sh = tl.minimum(tl.maximum(14 - e, -126), 126)
        q = (qf * ((sh + 127) << 23).to(tl.float32, bitcast=True)[:, None]).to(tl.float16)
        qk_row = qk_row * ((127 - sh) << 23).to(tl.float32, bitcast=True)
    nn = tl.arange(0, BLOCK_N)
    m_i = tl.full((BLOCK_H,), NEG, tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, DV), tl.float32)

    for t in tl.range(t0, t1):
        n = t * BLOCK_N + nn
        n_ok = n < topk
        if SLOTS_INLINE:
            pos = tl.load(idx_ptr + row64 * stride_it + n, mask=n_ok, other=-1)
            ok = n_ok & (pos >= 0)
            pos = tl.maximum(pos, 0)
            pslot = pos // PAGE
            ok = ok & (pslot < max_pages)
            page = tl.load(bt_ptr + req64 * stride_bt + pslot, mask=ok, other=-1)
            ok = ok & (page >= 0) & (page < num_blocks)
            off = pos - pslot * PAGE
        else:
            slot = tl.load(slots_ptr + row64 * stride_st + n, mask=n_ok, other=-1)
            ok = slot >= 0
            page = slot // PAGE
            off = slot - page * PAGE
        page = page.to(tl.int64)
        kb = _tile(k_ptr, page * stride_kb + off * stride_kp + h * stride_kh, ok, K_PAIRS, F16, False, OPAQUE,
                   BLOCK_N, D)
        s = tl.dot(q, tl.trans(kb), out_dtype=tl.float32)  # [BLOCK_H, BLOCK_N]
        s = tl.where(ok[None, :], s * qk_row[:, None], NEG)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vb = _tile(v_ptr, page * stride_vb + off * stride_vp + h * stride_vh, ok, V_PAIRS, F16, V_PERM, OPAQUE,
                   BLOCK_N, DV)
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb, out_dtype=tl.float32)
        m_i = m_new

    if V_PERM:
        acc = _unperm_cols(acc, BLOCK_H, DV)
    do = tl.arange(0, DV)
    if SPLIT:
        p_idx = pid.to(tl.int64) * tl.num_programs(1) + split
        tl.store(part_ptr + p_idx * (BLOCK_H * DV) + hh[:, None] * DV + do[None, :], acc)
        tl.store(ml_ptr + p_idx * (2 * BLOCK_H) + hh, m_i)
        tl.store(ml_ptr + p_idx * (2 * BLOCK_H) + BLOCK_H + hh, l_i)
    else:
        o = acc * (out_scale / tl.where(l_i > 0, l_i, 1.0))[:, None]
        tl.store(out_ptr + row64 * stride_ot + head64[:, None] * stride_oh + do[None, :],
                 o.to(tl.bfloat16), mask=h_ok[:, None])


@triton.jit(do_not_specialize=["splits", "out_scale"])
def merge_kernel(
    part_ptr,  # fp32 [T * HKV * splits, BLOCK_H, DV]
    ml_ptr,  # fp32 [T * HKV * splits, 2, BLOCK_H]
    out_ptr,  # bf16 [T, Hq, DV]
    splits,
    stride_ot,
    stride_oh,
    out_scale,
    G: tl.constexpr,
    HKV: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DV: tl.constexpr,
    S_PAD: tl.constexpr,  # MAX_SPLITS: one compile serves every split count
):
    """One program per (row, query head): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s."""
    pid = tl.program_id(0)
    row = pid // (HKV * G)
    hq = pid - row * (HKV * G)
    h = hq // G
    j = hq - h * G
    s = tl.arange(0, S_PAD)
    s_ok = s < splits
    p_idx = (row.to(tl.int64) * HKV + h) * splits + s  # [S_PAD]
    m = tl.load(ml_ptr + p_idx * (2 * BLOCK_H) + j, mask=s_ok, other=NEG)
    l_s = tl.load(ml_ptr + p_idx * (2 * BLOCK_H) + BLOCK_H + j, mask=s_ok, other=0.0)
    w = tl.math.exp2(m - tl.max(m, axis=0))
    w = tl.where(s_ok, w, 0.0)
    denom = tl.sum(w * l_s, axis=0)
    do = tl.arange(0, DV)
    a = tl.load(part_ptr + p_idx[:, None] * (BLOCK_H * DV) + j * DV + do[None, :], mask=s_ok[:, None], other=0.0)
    o = tl.sum(a * w[:, None], axis=0) * (out_scale / tl.where(denom > 0, denom, 1.0))
    tl.store(out_ptr + row.to(tl.int64) * stride_ot + hq.to(tl.int64) * stride_oh + do, o.to(tl.bfloat16))


# ------------------------------------------------------------------------------------------------
# host side


def block_h(q_heads: int, kv_heads: int) -> int:
    """The MMA M width for a KV head's query group: the group size padded to a power of two, >= 16."""
    return max(16, next_pow2(q_heads // kv_heads))


def use_split(rows: int, kv_heads: int) -> bool:
    """True when the split-K path serves rows x kv_heads programs (the single pass would leave SMs idle)."""
    o = CONFIG_OVERRIDE or {}
    if o.get("split") is not None:
        return bool(o["split"])
    return rows * kv_heads <= SPLIT_MAX_PROGRAMS


def split_count(rows: int, kv_heads: int, topk: int, block_n: int) -> int:
    """Splits of each (row, KV head)'s top-k axis on the split-K path (a function of shapes only)."""
    o = CONFIG_OVERRIDE or {}
    tiles = max(1, cdiv(topk, block_n))
    target = o.get("split_target", SPLIT_TARGET_PROGRAMS)
    want = o["splits"] if o.get("splits") is not None else cdiv(target, max(1, rows * kv_heads))
    return max(1, min(tiles, want, MAX_SPLITS))


def workspace_bytes(rows: int, q_heads: int, kv_heads: int, v_head_dim: int, topk: int, split: bool) -> int:
    """Device workspace one call allocates: the slot table, plus the split-K partials on that path."""
    n = rows * topk * 4 if not (split and _slots_inline()) else 0
    if split:
        bn = _config(True, True, rows * kv_heads)[0]
        s = split_count(rows, kv_heads, topk, bn)
        n += rows * kv_heads * s * block_h(q_heads, kv_heads) * (v_head_dim + 2) * 4
    return n


def _config(split: bool, fp8: bool, programs: int) -> tuple:
    """(BLOCK_N, num_warps, num_stages) for a launch of `programs` (row, KV head) pairs."""
    o = CONFIG_OVERRIDE or {}
    if split:
        return o.get("split_config", SPLIT_CONFIG)
    table = SINGLE_CONFIG_FEW if programs <= FEW_PROGRAMS else SINGLE_CONFIG
    return o.get("single_config", table["fp8" if fp8 else "bf16"])


def _slots_inline() -> bool:
    """Split-K resolves pages inside its loop (no slot-pass launch): on CUDA, not on ROCm, where the
    page lookups' scalar registers spill on gfx950 (7 SGPR spills at BLOCK_N 32, 65 at 64)."""
    return bool((CONFIG_OVERRIDE or {}).get("slots_inline", SPLIT_SLOTS_INLINE and torch.version.hip is None))


SPLIT_SLOTS_INLINE = True


def _pairs_view(cache: torch.Tensor) -> Optional[torch.Tensor]:
    """The fp8 cache as int16 pairs (strides halved), or None where its strides or offset are odd."""
    if cache.dtype != torch.float8_e4m3fn or cache.shape[-1] % 2:
        return None
    if any(s % 2 for s in cache.stride()[:-1]) or cache.storage_offset() % 2:
        return None
    return cache.view(torch.int16)


_LAUNCHES = FirstLaunchLog("sparse_attention")
_COMPILED = _LAUNCHES.seen  # the specialisations launched so far
_run = _LAUNCHES.run


def _plan(q, k_cache, v_cache, t: int, split: bool) -> tuple:
    """(key, kc, vc, k_pairs, v_pairs, v_perm, opaque, f16, bn, nw, ns, inline): what a launch of `t` rows on
    this path specialises on, and the cache views it passes."""
    hq, d = q.shape[1], q.shape[2]
    page_size, hkv, dv = v_cache.shape[1], v_cache.shape[2], v_cache.shape[3]
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    bn, nw, ns = _config(split, fp8, t * hkv)
    o = CONFIG_OVERRIDE or {}
    f16 = fp8 and o.get("f16", FP8_F16)
    # OPAQUE's direct loads on CUDA and under the interpreter (which checks them without the PTX move), not ROCm
    want_opaque = fp8 and bool(o.get("opaque", FP8_OPAQUE)) and torch.version.hip is None
    opaque = want_opaque and q.is_cuda
    kc = _pairs_view(k_cache) if fp8 and not want_opaque and o.get("k_pairs", FP8_K_PAIRS) else None
    v_perm = fp8 and bool(o.get("v_perm", FP8_V_PERM))
    vc = _pairs_view(v_cache) if fp8 and not (v_perm or want_opaque) and o.get("v_pairs", FP8_V_PAIRS) else None
    k_pairs, v_pairs = kc is not None, vc is not None  # odd strides: the codes are loaded one by one
    kc = k_cache if kc is None else kc
    vc = v_cache if vc is None else vc
    inline = split and _slots_inline()
    key = ("attention", split, inline, str(k_cache.dtype).removeprefix("torch."), k_pairs, v_pairs, v_perm, opaque, f16,
           hq // hkv, hkv, d, dv, page_size, bn, nw, ns)
    return key, kc, vc, k_pairs, v_pairs, v_perm, opaque, f16, bn, nw, ns, inline


def split_compiled(q, k_cache, v_cache) -> bool:
    """Whether this process has launched the split-K path's kernels for these arguments' specialisation (as
    `warmup` does): a launch now compiles nothing (see warmup for what the keys leave out)."""
    hkv, dv = v_cache.shape[2], v_cache.shape[3]
    key = _plan(q, k_cache, v_cache, q.shape[0], True)[0]
    return key in _COMPILED and ("merge", q.shape[1] // hkv, hkv, dv) in _COMPILED and (
        key[2] or ("slots", v_cache.shape[1]) in _COMPILED)


def launch(q, k_cache, v_cache, indices, block_table, token_to_req, softmax_scale, k_scale, v_scale, out,
           *, wrap=None, split: Optional[bool] = None):
    """Kernel form of dsa::sparse_attention.out (arguments validated by the op); `split` forces a path."""
    q, indices, block_table, token_to_req = (unit_last_stride(x) for x in (q, indices, block_table, token_to_req))
    t, hq, d = q.shape
    nb, page_size, hkv, dv = v_cache.shape
    topk = indices.shape[1]
    nreq, max_pages = block_table.shape
    if t == 0:
        return
    if split is None:
        split = use_split(t, hkv)
    g = hq // hkv
    bh = block_h(hq, hkv)
    key, kc, vc, k_pairs, v_pairs, v_perm, opaque, f16, bn, nw, ns, inline = _plan(q, k_cache, v_cache, t, split)
    wrap = wrap or (lambda f: f)
    if topk > 0 and not inline:
        slots = torch.empty((t, topk), dtype=torch.int32, device=q.device)
        numel = t * topk
        _run(wrap(slots_kernel), (cdiv(numel, SLOT_BLOCK),), ("slots", page_size),
             (indices, block_table, token_to_req, slots, numel, topk, nb, nreq, max_pages,
              indices.stride(0), block_table.stride(0), token_to_req.stride(0)),
             dict(PAGE=page_size, BLOCK=SLOT_BLOCK))
    else:
        slots = indices  # never read
    if split:
        s = split_count(t, hkv, topk, bn)
        tiles = max(1, cdiv(topk, bn))
        per = cdiv(tiles, s)
        s = cdiv(tiles, per)
        part = torch.empty((t * hkv * s, bh, dv), dtype=torch.float32, device=q.device)
        ml = torch.empty((t * hkv * s, 2, bh), dtype=torch.float32, device=q.device)
    else:
        s, per = 1, max(1, cdiv(topk, bn))
        part = ml = out  # never written
    out_strides = out.stride()[:2]  # one stride() call a tensor: ~0.5 us each on the dev CPU
    _run(wrap(attention_kernel), (t * hkv, s), key,
         (q, kc, vc, slots, indices, block_table, token_to_req, out, part, ml,
          t, topk, nb, nreq, max_pages,
          *q.stride()[:2], *kc.stride()[:3], *vc.stride()[:3],
          slots.stride(0), indices.stride(0), block_table.stride(0), token_to_req.stride(0),
          *out_strides, per, float(softmax_scale) * float(k_scale) * LOG2E, float(v_scale)),
         dict(G=g, HKV=hkv, BLOCK_H=bh, D=d, DV=dv, PAGE=page_size, BLOCK_N=bn, SPLIT=split,
              SLOTS_INLINE=inline, K_PAIRS=k_pairs, V_PAIRS=v_pairs, F16=f16, V_PERM=v_perm, OPAQUE=opaque,
              num_warps=nw, num_stages=ns))
    if split:
        _run(wrap(merge_kernel), (t * hq,), ("merge", g, hkv, dv),
             (part, ml, out, s, *out_strides, float(v_scale)),
             dict(G=g, HKV=hkv, BLOCK_H=bh, DV=dv, S_PAD=MAX_SPLITS, num_warps=4))


@torch.library.triton_op("dsa_triton::sparse_attention_out", mutates_args={"out"})
def sparse_attention_out(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    block_table: torch.Tensor,
    token_to_req: torch.Tensor,
    softmax_scale: float,
    k_scale: float,
    v_scale: float,
    out: torch.Tensor,
) -> None:
    launch(q, k_cache, v_cache, indices, block_table, token_to_req, softmax_scale, k_scale, v_scale, out,
           wrap=torch.library.wrap_triton)


def supports(q, k_cache, v_cache, indices, block_table, token_to_req, softmax_scale, k_scale, v_scale,
             out) -> Optional[str]:
    t, hq, d = q.shape
    nb, p, hkv, dv = v_cache.shape
    for name, x in (("head dim", d), ("value head dim", dv)):
        if x < 16 or x > 256 or x & (x - 1):
            return f"{name} {x} (the Triton kernel takes a power of two from 16 to 256)"
    if hq // hkv > 128:
        return f"{hq // hkv} query heads per KV head (the Triton kernel takes at most 128)"
    if nb * p > INT32_MAX:
        return f"{nb} pages of {p} tokens: more than 2**31 - 1 slots (the slot table is int32)"
    if t * hkv >= 2**31:
        return f"{t} rows x {hkv} KV heads: 2**31 programs or more"
    if indices.shape[1] >= 2**31 - 1024:
        return f"top-k {indices.shape[1]}: 2**31 - 1024 or more (the tile count is int32)"
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        # A token's offset inside its page is int32 in the hot loop (the page's own offset is int64).
        if (p - 1) * c.stride(1) + (hkv - 1) * c.stride(2) + c.shape[3] > INT32_MAX:
            return f"{name}: one page spans 2**31 elements or more (an int32 offset inside the page)"
    return None


def warmup(q_heads: int, kv_heads: int, head_dim: int, *, page_size: int, topk: int, v_head_dim: Optional[int] = None,
           kv_dtypes=(torch.float8_e4m3fn, torch.bfloat16), device="cuda") -> list:
    """Compile every kernel specialisation a serving engine hits for these head counts and dims, both paths.

    Call before capturing CUDA graphs, so no JIT compile stalls inside a capture. The launcher specialises
    on dtypes, head counts, dims, page size, the path and the divisibility by 16 of the cache and q strides
    (row counts and metadata sizes are not specialised): contiguous caches here cover engines whose strides
    are multiples of 16 elements, as [num_blocks, P, Hkv, D] caches and their [.., 2 * D] K/V views are.
    Returns the keys it compiled (each first compile is logged with its time).
    """
    dv = v_head_dim or head_dim
    dev = torch.device(device)
    before = set(_COMPILED)
    rows = FEW_PROGRAMS // kv_heads + 1  # enough rows for the single pass's many-programs config too
    q = torch.zeros((rows, q_heads, head_dim), dtype=torch.bfloat16, device=dev)
    idx = torch.full((rows, topk), -1, dtype=torch.int32, device=dev)  # no token: the launches read no cache
    bt = torch.zeros((1, 1), dtype=torch.int32, device=dev)
    t2r = torch.zeros((rows,), dtype=torch.int32, device=dev)
    out = torch.empty((rows, q_heads, dv), dtype=torch.bfloat16, device=dev)
    for dt in kv_dtypes:
        kc = torch.zeros((1, page_size, kv_heads, head_dim), dtype=dt, device=dev)
        vc = torch.zeros((1, page_size, kv_heads, dv), dtype=dt, device=dev)
        for split, t in ((False, 1), (False, rows), (True, 1)):
            launch(q[:t], kc, vc, idx[:t], bt, t2r[:t], 1.0, 1.0, 1.0, out[:t], split=split)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return sorted(_COMPILED - before, key=str)



# ------------------------------------------------------------------------------------------------
# compile gates: what the launcher launches for 24 query / 2 KV heads, D 128, pages of 64

_ATT_SIG = {
    "q_ptr": "*bf16", "k_ptr": "*i16", "v_ptr": "*i16", "slots_ptr": "*i32", "idx_ptr": "*i32", "bt_ptr": "*i32",
    "t2r_ptr": "*i32", "out_ptr": "*bf16", "part_ptr": "*bf16", "ml_ptr": "*bf16",
    "T": "i32", "topk": "i32", "num_blocks": "i32", "num_reqs": "i32", "max_pages": "i32",
    "stride_qt": "i32", "stride_qh": "i32", "stride_kb": "i32", "stride_kp": "i32", "stride_kh": "i32",
    "stride_vb": "i32", "stride_vp": "i32", "stride_vh": "i32", "stride_st": "i32", "stride_it": "i32",
    "stride_bt": "i32", "stride_tr": "i32", "stride_ot": "i32", "stride_oh": "i32", "tiles_per_split": "i32",
    "qk_scale": "fp32", "out_scale": "fp32",
    "G": "constexpr", "HKV": "constexpr", "BLOCK_H": "constexpr", "D": "constexpr", "DV": "constexpr",
    "PAGE": "constexpr", "BLOCK_N": "constexpr", "SPLIT": "constexpr", "SLOTS_INLINE": "constexpr",
    "K_PAIRS": "constexpr", "V_PAIRS": "constexpr", "F16": "constexpr", "V_PERM": "constexpr",
    "OPAQUE": "constexpr",
}
# Ints Triton sees as multiples of 16 at launch for these shapes (cache and q strides, top-k 2048).
_ATT_DIV = ["topk", "stride_qt", "stride_qh", "stride_kb", "stride_kp", "stride_kh", "stride_vb", "stride_vp",
            "stride_vh", "stride_st", "stride_it", "stride_ot", "stride_oh"]


def _gate_attention(name, cache, split, hip=False, few=False):
    bn, nw, ns = SPLIT_CONFIG if split else (SINGLE_CONFIG_FEW if few else SINGLE_CONFIG)[cache]
    sig = dict(_ATT_SIG)
    fp8 = cache == "fp8"
    opaque = fp8 and FP8_OPAQUE and not hip
    k_pairs = fp8 and FP8_K_PAIRS and not opaque
    v_pairs = fp8 and FP8_V_PAIRS and not (FP8_V_PERM or opaque)
    sig["k_ptr"] = "*i16" if k_pairs else "*fp8e4nv" if fp8 else "*bf16"
    sig["v_ptr"] = "*i16" if v_pairs else "*fp8e4nv" if fp8 else "*bf16"
    if split:
        sig["part_ptr"] = sig["ml_ptr"] = "*fp32"
    inline = split and SPLIT_SLOTS_INLINE and not hip
    constexprs = {"G": 12, "HKV": 2, "BLOCK_H": 16, "D": 128, "DV": 128, "PAGE": 64, "BLOCK_N": bn, "SPLIT": split,
                  "SLOTS_INLINE": inline, "K_PAIRS": k_pairs, "V_PAIRS": v_pairs, "F16": fp8 and FP8_F16,
                  "V_PERM": fp8 and FP8_V_PERM, "OPAQUE": opaque}
    options = {"num_warps": nw, "num_stages": ns}
    if split or fp8:  # CUDA and ROCm launch split-K (_slots_inline) and fp8 tiles (OPAQUE) differently
        options["targets"] = ("gfx950",) if hip else ("sm_90a", "sm_100a")
    return name, attention_kernel, sig, constexprs, _ATT_DIV, options


GATE_KERNELS = [
    _gate_attention("sparse_attention_fp8", "fp8", False),
    _gate_attention("sparse_attention_fp8_few", "fp8", False, few=True),
    _gate_attention("sparse_attention_fp8_hip", "fp8", False, hip=True),
    _gate_attention("sparse_attention_bf16", "bf16", False),
    _gate_attention("sparse_attention_split_fp8", "fp8", True),
    _gate_attention("sparse_attention_split_bf16", "bf16", True),
    _gate_attention("sparse_attention_split_fp8_hip", "fp8", True, hip=True),
    _gate_attention("sparse_attention_split_bf16_hip", "bf16", True, hip=True),
    ("sparse_attention_slots", slots_kernel,
     {"idx_ptr": "*i32", "bt_ptr": "*i32", "t2r_ptr": "*i32", "slots_ptr": "*i32", "numel": "i32", "topk": "i32",
      "num_blocks": "i32", "num_reqs": "i32", "max_pages": "i32", "stride_it": "i32", "stride_bt": "i32",
      "stride_tr": "i32", "PAGE": "constexpr", "BLOCK": "constexpr"},
     {"PAGE": 64, "BLOCK": SLOT_BLOCK}, ["stride_it"]),
    ("sparse_attention_merge", merge_kernel,
     {"part_ptr": "*fp32", "ml_ptr": "*fp32", "out_ptr": "*bf16", "splits": "i32", "stride_ot": "i32",
      "stride_oh": "i32", "out_scale": "fp32", "G": "constexpr", "HKV": "constexpr", "BLOCK_H": "constexpr",
      "DV": "constexpr", "S_PAD": "constexpr"},
     {"G": 12, "HKV": 2, "BLOCK_H": 16, "DV": 128, "S_PAD": MAX_SPLITS}, ["stride_ot", "stride_oh"],
     {"num_warps": 4}),
]
