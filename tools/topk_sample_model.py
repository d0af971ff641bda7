"""Dev tool (CPU): how often the filter top-k kernel's sampled threshold misses, per distribution.

    python tools/topk_sample_model.py [--rows 200] [--run 16] [--widths 32768 65536 131072] [--retry]

For random rows it runs the CPU model of the kernel's sampled threshold (`sample_threshold` in
tests/test_topk_filter_model.py: sampling, the select with its slack, the 4-sigma aim, the run check,
the `promising` test) at the kernel's sizes (candidate buffer 8192, up to 16384 samples), then counts
the row's keys at or above the threshold. It prints how many rows the fast path finishes ("ok") and
how many go to the exact fallback: too few candidates ("few"), more than the buffer ("over"), or a
sample that says the buffer would overflow ("missed"). --run sets the sampled run length (the
kernel's kSampleRun); --retry gives rows with too few candidates the wider second attempt of branch
miss-retry. A model, not the kernel: keep the model in step with the kernel when either moves.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tests.test_topk_filter_model import sample_threshold  # noqa: E402
from tests.test_topk_radix_model import float_keys  # noqa: E402

CAPACITY = 8192  # kCapacity
MAX_SAMPLES = 16384  # kMaxSamples


def fast_path(x: torch.Tensor, k: int, run: int, wide: bool = False) -> str:
    keys = float_keys(x).astype(np.uint64)
    n = len(keys)
    E, promising, _ = sample_threshold(keys, 0, n, k, CAPACITY, MAX_SAMPLES, run=run, wide=wide)
    if not promising:
        return "missed"
    total = int((keys >= E).sum())
    return "few" if total < k else "over" if total > CAPACITY else "ok"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--run", type=int, default=16)  # kSampleRun
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--widths", type=int, nargs="+", default=[32768, 65536, 131072])
    ap.add_argument("--retry", action="store_true")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    for n in args.widths:
        for dist in ("normal", "walk"):
            counts = collections.Counter()
            for _ in range(args.rows):
                x = torch.randn(n, generator=g)
                if dist == "walk":
                    x = x.cumsum(0)
                result = fast_path(x, args.k, args.run)
                if result == "few" and args.retry:
                    result = "retry " + fast_path(x, args.k, args.run, wide=True)
                counts[result] += 1
            print(f"{n:>8} {dist:>6} run {args.run}: {dict(counts)}", flush=True)


if __name__ == "__main__":
    main()
