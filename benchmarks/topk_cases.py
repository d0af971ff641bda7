"""The top-k family's benchmark cases (issue 3), for benchmarks/bench_topk.py.

Each case: rows x keys of fp32 scores (unless `dtype` says otherwise), k = 2048, the distribution of
the scores, the goal as the issue states it, and how to time it (decode shapes, 1 to 64 rows, by
CUDA-graph replay, with the per-call host overhead outside a graph reported beside them).
`floor` goals are ratios to rows * keys * bytes / copy bandwidth measured in the same run; `us` goals
are absolute medians.
"""

from __future__ import annotations

import torch
from dsa_ops.testing import topk_scores

K = 2048

# (rows, keys, goal_kind, goal): goal_kind "floor" (at most goal x the memory floor) or "us".
MAIN_CASES = [
    (4096, 32768, "floor", 1.5),
    (4096, 131072, "floor", 1.5),
    (16384, 65536, "floor", 1.5),
    (256, 131072, "floor", 1.5),
    (1, 131072, "us", 10.0),
    (20, 134868, "us", 15.0),
    (64, 1048576, "floor", 2.0),
]

# Reported in the results table too (no goal): bf16 and the adversarial distributions.
DISTRIBUTIONS = ["normal", "equal", "zeros", "mostly_zero", "ties", "narrow", "big", "nan_inf", "walk"]
EXTRA_CASES = (
    [dict(rows=r, keys=n, k=K, dtype="bfloat16", distribution="normal") for r, n, *_ in MAIN_CASES]
    + [dict(rows=4096, keys=32768, k=K, dtype="float32", distribution=d) for d in DISTRIBUTIONS[1:]]
    + [dict(rows=64, keys=131072, k=K, dtype="float32", distribution=d) for d in DISTRIBUTIONS[1:]]
)

# topk_page_table_transform must cost at most 1.05x topk on the same shape (page_size 64).
PAGE_TABLE_RATIO_GOAL = 1.05
HOST_OVERHEAD_GOAL_US = 10.0


def graph_timed(rows: int) -> bool:
    """Decode shapes (1 to 64 rows) are timed by CUDA-graph replay."""
    return rows <= 64


def cases():
    """Every case as a dict with the DESIGN.md case keys (rows, keys, k, dtype, distribution)."""
    out = [dict(rows=r, keys=n, k=K, dtype="float32", distribution="normal", goal_kind=gk, goal=g)
           for r, n, gk, g in MAIN_CASES]
    return out + [dict(c) for c in EXTRA_CASES]


def make_scores(rows: int, keys: int, dtype: str = "float32", distribution: str = "normal",
                device: str = "cuda", seed: int = 0) -> torch.Tensor:
    """Scores of one case: dsa_ops.testing.topk_scores (the GPU tests' generators), seeded."""
    g = torch.Generator(device=device).manual_seed(seed)
    return topk_scores(distribution, rows, keys, getattr(torch, dtype), generator=g, device=device)


def page_table_args(rows: int, keys: int, page_size: int = 64, device: str = "cuda"):
    """The page-table form's inputs for whole rows, as the benchmarks time it: each row its own run of
    pages in order (int32 [rows, ceil(keys / page_size)]) and full windows (lengths = keys)."""
    pages = (keys + page_size - 1) // page_size
    page_table = torch.arange(rows * pages, dtype=torch.int32, device=device).view(rows, pages)
    return page_table, torch.full((rows,), keys, dtype=torch.int32, device=device)
