"""dsa.paged_indexer_logits: decode-time indexer scores over a paged fp8 key cache.

kv_cache is uint8 [num_blocks, 64, 1, D + 4]; each block's bytes hold 64 * D fp8 values (token-major)
then 64 fp32 scales. Query token i of request b (row b * next_n + i) sees logical positions
p < context_lens[b] - next_n + i + 1, found at block_table[b, p // 64], offset p % 64. Positions not
visible, past the block table, or in a block id outside the cache are -inf when `clean`.
`precise` picks the precision as in dsa.indexer_logits (fp8 MMAs by default, exact fp16 MMAs when True);
the reference is exact in both modes.
"""

from __future__ import annotations

import torch

from .. import _route, registry
from .._checks import check_flag, check_given_int, check_int, check_shape, check_tensor, check_unit_last_stride, fail
from .._define import define_op
from . import _indexer_choice
from .indexer_logits import head_weighted_relu_scores

NAME = "paged_indexer_logits"
SCHEMA = ("(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, Tensor block_table, *, "
          "int max_context_len, bool clean=True, bool precise=False) -> Tensor")
BLOCK = 64


def validate(q, kv_cache, weights, context_lens, block_table, max_context_len, clean, precise):
    check_tensor(NAME, "q", q, dtypes=torch.float8_e4m3fn, dim=4)
    check_unit_last_stride(NAME, "q", q)
    b, next_n, h, d = q.shape
    check_tensor(NAME, "kv_cache", kv_cache, dtypes=torch.uint8, dim=4, device_like=q)
    check_shape(NAME, "kv_cache", kv_cache, (None, BLOCK, 1, d + 4))
    if not kv_cache[:1].is_contiguous():
        fail(NAME, f"`kv_cache` blocks must be contiguous inside (strides {kv_cache.stride()})")
    check_tensor(NAME, "weights", weights, dtypes=torch.float32, dim=2, device_like=q)
    check_shape(NAME, "weights", weights, (b * next_n, h))
    check_tensor(NAME, "context_lens", context_lens, dtypes=torch.int32, dim=1, device_like=q)
    check_shape(NAME, "context_lens", context_lens, (b,))
    check_tensor(NAME, "block_table", block_table, dtypes=torch.int32, dim=2, device_like=q)
    check_shape(NAME, "block_table", block_table, (b, None))
    check_int(NAME, "max_context_len", max_context_len, lo=0)
    check_flag(NAME, "precise", precise)


def split_cache(kv_cache, d):
    """(fp32 values [num_blocks, 64, D], fp32 scales [num_blocks, 64]) of a paged indexer cache."""
    nb = kv_cache.shape[0]
    raw = kv_cache.reshape(nb, BLOCK * (d + 4))
    vals = raw[:, : BLOCK * d].contiguous().view(torch.float8_e4m3fn).float().view(nb, BLOCK, d)
    scales = raw[:, BLOCK * d:].contiguous().view(torch.float32).view(nb, BLOCK)
    return vals, scales


def reference(q, kv_cache, weights, context_lens, block_table, max_context_len, clean, precise=False):
    """The exact scores, the oracle of both precision modes."""
    b, next_n, h, d = q.shape
    out = torch.full((b * next_n, max_context_len), float("-inf"), dtype=torch.float32, device=q.device)
    if b == 0 or max_context_len == 0 or kv_cache.shape[0] == 0:
        return out
    nb, max_blocks = kv_cache.shape[0], block_table.shape[1]
    vals, scales = split_cache(kv_cache, d)
    pos = torch.arange(max_context_len, device=q.device)
    slot = pos // BLOCK
    q32 = q.float()
    for r in range(b):
        in_table = slot < max_blocks
        page = block_table[r, slot.clamp(max=max(max_blocks - 1, 0))].long() if max_blocks else slot * 0 - 1
        ok = in_table & (page >= 0) & (page < nb)
        pg = page.clamp(0, nb - 1)
        keys, s = vals[pg, pos % BLOCK], scales[pg, pos % BLOCK]
        rows = slice(r * next_n, (r + 1) * next_n)
        logits = head_weighted_relu_scores(q32[r], keys, s, weights[rows])
        visible = pos[None, :] < (context_lens[r].long() - next_n + 1 + torch.arange(next_n, device=q.device))[:, None]
        out[rows] = torch.where(visible & ok[None, :], logits, out[rows])
    return out


def fake(q, kv_cache, weights, context_lens, block_table, max_context_len, clean, precise):
    return q.new_empty((q.shape[0] * q.shape[1], max_context_len), dtype=torch.float32)


OP = define_op(NAME, SCHEMA, validate=validate, reference=reference, fake=fake, compiled_cuda=True)
registry.set_preference(NAME, _indexer_choice.paged, _indexer_choice.PAGED_SUMMARY)


def paged_indexer_logits(q, kv_cache, weights, context_lens, block_table, *, max_context_len: int,
                         clean: bool = True, precise: bool = False) -> torch.Tensor:
    """Decode-form indexer scores over a paged fp8 cache (DeepGEMM's fp8_paged_mqa_logits contract).

    Args:
        q: float8_e4m3fn [B, next_n, H, D].
        kv_cache: uint8 [num_blocks, 64, 1, D + 4]: per block 64*D fp8 values, then 64 fp32 scales.
        weights: float32 [B * next_n, H].
        context_lens: int32 [B]. block_table: int32 [B, max_blocks].
        max_context_len: width of the output.
        clean: write -inf where a position is not visible.
        precise: False (default): FP8 tensor-core MMAs as DeepGEMM's fp8_paged_mqa_logits; every
            score within 1e-3 of its row's largest |score| of the exact fp32 result from the same fp8
            operands. True: fp8 widened exactly to fp16, fp16 MMAs, fp32 accumulation; within 1e-5 of
            the row's 2-norm (H200, 64 requests x 65536 positions, next_n 1: 167.0 -> 190.7 us).

    Returns:
        float32 [B * next_n, max_context_len].
    """
    check_flag(NAME, "precise", precise)  # torch's argument parser would read None or 0.0 as False
    check_flag(NAME, "clean", clean)
    check_given_int(NAME, "max_context_len", max_context_len)
    try:
        return torch.ops.dsa.paged_indexer_logits(q, kv_cache, weights, context_lens, block_table,
                                                  max_context_len=max_context_len, clean=clean, precise=precise)
    except RuntimeError as e:  # the router's own error behind the CUDA kernel's copy (see _route)
        raise _route.original(e) from None
