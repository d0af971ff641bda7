"""Launch choice of the native HIP top-k (kernels/topk.hip), in one place: workgroups per row.

``split_factor(rows, width, num_cus)`` is the only decision. Few long rows (decode: 1 to a few dozen
rows of 64K keys or more) would leave most CUs idle with one workgroup per row, so each row's window
is cut into parts, one workgroup each, through the row-split kernel sequence; enough rows to fill the
GPU keep one workgroup per row.

Override (tests, benchmarks): set ``dsa_ops.backends.rocm.topk_heuristics.force = N`` (1 = one
workgroup per row always, N > 1 = split every row into N parts, None = the heuristic). It is read on
every call, so it also reaches calls made through torch.ops.dsa.*.
"""

from __future__ import annotations

from typing import Optional

MAX_SPLIT = 64  # kTopkMaxSplit in include/dsa_hip/topk.h
MIN_WIDTH = 65536  # rows shorter than this never split
MIN_PART = 16384  # keys per part at least
MAX_AUTO_SPLIT = 16

force: Optional[int] = None


def split_factor(rows: int, width: int, num_cus: int) -> int:
    """Workgroups per row (1 = the single-workgroup path)."""
    if force is not None:
        return max(1, min(int(force), MAX_SPLIT))
    if rows <= 0 or width < MIN_WIDTH or num_cus <= 0 or 2 * rows > num_cus:
        return 1
    s = min(num_cus // rows, width // MIN_PART, MAX_AUTO_SPLIT)
    return s if s >= 2 else 1


def workspace_words(rows: int, split: int) -> int:
    """uint32 words of the split path's workspace (topk_workspace_words in include/dsa_hip/topk.h)."""
    return 0 if split <= 1 else rows * split * (4096 + 2) + rows * 8
