"""Which GPU provider serves the indexer scoring ops, per shape and precision mode: the one place.

The automatic order (registry.AUTO_ORDER) puts the CUDA kernels first; these rules name Triton first
where it was measured faster, and keep CUDA everywhere else (unmeasured shapes included). Forcing a
backend (DSA_OPS_BACKEND, use_backend) overrides them; a provider that declines a call is skipped by
its `supports` reason, as in the plain order.

H200 measurements (one run, q fp8 [4096, 64, 128], CUDA events, cold L2; benchmarks/bench_indexer_logits.py):

    shape                          mode     CUDA       Triton
    dense 4096 x 32768, full       fp8      3047 us    2859 us
    dense 4096 x 32768, full       exact    4375 us    ~3920 us  (Triton widens kv to fp16 once from
                                                                  8192 (row, head) pairs up, ~10% faster)
    dense 4096 x 131072, full      fp8      12169 us   12124 us
    dense 4096 x 131072, full      exact    17194 us   15523 us  (Triton: its widening sweep, another run)
    paged 64 x 65536, next_n 1     fp8      167.0 us   293.4 us
    paged 64 x 65536, next_n 1     exact    190.7 us   -

So: dense fp8 scoring goes to Triton at 64 heads from 32768 keys (from 4096 rows in the fp8 mode,
from 8192 (row, head) pairs in the exact mode); bf16 operands, other head counts and the paged op stay
on CUDA.
"""

from __future__ import annotations

from typing import Optional

import torch

# Dense rule bounds: the smallest measured shapes where Triton won.
DENSE_TRITON_HEADS = 64
DENSE_TRITON_MIN_KEYS = 32768
DENSE_TRITON_MIN_ROWS_FP8 = 4096
DENSE_TRITON_MIN_HEAD_ROWS_EXACT = 8192  # where Triton widens kv once (its WIDEN_MIN_HEAD_ROWS)

DENSE_SUMMARY = (f"triton for fp8 at {DENSE_TRITON_HEADS} heads, >= {DENSE_TRITON_MIN_KEYS} keys and "
                 f">= {DENSE_TRITON_MIN_ROWS_FP8} rows (precise=False) or >= "
                 f"{DENSE_TRITON_MIN_HEAD_ROWS_EXACT} (row, head) pairs (precise=True), else the order")
PAGED_SUMMARY = "cuda (H200 64 x 65536 fp8: 167.0 us vs triton 293.4 us), else the order"


def dense(q, kv, kv_scale, weights, ks, ke, clean, precise) -> Optional[str]:
    """The backend measured fastest for a dsa.indexer_logits call (None: the automatic order)."""
    t, h, _ = q.shape
    if q.dtype != torch.float8_e4m3fn or h != DENSE_TRITON_HEADS or kv.shape[0] < DENSE_TRITON_MIN_KEYS:
        return None
    if precise:
        return "triton" if t * h >= DENSE_TRITON_MIN_HEAD_ROWS_EXACT else None
    return "triton" if t >= DENSE_TRITON_MIN_ROWS_FP8 else None


def paged(q, kv_cache, weights, context_lens, block_table, max_context_len, clean, precise) -> Optional[str]:
    """The backend measured fastest for a dsa.paged_indexer_logits call: CUDA in both modes."""
    return "cuda"
