"""Which GPU provider serves the indexer scoring ops, per shape: the one place.

The automatic order (registry.AUTO_ORDER) puts the CUDA kernels first; these rules name Triton first
where it was measured faster, and keep CUDA everywhere else (unmeasured shapes included). Forcing a
backend (DSA_OPS_BACKEND, use_backend) overrides them; a provider that declines a call is skipped by
its `supports` reason, as in the plain order.

H200, one run (benchmarks/bench_indexer_logits.py, 2026-12-04, commit 64c6640, CUDA events, cold L2), 4096 query
rows, times in us, CUDA / Triton. CUDA is the launcher's default: the TMA kernel (4 math warpgroups) for fp8 with
precise=False, the cp.async kernel for bf16:

    keys     heads  dtype  windows  precise=False
    131072   64     fp8    full      8974.0 / 11934.1
    131072   64     fp8    causal    8873.8 / 12043.0
    32768    64     fp8    full      2199.0 /  3143.8
    32768    64     fp8    causal    2049.1 /  2810.5
    32768    32     fp8    full      1179.7 /  1508.2
    32768    64     bf16   full      4466.3 /  3813.8   (bf16: one mode)

fp8 with precise=True, CUDA's TMA kernel in the exact mode (config 4, the launcher's default there when kv rows do
not overlap) / its cp.async kernel / Triton, one run (2026-12-05, DSA_BENCH_SWEEP=1 ... -k dense_precise_sweep):

    131072   64     fp8    causal   14361.4 / 16929.2 / 15457.8
    32768    64     fp8    full      3776.1 /  4396.4 /  3912.2
    32768    64     fp8    causal    3534.0 /  4155.2 /  3742.2
    32768    32     fp8    full      2017.0 /  2380.7 /  2124.5

    paged, 64 requests x 65536, next_n 1, H 64 (commit ebe61f3): fp8 CUDA 138.0 us, Triton 287.5 us (precise:
    169.8 / 317.4); also faster on CUDA: next_n 2, H 32, 4 requests, 1 request of next_n 2.

So: bf16 dense scoring, and fp8 in the exact mode where kv rows overlap (the TMA kernel cannot map them; the
cp.async kernel is slower than Triton), go to Triton from 4096 rows and 32768 keys at 32 or 64 heads (every
measured row); fp8 otherwise, the paged op and every unmeasured shape stay on CUDA.
"""

from __future__ import annotations

from typing import Optional

import torch

# Dense rule bounds: the measured region where Triton won every row of the exact-product modes.
DENSE_TRITON_HEADS = (32, 64)
DENSE_TRITON_MIN_KEYS = 32768
DENSE_TRITON_MIN_ROWS = 4096

DENSE_SUMMARY = (f"fp8: cuda (precise=True: its TMA kernel, H200 4-7% faster than triton); bf16, or fp8 precise=True "
                 f"with overlapping kv rows: triton from {DENSE_TRITON_MIN_ROWS} rows and {DENSE_TRITON_MIN_KEYS} keys "
                 f"at {' or '.join(map(str, DENSE_TRITON_HEADS))} heads (H200: 8-17% faster), else the order")
PAGED_SUMMARY = "cuda (H200 64 x 65536 fp8: 138.0 us vs triton 287.5 us), else the order"


def dense(q, kv, kv_scale, weights, ks, ke, clean, precise) -> Optional[str]:
    """The backend measured fastest for a dsa.indexer_logits call (None: the automatic order)."""
    t, h, _ = q.shape
    # fp8 keys with rows at least 128 bytes apart: the CUDA TMA kernels, in both modes.
    if q.dtype == torch.float8_e4m3fn and (not precise or kv.stride(0) >= 128):
        return None
    if h in DENSE_TRITON_HEADS and t >= DENSE_TRITON_MIN_ROWS and kv.shape[0] >= DENSE_TRITON_MIN_KEYS:
        return "triton"
    return None


def paged(q, kv_cache, weights, context_lens, block_table, max_context_len, clean, precise) -> Optional[str]:
    """The backend measured fastest for a dsa.paged_indexer_logits call: CUDA in both modes."""
    return "cuda"
