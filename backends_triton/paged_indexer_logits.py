"""paged_indexer_logits in Triton: decode-time indexer scores over a paged fp8 key cache.

Same scheme as ``indexer_logits`` (q stationary, keys streamed, keys as the MMA M dimension, heads
reduced inside the accumulator's quads). A program owns BLOCK_T query tokens of one request and one
split of the request's positions; each key tile is exactly one cache block (64 positions): one scalar
block_table lookup, then 64*D contiguous fp8 bytes and 64 fp32 scales from that block.

Visibility: token i of request b (output row b*next_n + i) sees p < context_lens[b] - next_n + i + 1.
Positions past the block table, in a block id < 0 or >= num_blocks, or not visible are -inf (when
`clean`); the loads of an invalid block are masked off, so nothing outside the cache is read.
Grid: axis 0 = requests x token groups (unbounded), axis 1 = position splits.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ._launch import cdiv, next_pow2
from .indexer_logits import _sm_count, config, split_count

BLOCK = 64  # positions per cache block (fixed by the layout)


@triton.jit
def paged_indexer_logits_kernel(
    q_ptr,  # fp8 [B, next_n, H, D], unit last stride
    cache_ptr,  # uint8 [num_blocks, 64, 1, D + 4]; block b at b * stride_blk bytes
    w_ptr,  # fp32 [B * next_n, H]
    ctx_ptr,  # int32 [B]
    bt_ptr,  # int32 [B, max_blocks]
    out_ptr,  # fp32 [B * next_n, L], rows of stride stride_ot
    next_n,
    L,
    num_blocks,
    max_blocks,
    groups,  # token groups of BLOCK_T per request
    stride_qb,
    stride_qn,
    stride_qh,
    stride_blk,
    stride_wt,
    stride_wh,
    stride_ctx,
    stride_btb,
    stride_bts,
    stride_ot,
    tiles_per_split,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    CLEAN: tl.constexpr,
    F16_MMA: tl.constexpr,  # widen fp8 to fp16 before the MMA: the op's precise=True (else fp8 MMAs)
):
    KB: tl.constexpr = 64
    TH: tl.constexpr = BLOCK_T * H
    pid = tl.program_id(0)
    pid_s = tl.program_id(1)
    req = pid // groups
    g = pid - req * groups

    # ---- rows (tokens) of this program ---------------------------------------------------------
    tok = g * BLOCK_T + tl.arange(0, BLOCK_T)  # token index i inside the request
    tok_ok = tok < next_n
    rows = req.to(tl.int64) * next_n + tok  # output rows
    ctx = tl.load(ctx_ptr + req.to(tl.int64) * stride_ctx)
    lim = max_blocks.to(tl.int64) * KB
    hi = ctx.to(tl.int64) - next_n + tok + 1  # visible positions [0, hi)
    hi = tl.minimum(tl.maximum(hi, 0), tl.minimum(lim, L))
    hi = tl.where(tok_ok, hi, 0).to(tl.int32)
    hi_max = tl.max(hi, axis=0)

    m = tl.arange(0, TH)
    m_tok = g * BLOCK_T + m // H
    m_head = (m % H).to(tl.int64)  # head x head stride can pass 2^31 (a head-major q)
    m_ok = m_tok < next_n
    m_row = req.to(tl.int64) * next_n + m_tok
    w = tl.load(w_ptr + m_row * stride_wt + m_head * stride_wh, mask=m_ok, other=0.0)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (req.to(tl.int64) * stride_qb + m_tok.to(tl.int64) * stride_qn
                         + m_head * stride_qh)[:, None] + d[None, :], mask=m_ok[:, None], other=0.0)
    if F16_MMA:
        q = q.to(tl.float16)
    qt = tl.trans(q)  # [D, TH]

    # ---- this split's blocks [ts, te); computed: [ts, b) ------------------------------------------
    n_tiles = tl.cdiv(L, KB)
    ts = pid_s * tiles_per_split
    te = tl.minimum(ts + tiles_per_split, n_tiles)
    b = tl.minimum(tl.maximum(tl.cdiv(hi_max, KB), ts), te)

    out_rows = out_ptr + rows * stride_ot
    p = tl.arange(0, KB)
    bt_row = bt_ptr + req.to(tl.int64) * stride_btb
    for tile in tl.range(ts, b):
        page = tl.load(bt_row + tile * stride_bts)  # tile < max_blocks here
        ok = (page >= 0) & (page < num_blocks)
        # (a block mask, every row of a valid page: Triton 3.9's interpreter mistypes a scalar one)
        rows_ok = p < tl.where(ok, KB, 0)
        base = cache_ptr + tl.where(ok, page, 0).to(tl.int64) * stride_blk
        kv = tl.load(base + p[:, None] * D + d[None, :], mask=rows_ok[:, None], other=0)
        kv = kv.to(tl.float8e4nv, bitcast=True)
        if F16_MMA:
            kv = kv.to(tl.float16)
        s = tl.load((base + KB * D + p * 4).to(tl.pointer_type(tl.float32)), mask=rows_ok, other=0.0)
        acc = tl.dot(kv, qt, out_dtype=tl.float32)  # [KB, TH]
        acc = tl.maximum(acc * s[:, None], 0.0) * w[None, :]
        score = tl.sum(tl.reshape(acc, (KB, BLOCK_T, H)), axis=2)  # [KB, BLOCK_T]
        n = tile * KB + p
        score = tl.where((n[:, None] < hi[None, :]) & ok, score, float("-inf"))
        tl.store(out_rows[None, :] + n[:, None], score, mask=(n < L)[:, None] & tok_ok[None, :])

    if CLEAN:
        ninf = tl.full((KB, BLOCK_T), float("-inf"), tl.float32)
        for tile in tl.range(b, te):
            n = tile * KB + p
            tl.store(out_rows[None, :] + n[:, None], ninf, mask=(n < L)[:, None] & tok_ok[None, :])


def launch(q, kv_cache, weights, context_lens, block_table, max_context_len, clean, precise, *, out=None,
           wrap=None):
    """Functional kernel form of dsa::paged_indexer_logits (arguments already validated by the op)."""
    bsz, next_n, h, d = q.shape
    L = int(max_context_len)
    if out is None:
        out = torch.empty((bsz * next_n, L), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out
    nb, max_blocks = kv_cache.shape[0], block_table.shape[1]
    if nb == 0 or max_blocks == 0:
        out.fill_(float("-inf"))
        return out
    bt_cfg, _, nw, ns = config(h)
    bt = max(1, min(bt_cfg, next_pow2(next_n)))
    groups = cdiv(next_n, bt)
    row_tiles = bsz * groups
    key_tiles = cdiv(L, BLOCK)
    splits = split_count(row_tiles, key_tiles, _sm_count(q.device.index) if q.device.type == "cuda" else 132)
    per_split = cdiv(key_tiles, splits)
    splits = cdiv(key_tiles, per_split)
    kernel = paged_indexer_logits_kernel if wrap is None else wrap(paged_indexer_logits_kernel)
    kernel[(row_tiles, splits)](
        q, kv_cache, weights, context_lens, block_table, out,
        next_n, L, nb, max_blocks, groups,
        q.stride(0), q.stride(1), q.stride(2), kv_cache.stride(0),
        weights.stride(0), weights.stride(1), context_lens.stride(0),
        block_table.stride(0), block_table.stride(1), out.stride(0),
        per_split,
        H=h, D=d, BLOCK_T=bt, CLEAN=bool(clean),
        F16_MMA=bool(precise),
        num_warps=nw, num_stages=ns,
    )
    return out


@torch.library.triton_op("dsa_triton::paged_indexer_logits", mutates_args=())
def paged_indexer_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    clean: bool,
    precise: bool,
) -> torch.Tensor:
    return launch(q, kv_cache, weights, context_lens, block_table, max_context_len, clean, precise,
                  wrap=torch.library.wrap_triton)


def supports(q, kv_cache, weights, context_lens, block_table, max_context_len, clean, precise) -> Optional[str]:
    h, d = q.shape[2], q.shape[3]
    if d not in (64, 128):
        return f"head dim {d} (the Triton kernel takes D 64 or 128)"
    if h & (h - 1) or h > 128:
        return f"{h} heads (the Triton kernel takes a power of two up to 128)"
    if kv_cache.stride(0) % 4 or kv_cache.data_ptr() % 4:
        return (f"kv_cache's data or block stride ({kv_cache.stride(0)} bytes) is not 4-byte aligned "
                "(its fp32 scales are loaded as fp32)")
    if max_context_len >= 2**31 - 2 * BLOCK:
        return "max_context_len of 2**31 or more"
    return None


# For the compile gates: next_n = 1 (BLOCK_T 1) and next_n = 2 at H = 64, D = 128; fp16 MMAs (precise) and
# fp8 MMAs (the default).
_SIG = {
    "q_ptr": "*fp8e4nv", "cache_ptr": "*u8", "w_ptr": "*fp32", "ctx_ptr": "*i32", "bt_ptr": "*i32",
    "out_ptr": "*fp32", "next_n": "i32", "L": "i32", "num_blocks": "i32", "max_blocks": "i32",
    "groups": "i32", "stride_qb": "i32", "stride_qn": "i32", "stride_qh": "i32", "stride_blk": "i32",
    "stride_wt": "i32", "stride_wh": "i32", "stride_ctx": "i32", "stride_btb": "i32", "stride_bts": "i32",
    "stride_ot": "i32", "tiles_per_split": "i32",
    "H": "constexpr", "D": "constexpr", "BLOCK_T": "constexpr", "CLEAN": "constexpr", "F16_MMA": "constexpr",
}
_DIV = ["L", "stride_qb", "stride_qn", "stride_qh", "stride_blk"]
GATE_KERNELS = [
    ("paged_indexer_logits_n1", paged_indexer_logits_kernel, _SIG,
     {"H": 64, "D": 128, "BLOCK_T": 1, "CLEAN": True, "F16_MMA": True}, _DIV),
    ("paged_indexer_logits_n2", paged_indexer_logits_kernel, _SIG,
     {"H": 64, "D": 128, "BLOCK_T": 2, "CLEAN": True, "F16_MMA": True}, _DIV),
    ("paged_indexer_logits_fp8mma_n1", paged_indexer_logits_kernel, _SIG,
     {"H": 64, "D": 128, "BLOCK_T": 1, "CLEAN": True, "F16_MMA": False}, _DIV),
    ("paged_indexer_logits_fp8mma_n2", paged_indexer_logits_kernel, _SIG,
     {"H": 64, "D": 128, "BLOCK_T": 2, "CLEAN": True, "F16_MMA": False}, _DIV),
]
