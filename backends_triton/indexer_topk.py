"""indexer_topk on the GPU: the dense route and the fused sampled-threshold path (Triton).

Both are exact: the result is the set ``topk(indexer_logits(..., precise), k, row_starts=ks,
lengths=ke - ks)`` (ranking: larger first, ties to the smaller key, NaN last or first by `nan_first`),
page-mapped when a page table is given.

Dense route: dsa.indexer_logits then dsa.topk / dsa.topk_page_table_transform, composed through
torch.ops.dsa (each served by its own provider); the [T, N] scores live only inside the call.

Fused path (no [T, N] scores; every score is computed by indexer_logits' own @triton.jit pieces with the
launcher's config, so it is bitwise the score of dsa.indexer_logits in the same mode):
  1. sample: per program (BLOCK_T rows), the scores of single keys at an odd stride over its rows' window
     hull, with a hashed phase per program, about SAMPLE keys, stored as order-preserving int32 keys;
  2. gate: per row, the sample order statistic at which about PASS_FACTOR x k of the row's keys pass;
  3. filter: the full scoring pass whose epilogue emits (score, key) for every in-window key whose
     ordered key is >= the gate into a per-row slab of `capacity` slots (one atomic per (tile, row),
     positions by a cumsum of the mask); the per-row count counts every passing key, stored or not;
  4. select: per row, the exact top-k of the slab: the k-th ordered key by a bitwise search, then ties
     at it to the smallest key ids by a second search (the top-k family's order);
  5. certify: a row is exact iff min(k, L) <= count <= capacity (L: its clipped window). Then every key
     at or above the k-th score cleared the gate and sits in the slab, or the window holds fewer than k
     keys and all were emitted. With exact=True every other row is redone by a rescan kernel (programs
     of certified rows exit at once): a radix select on the recomputed scores, RADIX_BITS per pass, then
     one emitting pass taking ties in key order. No host sync: CUDA-graph safe. exact=False skips it;
     such rows come back truncated (-1 padded, or the top-k of the first `capacity` candidates).
Routing is one function, :func:`route`: the dense route unless the fused path is bitwise it and
measured faster for the shape (no shape so far).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from . import indexer_logits as il
from .indexer_logits import load_query_tile, score_keys

# Sample keys per row (about): a gate at rank ~PASS_FACTOR * k * m / L of m samples has a relative spread
# near 1 / sqrt(that rank) (~8% at 4096 samples, k 2048, 131072 keys).
SAMPLE = 4096
# Target candidates per row as a multiple of k: 25% looser than 2 x k.
PASS_FACTOR = 2.5
# Slab capacity per row: the power of two at or above SLAB_FACTOR * k (k 2048: 8192 slots).
SLAB_FACTOR = 4
# Slab capacity in slots when set (tests force overflow with it).
CAPACITY_OVERRIDE: Optional[int] = None
# The select kernel holds one row's slab in registers.
MAX_CAPACITY = 16384
# Routing: (min rows, min keys, heads) regions where the fused path was measured faster than the dense
# route. None: H200, 4096 rows, k 2048, fp8, exact: fused 20069 / dense 12552 us at 131072 keys H 64,
# 12096 / 6627 at H 32, 6161 / 3082 at 32768 keys H 64.
FUSED_FASTER: tuple = ()
# Bits per radix pass of the rescan (32 / RADIX_BITS rescoring passes, then one emitting pass).
RADIX_BITS = 4

_KEY_NONE = tl.constexpr(-(2**31))  # a sample slot with no key: below every ordered key
_NAN_LAST = tl.constexpr(-(2**31) + 1)
_NAN_FIRST = tl.constexpr(2**31 - 1)


@triton.jit
def ordered_key(x, NAN_FIRST: tl.constexpr):
    """int32 whose signed order is the ranking order of fp32 x: -0.0 == +0.0, NaN below -inf (or above
    +inf with NAN_FIRST). The gate, the filter, the select and the rescan all rank with this."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    if NAN_FIRST:
        key = tl.where(x != x, _NAN_FIRST, key)
    else:
        key = tl.where(x != x, _NAN_LAST, key)
    return key


@triton.jit
def _rows_and_windows(pid_t, ks_ptr, ke_ptr, stride_ks, stride_ke, T, N, BLOCK_T: tl.constexpr):
    """A program's rows, their clipped windows [lo, hi) and the hull of the non-empty ones."""
    rows = pid_t.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < T
    ks = tl.load(ks_ptr + rows * stride_ks, mask=row_ok, other=0)
    ke = tl.load(ke_ptr + rows * stride_ke, mask=row_ok, other=0)
    lo = tl.minimum(tl.maximum(ks, 0), N)
    hi = tl.maximum(tl.minimum(tl.maximum(ke, 0), N), lo)
    hi = tl.where(row_ok, hi, lo)
    nonempty = hi > lo
    lo_min = tl.min(tl.where(nonempty, lo, N), axis=0)
    hi_max = tl.max(tl.where(nonempty, hi, 0), axis=0)
    return rows, row_ok, ks, lo, hi, lo_min, hi_max


@triton.jit
def _sample_kernel(
    q_ptr, kv_ptr, scale_ptr, w_ptr, ks_ptr, ke_ptr, samp_ptr,
    T, N, stride_qt, stride_qh, stride_kn, stride_s, stride_wt, stride_wh, stride_ks, stride_ke,
    SLOTS: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_SCALE: tl.constexpr, F16_MMA: tl.constexpr, SIGNS_IN_KV: tl.constexpr, NAN_FIRST: tl.constexpr,
):
    """samp[t, i]: ordered key of sample i of row t (key lo_min + phase + i * stride), _KEY_NONE where that
    key is outside the row's window or past the hull."""
    pid_t = tl.program_id(0)
    TH: tl.constexpr = BLOCK_T * H
    rows, row_ok, ks, lo, hi, lo_min, hi_max = _rows_and_windows(pid_t, ks_ptr, ke_ptr, stride_ks, stride_ke,
                                                                 T, N, BLOCK_T)
    m = tl.arange(0, TH)
    m_row = pid_t.to(tl.int64) * BLOCK_T + m // H
    m_head = m % H
    d = tl.arange(0, D)
    qt, w = load_query_tile(q_ptr, w_ptr, m_row, m_head, m_row < T, d, stride_qt, stride_qh, stride_wt,
                            stride_wh, F16_MMA, SIGNS_IN_KV)
    # Odd stride (no common factor with power-of-two periods) covering the hull in SLOTS keys or fewer.
    span = tl.maximum(hi_max - lo_min, 0).to(tl.int64)
    stride = tl.maximum(tl.cdiv(span, SLOTS), 1)
    stride = stride + 1 - (stride % 2)
    h = (pid_t.to(tl.int64) * 2654435761 + 40503) % 4294967296
    phase = (h >> 7) % stride
    taken = tl.cdiv(tl.maximum(span - phase, 0), stride)  # samples inside the hull
    nn = tl.arange(0, BLOCK_N)
    out_rows = samp_ptr + rows * SLOTS
    for tile in tl.range(0, tl.cdiv(taken, BLOCK_N)):
        i = tile * BLOCK_N + nn
        p = lo_min + phase + i.to(tl.int64) * stride  # int64: the hull end is at most N < 2**31
        p_ok = i < taken
        n = tl.where(p_ok, p, 0).to(tl.int32)
        score = score_keys(kv_ptr, scale_ptr, n, p_ok, d, qt, w, stride_kn, stride_s, H, BLOCK_T, BLOCK_N,
                           HAS_SCALE, F16_MMA, SIGNS_IN_KV)
        inside = p_ok[:, None] & (n[:, None] >= lo[None, :]) & (n[:, None] < hi[None, :])
        key = tl.where(inside, ordered_key(score, NAN_FIRST), _KEY_NONE)
        tl.store(out_rows[None, :] + i[:, None], key, mask=row_ok[None, :])
    none = tl.full((BLOCK_N, BLOCK_T), _KEY_NONE, tl.int32)
    for tile in tl.range(tl.cdiv(taken, BLOCK_N), SLOTS // BLOCK_N):
        i = tile * BLOCK_N + nn
        tl.store(out_rows[None, :] + i[:, None], none, mask=row_ok[None, :])


@triton.jit
def _gate_kernel(samp_ptr, ks_ptr, ke_ptr, gate_ptr, N, stride_ks, stride_ke, target, SLOTS: tl.constexpr):
    """gate[t]: the r-th largest sampled key of row t with r = ceil(target * m / L) (m samples, L keys), so
    that about `target` keys pass; _KEY_NONE (every key passes) when r > m or there is no sample."""
    row = tl.program_id(0).to(tl.int64)
    ks = tl.load(ks_ptr + row * stride_ks)
    ke = tl.load(ke_ptr + row * stride_ke)
    lo = tl.minimum(tl.maximum(ks, 0), N)
    hi = tl.maximum(tl.minimum(tl.maximum(ke, 0), N), lo)
    length = (hi - lo).to(tl.int64)
    x = tl.load(samp_ptr + row * SLOTS + tl.arange(0, SLOTS))
    u = x.to(tl.int64) + 2147483648  # unsigned order; _KEY_NONE -> 0, every key >= 1
    m = tl.sum((x != _KEY_NONE).to(tl.int64), axis=0)
    r = tl.maximum((target * m + length - 1) // tl.maximum(length, 1), 1)
    ans = tl.zeros((1,), tl.int64)
    for i in tl.static_range(32):  # the largest ans with count(u >= ans) >= r, bit by bit
        cand = ans | (1 << (31 - i))
        cnt = tl.sum((u[:, None] >= cand[None, :]).to(tl.int64), axis=0)
        ans = tl.where(cnt >= r, cand, ans)
    gate = tl.where((m == 0) | (r > m), 0, ans) - 2147483648
    tl.store(gate_ptr + row + tl.arange(0, 1), gate.to(tl.int32))


@triton.jit
def _filter_kernel(
    q_ptr, kv_ptr, scale_ptr, w_ptr, ks_ptr, ke_ptr, gate_ptr, count_ptr, slab_s_ptr, slab_k_ptr,
    T, N, stride_qt, stride_qh, stride_kn, stride_s, stride_wt, stride_wh, stride_ks, stride_ke,
    capacity, tiles_per_split,
    H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, HAS_SCALE: tl.constexpr,
    F16_MMA: tl.constexpr, SIGNS_IN_KV: tl.constexpr, NAN_FIRST: tl.constexpr, EMIT: tl.constexpr = 1,
):
    """indexer_logits' scoring pass whose epilogue emits the (score, key) pairs at or above each row's gate.
    EMIT 1: slab positions from one atomic per (tile, row) (any split count); 2: from a running count in
    registers, one atomic per row at the end (only when one program holds all of a row's key tiles);
    0: counts only, nothing emitted (to time the scoring pass with the gate)."""
    pid_t = tl.program_id(0)
    pid_s = tl.program_id(1)
    TH: tl.constexpr = BLOCK_T * H
    rows, row_ok, ks, lo, hi, lo_min, hi_max = _rows_and_windows(pid_t, ks_ptr, ke_ptr, stride_ks, stride_ke,
                                                                 T, N, BLOCK_T)
    gate = tl.load(gate_ptr + rows, mask=row_ok, other=0)
    m = tl.arange(0, TH)
    m_row = pid_t.to(tl.int64) * BLOCK_T + m // H
    m_head = m % H
    d = tl.arange(0, D)
    qt, w = load_query_tile(q_ptr, w_ptr, m_row, m_head, m_row < T, d, stride_qt, stride_qh, stride_wt,
                            stride_wh, F16_MMA, SIGNS_IN_KV)
    n_tiles = tl.cdiv(N, BLOCK_N)
    ts = pid_s * tiles_per_split
    te = tl.minimum(ts + tiles_per_split, n_tiles)
    a = tl.minimum(tl.maximum(lo_min // BLOCK_N, ts), te)
    b = tl.minimum(tl.maximum(tl.cdiv(hi_max, BLOCK_N), a), te)
    slab_rows = rows * capacity
    nn = tl.arange(0, BLOCK_N)
    held = tl.zeros((BLOCK_T,), tl.int32)
    for tile in tl.range(a, b):
        n = tile * BLOCK_N + nn
        n_ok = n < N
        score = score_keys(kv_ptr, scale_ptr, n, n_ok, d, qt, w, stride_kn, stride_s, H, BLOCK_T, BLOCK_N,
                           HAS_SCALE, F16_MMA, SIGNS_IN_KV)
        inside = (n[:, None] >= lo[None, :]) & (n[:, None] < hi[None, :])
        hit = (inside & (ordered_key(score, NAN_FIRST) >= gate[None, :])).to(tl.int32)  # [BLOCK_N, BLOCK_T]
        got = tl.sum(hit, axis=0)
        if EMIT == 1:
            base = tl.atomic_add(count_ptr + rows, got, mask=row_ok & (got > 0), sem="relaxed")
        else:
            base = held
        if EMIT != 0:
            pos = base[None, :] + tl.cumsum(hit, axis=0) - 1
            ok = (hit != 0) & (pos < capacity)
            at = slab_rows[None, :] + pos
            tl.store(slab_s_ptr + at, score, mask=ok)
            tl.store(slab_k_ptr + at, tl.broadcast_to(n[:, None], (BLOCK_N, BLOCK_T)), mask=ok)
        held += got
    if EMIT != 1:
        tl.atomic_add(count_ptr + rows, held, mask=row_ok & (held > 0), sem="relaxed")


@triton.jit
def _select_kernel(
    count_ptr, slab_s_ptr, slab_k_ptr, ks_ptr, ke_ptr, out_ptr, score_ptr,
    N, k, capacity, stride_ks, stride_ke, stride_o, stride_so,
    CAP: tl.constexpr, KB: tl.constexpr, EXACT: tl.constexpr, RETURN_SCORES: tl.constexpr,
    NAN_FIRST: tl.constexpr,
):
    """Row t's exact top-k of its slab, written relative to ks (any order, -1 padded). With EXACT, rows
    that fail certification are left to the rescan kernel."""
    row = tl.program_id(0).to(tl.int64)
    ks = tl.load(ks_ptr + row * stride_ks)
    ke = tl.load(ke_ptr + row * stride_ke)
    lo = tl.minimum(tl.maximum(ks, 0), N)
    hi = tl.maximum(tl.minimum(tl.maximum(ke, 0), N), lo)
    length = hi - lo
    c = tl.load(count_ptr + row)
    certified = (c <= capacity) & (c >= tl.minimum(k, length))
    if EXACT:
        go = certified
    else:
        go = c >= 0
    if go:
        held = tl.minimum(c, capacity)
        kk = tl.minimum(k, held)
        i = tl.arange(0, CAP)
        valid = i < held
        x = tl.load(slab_s_ptr + row * capacity + i, mask=valid, other=0.0)
        j = tl.load(slab_k_ptr + row * capacity + i, mask=valid, other=0)
        u = tl.where(valid, ordered_key(x, NAN_FIRST).to(tl.int64) + 2147483648, -1)
        v = tl.zeros((1,), tl.int64)
        for b in tl.static_range(32):  # v: the kk-th largest u
            cand = v | (1 << (31 - b))
            cnt = tl.sum((u[:, None] >= cand[None, :]).to(tl.int32), axis=0)
            v = tl.where(cnt >= kk, cand, v)
        v = tl.sum(v, axis=0)
        gt = u > v  # none when kk == 0: v is then 2**32 - 1
        need = kk - tl.sum(gt.to(tl.int32), axis=0)
        eq = valid & (u == v) & ((tl.zeros((CAP,), tl.int32) + need) > 0)
        cut = tl.zeros((1,), tl.int32)
        if tl.sum(eq.to(tl.int32), axis=0) > need:  # more ties than places: the smallest keys
            for b in tl.static_range(31):  # cut: the largest value with count(eq & j < cut) < need
                cand_j = cut | (1 << (30 - b))
                cnt = tl.sum((eq[:, None] & (j[:, None] < cand_j[None, :])).to(tl.int32), axis=0)
                cut = tl.where(cnt < need, cand_j, cut)
        else:
            cut = cut + 2147483647
        cut = tl.sum(cut, axis=0)
        sel = (gt | (eq & (j <= cut))) & valid
        pos = tl.cumsum(sel.to(tl.int32), axis=0) - 1
        rel = (j.to(tl.int64) - ks).to(tl.int32)
        tl.store(out_ptr + row * stride_o + pos, rel, mask=sel)
        col = tl.arange(0, KB)
        pad = (col >= kk) & (col < k)
        tl.store(out_ptr + row * stride_o + col, tl.full((KB,), -1, tl.int32), mask=pad)
        if RETURN_SCORES:
            tl.store(score_ptr + row * stride_so + pos, x, mask=sel)
            tl.store(score_ptr + row * stride_so + col, tl.full((KB,), float("-inf"), tl.float32), mask=pad)


@triton.jit
def _rescan_kernel(
    q_ptr, kv_ptr, scale_ptr, w_ptr, ks_ptr, ke_ptr, count_ptr, out_ptr, score_ptr,
    T, N, k, capacity, stride_qt, stride_qh, stride_kn, stride_s, stride_wt, stride_wh, stride_ks, stride_ke,
    stride_o, stride_so,
    H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, HAS_SCALE: tl.constexpr,
    F16_MMA: tl.constexpr, SIGNS_IN_KV: tl.constexpr, NAN_FIRST: tl.constexpr, RETURN_SCORES: tl.constexpr,
    BITS: tl.constexpr,
):
    """The exact top-k of the rows that failed certification, from recomputed scores (bitwise the
    filter's): 32 / BITS counting passes find the k-th ordered key v and the count above it, then one
    pass emits every key above v and the ties at v in ascending key order. Other programs exit at once."""
    pid_t = tl.program_id(0)
    TH: tl.constexpr = BLOCK_T * H
    rows, row_ok, ks, lo, hi, lo_min, hi_max = _rows_and_windows(pid_t, ks_ptr, ke_ptr, stride_ks, stride_ke,
                                                                 T, N, BLOCK_T)
    length = hi - lo
    c = tl.load(count_ptr + rows, mask=row_ok, other=0)
    kk = tl.minimum(k, length)
    failed = row_ok & ((c > capacity) | (c < kk))
    if tl.sum(failed.to(tl.int32), axis=0) > 0:
        m = tl.arange(0, TH)
        m_row = pid_t.to(tl.int64) * BLOCK_T + m // H
        m_head = m % H
        d = tl.arange(0, D)
        qt, w = load_query_tile(q_ptr, w_ptr, m_row, m_head, m_row < T, d, stride_qt, stride_qh, stride_wt,
                                stride_wh, F16_MMA, SIGNS_IN_KV)
        a = lo_min // BLOCK_N
        b = tl.maximum(tl.cdiv(hi_max, BLOCK_N), a)
        nn = tl.arange(0, BLOCK_N)
        R: tl.constexpr = 1 << BITS
        digit = tl.arange(0, R) + 1  # candidates ans + digit << shift, digit 1..R (R: the count above)
        ans = tl.zeros((BLOCK_T,), tl.int64)
        above = tl.zeros((BLOCK_T,), tl.int32)
        for p in tl.static_range(32 // BITS):
            shift = 32 - BITS * (p + 1)
            cand = ans[:, None] + (digit[None, :].to(tl.int64) << shift)  # [BLOCK_T, R]
            ge = tl.zeros((BLOCK_T, R), tl.int32)
            for tile in tl.range(a, b):
                n = tile * BLOCK_N + nn
                n_ok = n < N
                score = score_keys(kv_ptr, scale_ptr, n, n_ok, d, qt, w, stride_kn, stride_s, H, BLOCK_T, BLOCK_N,
                                   HAS_SCALE, F16_MMA, SIGNS_IN_KV)
                inside = (n[:, None] >= lo[None, :]) & (n[:, None] < hi[None, :])
                u = tl.where(inside, ordered_key(score, NAN_FIRST).to(tl.int64) + 2147483648, -1)
                ge += tl.sum((u[:, :, None] >= cand[None, :, :]).to(tl.int32), axis=0)
            best = tl.sum(((ge >= kk[:, None]) & (digit[None, :] < R)).to(tl.int32), axis=1)
            above = tl.sum(tl.where(digit[None, :] == best[:, None] + 1, ge, 0), axis=1)
            ans = ans + (best.to(tl.int64) << shift)
        # ans: the kk-th largest ordered key; `above`: keys strictly above it (the last pass's count).
        need = kk - above
        taken = tl.zeros((BLOCK_T,), tl.int32)
        ties = tl.zeros((BLOCK_T,), tl.int32)
        out_rows = out_ptr + rows * stride_o
        score_rows = score_ptr + rows * stride_so
        for tile in tl.range(a, b):
            n = tile * BLOCK_N + nn
            n_ok = n < N
            score = score_keys(kv_ptr, scale_ptr, n, n_ok, d, qt, w, stride_kn, stride_s, H, BLOCK_T, BLOCK_N,
                               HAS_SCALE, F16_MMA, SIGNS_IN_KV)
            inside = (n[:, None] >= lo[None, :]) & (n[:, None] < hi[None, :]) & failed[None, :]
            u = tl.where(inside, ordered_key(score, NAN_FIRST).to(tl.int64) + 2147483648, -1)
            eq = ((u == ans[None, :]) & inside).to(tl.int32)
            rank = ties[None, :] + tl.cumsum(eq, axis=0)
            take = ((u > ans[None, :]) & inside) | ((eq != 0) & (rank <= need[None, :]))
            pos = taken[None, :] + tl.cumsum(take.to(tl.int32), axis=0) - 1
            rel = (n.to(tl.int64)[:, None] - ks[None, :]).to(tl.int32)
            tl.store(out_rows[None, :] + pos, rel, mask=take)
            if RETURN_SCORES:
                tl.store(score_rows[None, :] + pos, score, mask=take)
            ties += tl.sum(eq, axis=0)
            taken += tl.sum(take.to(tl.int32), axis=0)
        # Slots kk..k-1 (windows shorter than k): -1.
        for c0 in tl.range(0, tl.max(tl.where(failed, k - kk, 0), axis=0), BLOCK_N):
            col = kk[None, :] + c0 + nn[:, None]
            pad = failed[None, :] & (col < k)
            tl.store(out_rows[None, :] + col, tl.full((BLOCK_N, BLOCK_T), -1, tl.int32), mask=pad)
            if RETURN_SCORES:
                tl.store(score_rows[None, :] + col, tl.full((BLOCK_N, BLOCK_T), float("-inf"), tl.float32),
                         mask=pad)


def capacity_for(k: int) -> int:
    """Slab slots per row for k (a power of two; CAPACITY_OVERRIDE when set)."""
    if CAPACITY_OVERRIDE is not None:
        return int(CAPACITY_OVERRIDE)
    return triton.next_power_of_2(max(SLAB_FACTOR * k, 16))


def _plan(q, kv, kv_scale, precise):
    """indexer_logits.launch's choices for this call (widening, config), so every score is its score."""
    t, h, _ = q.shape
    f16_mma = q.dtype == torch.float8_e4m3fn and bool(precise)
    has_scale = kv_scale is not None
    widened = f16_mma and has_scale and t * h >= il.WIDEN_MIN_HEAD_ROWS
    sms, major = il._device_info(q.device.index) if q.device.type == "cuda" else (132, 0)
    cfg = il.config(h, sixteen_bit=widened or q.dtype == torch.bfloat16, sm90=major == 9)
    return f16_mma, has_scale, widened, cfg, sms


def fused_stages(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table=None, page_size=64,
                 row_to_batch=None, page_table_row_starts=None, return_scores=False, nan_first=False, *,
                 counts=None, wrap=None, emit=None):
    """The fused path as ([(stage name, launch)], {"out", "scores"}): each launch runs one kernel on buffers
    allocated here, in order. `emit` forces the filter's EMIT mode (None: 2 with one key split, else 1)."""
    t, h, d = q.shape
    n = kv.shape[0]
    dev = q.device
    out = torch.empty((t, k), dtype=torch.int32, device=dev)
    scores = torch.empty((t, k if return_scores else 0), dtype=torch.float32, device=dev)
    result = {"out": out, "scores": scores}
    if t == 0:
        return [], result
    cap = capacity_for(k)
    if cap > MAX_CAPACITY:
        raise ValueError(f"dsa.indexer_topk fused path: k={k} needs a slab of {cap} slots (at most {MAX_CAPACITY})")
    f16_mma, has_scale, widened, (bt, bn, nw, ns), sms = _plan(q, kv, kv_scale, precise)
    w = (lambda f: f) if wrap is None else wrap
    holder = {"kv": kv}
    scale = kv_scale if has_scale else weights
    s_stride = kv_scale.stride(0) if has_scale else 0
    common = (q.stride(0), q.stride(1), kv.stride(0) if not widened else d, s_stride, weights.stride(0),
              weights.stride(1), ks.stride(0), ke.stride(0))
    meta = dict(H=h, D=d, BLOCK_T=bt, BLOCK_N=bn, HAS_SCALE=has_scale, F16_MMA=f16_mma, SIGNS_IN_KV=widened,
                NAN_FIRST=bool(nan_first))
    row_tiles = triton.cdiv(t, bt)
    slots = max(bn, min(SAMPLE, triton.next_power_of_2(max(n, 1))))
    samp = torch.empty((t, slots), dtype=torch.int32, device=dev)
    gate = torch.empty((t,), dtype=torch.int32, device=dev)
    count = counts if counts is not None else torch.empty((t,), dtype=torch.int32, device=dev)
    slab_s = torch.empty((t, cap), dtype=torch.float32, device=dev)
    slab_k = torch.empty((t, cap), dtype=torch.int32, device=dev)
    key_tiles = triton.cdiv(n, bn)
    splits = il.split_count(row_tiles, key_tiles, sms)
    per_split = triton.cdiv(key_tiles, splits)
    splits = triton.cdiv(key_tiles, per_split)
    mode = (2 if splits == 1 else 1) if emit is None else int(emit)
    if mode == 2 and splits != 1:
        raise ValueError(f"emit=2 needs one key split, got {splits}")
    target = max(1, math.ceil(PASS_FACTOR * k))
    kb = triton.next_power_of_2(k)
    stages = []
    if widened:
        stages.append(("widen", lambda: holder.__setitem__("kv", il.widen_kv(kv, kv_scale, wrap))))
    stages.append(("sample", lambda: w(_sample_kernel)[(row_tiles,)](
        q, holder["kv"], scale, weights, ks, ke, samp, t, n, *common, SLOTS=slots, **meta, num_warps=nw,
        num_stages=ns)))
    stages.append(("gate", lambda: w(_gate_kernel)[(t,)](
        samp, ks, ke, gate, n, ks.stride(0), ke.stride(0), target, SLOTS=slots,
        num_warps=4 if slots <= 2048 else 8)))
    stages.append(("zero", lambda: count.zero_()))
    stages.append(("filter", lambda: w(_filter_kernel)[(row_tiles, splits)](
        q, holder["kv"], scale, weights, ks, ke, gate, count, slab_s, slab_k, t, n, *common, cap, per_split,
        **meta, EMIT=mode, num_warps=nw, num_stages=ns)))
    stages.append(("select", lambda: w(_select_kernel)[(t,)](
        count, slab_s, slab_k, ks, ke, out, scores, n, k, cap, ks.stride(0), ke.stride(0), out.stride(0),
        scores.stride(0) if return_scores else 0, CAP=cap, KB=kb, EXACT=bool(exact),
        RETURN_SCORES=bool(return_scores), NAN_FIRST=bool(nan_first),
        num_warps=4 if cap <= 2048 else (8 if cap <= 4096 else 16))))
    if exact:
        stages.append(("rescan", lambda: w(_rescan_kernel)[(row_tiles,)](
            q, holder["kv"], scale, weights, ks, ke, count, out, scores, t, n, k, cap, *common, out.stride(0),
            scores.stride(0) if return_scores else 0, **meta, RETURN_SCORES=bool(return_scores),
            BITS=RADIX_BITS, num_warps=nw, num_stages=ns)))
    if page_table is not None:
        stages.append(("page_map", lambda: result.__setitem__("out", torch.ops.dsa.page_table_transform(
            out, page_table, row_to_batch=row_to_batch, page_table_row_starts=page_table_row_starts,
            page_size=page_size))))
    return stages, result


def launch_fused(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table=None, page_size=64,
                 row_to_batch=None, page_table_row_starts=None, return_scores=False, nan_first=False, *,
                 counts=None, wrap=None, emit=None):
    """The fused path (arguments validated by the op). `counts`, an int32 [T] tensor when given, receives
    each row's candidate count (keys at or above its gate; more than the capacity means overflow)."""
    stages, result = fused_stages(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table, page_size,
                                  row_to_batch, page_table_row_starts, return_scores, nan_first, counts=counts,
                                  wrap=wrap, emit=emit)
    for _, run in stages:
        run()
    return result["out"], result["scores"]


def _window_lengths(ks, ke):
    """ke - ks without int32 overflow, clamped to [0, 2**31 - 1] (a negative length is 0)."""
    return (ke.long() - ks.long()).clamp_(0, 2**31 - 1).to(torch.int32)


def launch_dense(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table=None, page_size=64,
                 row_to_batch=None, page_table_row_starts=None, return_scores=False, nan_first=False):
    """The dense route: dsa.indexer_logits, then dsa.topk (or dsa.topk_page_table_transform), each through
    its own provider; the selected scores by a gather. The same result as calling those ops."""
    logits = torch.ops.dsa.indexer_logits(q, kv, kv_scale, weights, ks, ke, clean=True, precise=precise)
    lengths = _window_lengths(ks, ke)
    extra = {"nan_first": True} if nan_first else {}
    t, n = logits.shape
    if page_table is not None and not return_scores:
        out = torch.ops.dsa.topk_page_table_transform(
            logits, page_table, lengths, k, row_starts=ks, page_table_row_starts=page_table_row_starts,
            row_to_batch=row_to_batch, page_size=page_size, **extra)
        return out, logits.new_empty((t, 0))
    rel = torch.ops.dsa.topk(logits, k, lengths=lengths, row_starts=ks, **extra)
    if return_scores:
        col = (rel.long() + ks.long()[:, None]).clamp_(0, max(n - 1, 0))
        picked = logits.gather(1, col) if n else torch.zeros_like(rel, dtype=torch.float32)
        scores = torch.where(rel >= 0, picked, torch.full_like(picked, float("-inf")))
    else:
        scores = logits.new_empty((t, 0))
    if page_table is not None:
        rel = torch.ops.dsa.page_table_transform(rel, page_table, row_to_batch=row_to_batch,
                                                 page_table_row_starts=page_table_row_starts, page_size=page_size)
    return rel, scores


def fused_declines(q, kv, k) -> Optional[str]:
    """Why the fused path cannot take this call (None when it can)."""
    why = il.supports(q, kv, None, None, None, None, True, False)
    if why is not None:
        return why
    if capacity_for(k) > MAX_CAPACITY:
        return f"k={k} needs a slab of {capacity_for(k)} slots (at most {MAX_CAPACITY})"
    return None


def _logits_backend(q, kv, kv_scale, weights, ks, ke, precise) -> Optional[str]:
    """The backend dsa.indexer_logits picks for these arguments (None when none serves them)."""
    from dsa_ops import registry

    args = _schema_args("indexer_logits", q=q, kv=kv, kv_scale=kv_scale, weights=weights, ks=ks, ke=ke,
                        clean=True, precise=precise)
    try:
        return registry.select_on("indexer_logits", q.device, args).backend
    except registry.DispatchError:
        return None


def route(q, kv, kv_scale, weights, ks, ke, k, exact=True, precise=False, *rest) -> str:
    """"fused" or "dense" for a call: the one routing rule. The fused path is taken only where it is
    both bitwise the dense route (dsa.indexer_logits is served by the Triton kernel whose arithmetic it
    shares) and measured faster (a FUSED_FASTER region); everything else goes dense."""
    t, h = q.shape[0], q.shape[1]
    n = kv.shape[0]
    if not any(t >= rt and n >= rn and h == rh for rt, rn, rh in FUSED_FASTER):
        return "dense"
    if fused_declines(q, kv, k) is not None:
        return "dense"
    if _logits_backend(q, kv, kv_scale, weights, ks, ke, precise) != "triton":
        return "dense"
    return "fused"


def launch(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table, page_size, row_to_batch,
           page_table_row_starts, return_scores, nan_first=False):
    """Provider fn of dsa.indexer_topk (schema order): the path :func:`route` names."""
    args = (q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table, page_size, row_to_batch,
            page_table_row_starts, return_scores, nan_first)
    if route(*args) == "fused":
        return launch_fused(*args)
    return launch_dense(*args)


def _schema_args(op: str, **given) -> tuple:
    """Positional arguments of dsa.<op> in schema order: `given` by name, defaults for the rest."""
    schema = getattr(torch.ops.dsa, op).default._schema
    return tuple(given[a.name] if a.name in given else a.default_value for a in schema.arguments)


def _missing_provider(device, steps) -> Optional[str]:
    """Why one of the (op, arguments) steps has no provider on `device` (None when each has one)."""
    from dsa_ops import registry

    for op, args in steps:
        try:
            registry.select_on(op, device, args)
        except registry.DispatchError as e:
            return f"dsa.{op} has no provider for this call: {str(e).splitlines()[1].strip()}"
    return None


def supports(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table, page_size, row_to_batch,
             page_table_row_starts, return_scores, nan_first=False) -> Optional[str]:
    """None when this provider serves the call, by the path :func:`route` names. The fused path needs
    only Triton; the dense route needs providers of dsa.indexer_logits and dsa.topk (checked on the
    shapes, through the registry, so a forced backend without a top-k kernel declines here)."""
    if route(q, kv, kv_scale, weights, ks, ke, k, exact, precise) == "fused":
        return None
    t, n = q.shape[0], kv.shape[0]
    scores = torch.empty((t, n), dtype=torch.float32, device="meta")
    steps = [("indexer_logits", _schema_args("indexer_logits", q=q, kv=kv, kv_scale=kv_scale, weights=weights,
                                             ks=ks, ke=ke, clean=True, precise=precise)),
             ("topk", _schema_args("topk", scores=scores, k=k, lengths=ks, row_starts=ks))]
    why = _missing_provider(q.device, steps)
    return None if why is None else f"dense route: {why}"


_PTR_TYPES = {"q_ptr": "*fp8e4nv", "kv_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "w_ptr": "*fp32",
              "slab_s_ptr": "*fp32", "score_ptr": "*fp32"}  # every other pointer: int32


def _gate(name, fn, constexprs, options):
    sig = {}
    for a in fn.arg_names:
        if a in constexprs:
            sig[a] = "constexpr"
        elif a.endswith("_ptr"):
            sig[a] = _PTR_TYPES.get(a, "*i32")
        else:
            sig[a] = "i32"
    return name, fn, sig, constexprs, [], options


def _gate_kernels(h=64):
    """The fused path's kernels for the compile gates: fp8, D 128, the default mode's config at h heads."""
    bt, bn, nw, ns = il.config(h)
    score = dict(H=h, D=128, BLOCK_T=bt, BLOCK_N=bn, HAS_SCALE=True, F16_MMA=False, SIGNS_IN_KV=False,
                 NAN_FIRST=False)
    opts = {"num_warps": nw, "num_stages": ns}
    cap = capacity_for(2048)
    return [
        _gate(f"indexer_topk_sample_h{h}", _sample_kernel, dict(score, SLOTS=SAMPLE), opts),
        _gate("indexer_topk_gate", _gate_kernel, dict(SLOTS=SAMPLE), {"num_warps": 8}),
        _gate(f"indexer_topk_filter_h{h}", _filter_kernel, score, opts),
        _gate("indexer_topk_select_k2048", _select_kernel,
              dict(CAP=cap, KB=2048, EXACT=True, RETURN_SCORES=True, NAN_FIRST=False), {"num_warps": 16}),
        _gate(f"indexer_topk_rescan_h{h}", _rescan_kernel, dict(score, RETURN_SCORES=True, BITS=RADIX_BITS), opts),
    ]


# For the compile gates: the kernels launch_fused runs for fp8 at 64 heads (k 2048's slab), default mode.
GATE_KERNELS: list = _gate_kernels(64)
