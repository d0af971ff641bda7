"""Dev tool (CPU): which way a spread split row's one-round select goes (one_round_select in
backends_cuda/kernels/topk_filter.cu), per distribution, dtype and width,
on the CPU model of the kernel's sampled threshold (tests/test_topk_filter_model.py, with a spread row's
samples). The kernel bins each row's candidates from the sampled threshold E to the samples' largest key
(256 bins, keys above it in the top bin); the threshold bin is then "rank" (<= 256 entries, ranked by rank
0) or "whole" (both finish in one round), or "top" / "big" (the kernel falls back to hist_select);
"plateau" and "few/over" rows do not take the one-round path.

    python tools/topk_one_round_model.py
"""

from __future__ import annotations

import collections
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from dsa_ops.testing import topk_scores  # noqa: E402

from tests.test_topk_filter_model import (  # noqa: E402
    filter_sample_positions,
    first_shift,
    sample_count,
    sample_threshold,
)
from tests.test_topk_radix_model import float_keys  # noqa: E402

CAPACITY = 8192  # kCapacity
MAX_SAMPLES = 16384  # kMaxSamples
BITS = 8  # kOneRoundBits
RANK_BIN = 256  # kRankBin


def one_round(x: torch.Tensor, k: int = 2048, ctas: int = 8) -> str:
    keys = float_keys(x).astype(np.uint64)
    n = len(keys)
    E, promising, _ = sample_threshold(keys, 0, n, k, CAPACITY, MAX_SAMPLES, run=16, spread=True)
    if not promising:
        return "plateau"
    S = sample_count(n // 2, MAX_SAMPLES)  # (a spread row's samples)
    smax = int(keys[filter_sample_positions(n, S, 16).numpy()].max())
    E = int(E)
    cand = keys[keys >= E].astype(np.int64)
    if len(cand) < k or len(cand) > ctas * CAPACITY:
        return "few/over"
    shift = first_shift(smax - E, BITS) if smax > E else 0
    hist = np.bincount(np.minimum((cand - E) >> shift, (1 << BITS) - 1), minlength=1 << BITS)
    above = 0
    for b in range((1 << BITS) - 1, -1, -1):
        if above + hist[b] >= k:
            break
        above += hist[b]
    if b == (1 << BITS) - 1:
        return "top"
    if hist[b] == k - above:
        return "whole"
    return "rank" if hist[b] <= RANK_BIN else "big"


def main() -> None:
    g = torch.Generator().manual_seed(0)
    for dist in ("normal", "narrow", "walk", "big", "nan_inf", "ties", "mostly_zero"):
        for dtype in (torch.float32, torch.bfloat16):
            for width in (131072, 134868, 1 << 20):
                rows = 20 if width < 1 << 20 else 4
                x = topk_scores(dist, rows, width, dtype, generator=g, device="cpu").float()
                ways = collections.Counter(one_round(x[i]) for i in range(rows))
                print(dist, str(dtype).replace("torch.", ""), width, dict(ways))


if __name__ == "__main__":
    main()
