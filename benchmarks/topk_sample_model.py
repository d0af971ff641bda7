"""Dev tool (CPU): a Python model of the filter top-k kernel's sampled threshold, to count misses.

    python benchmarks/topk_sample_model.py [--rows 200] [--run 16] [--widths 32768 65536 131072]

For each random row it does what kernels/topk_filter.cu's `sample_threshold` and the fast path's checks
do: S samples in evenly spaced runs of `run` consecutive keys, the 2048-bin select on the samples'
order-preserving keys with its slack (j + j / 8 + 1), the 4-sigma aim, the run check (re-select at the
middle aim when the samples at or above the threshold sit in fewer than half the runs independent
samples would fill), the `promising` test, then the count of the row's keys at or above the threshold.
It prints, per width and distribution, how many rows the fast path finishes ("ok") and how many go to
the exact fallback: too few candidates ("few"), more than the buffer ("over"), or a sample that says the
buffer would overflow ("missed"). With --retry, rows with too few candidates get the wider second
attempt of branch miss-retry. A model, not the kernel: keep it in step with the kernel when either moves.
"""

from __future__ import annotations

import argparse
import collections
import math

import numpy as np

CAPACITY = 8192  # the candidate buffer (kCapacity)
BINS = 2048


def float_keys(x: np.ndarray) -> np.ndarray:
    """radix::float_key: unsigned keys in the order of the floats."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return np.where(b >> 31 == 1, ~b & 0xFFFFFFFF, b | 0x80000000)


def select(keys: np.ndarray, r: int, slack: int):
    """select_list on the samples: (lower edge of the bin, samples at or above it, whole key fixed)."""
    base = int(keys.min())
    span = int(keys.max()) - base
    if span == 0:
        return base, len(keys), True
    d = keys - base
    shift = max(span.bit_length() - 11, 0)
    prefix, mask, krem, count = 0, 0, r, len(keys)
    while True:
        digits = (d[(d & mask) == prefix] >> shift) & (BINS - 1)
        hist = np.bincount(digits.astype(np.int64), minlength=BINS)
        above = np.cumsum(hist[::-1])  # entries in bins >= b, for b from the top
        b = BINS - 1 - int(np.searchsorted(above, krem))
        krem -= int(above[BINS - 2 - b]) if b < BINS - 1 else 0
        count = int(hist[b])
        prefix |= b << shift
        mask |= (BINS - 1) << shift
        if shift == 0 or (r - krem) + count <= r + slack:
            return base + prefix, (r - krem) + count, shift == 0
        shift = max(shift - 11, 0)


def fast_path(x: np.ndarray, k: int, run: int, wide: bool = False) -> str:
    n = len(x)
    s = 2048
    while s < 16384 and s * 48 < n:
        s *= 2
    runs = s // run
    i = np.arange(s)
    at = (i // run) * ((n - run) >> int(math.log2(runs))) + i % run
    samples = float_keys(x[at])
    j0 = s * k / n
    j_hi = s * 0.75 * CAPACITY / n
    j = int(j0 + 4 * math.sqrt(j0) + 2)
    if wide:
        j = max(int(0.85 * j_hi), j)
    j = min(j, s)
    e, at_or_above, _ = select(samples, j, j // 8 + 1)
    if not wide:
        hits = int((samples >= e).reshape(runs, run).any(axis=1).sum())
        expected = runs * (1 - (1 - at_or_above / s) ** run)
        j_mid = min(int(0.5 * (j0 + j_hi)), s)
        if hits < 0.5 * expected and j_mid > j:
            j = j_mid
            e, at_or_above, _ = select(samples, j, j // 8 + 1)
    if at_or_above * n / s > 0.75 * CAPACITY:
        return "missed"
    total = int((float_keys(x) >= e).sum())
    return "few" if total < k else "over" if total > CAPACITY else "ok"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--run", type=int, default=16)  # kSampleRun
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--widths", type=int, nargs="+", default=[32768, 65536, 131072])
    ap.add_argument("--retry", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for n in args.widths:
        for dist in ("normal", "walk"):
            counts = collections.Counter()
            for _ in range(args.rows):
                x = rng.standard_normal(n).astype(np.float32)
                if dist == "walk":
                    x = np.cumsum(x, dtype=np.float32)
                result = fast_path(x, args.k, args.run)
                if result == "few" and args.retry:
                    result = "retry " + fast_path(x, args.k, args.run, wide=True)
                counts[result] += 1
            print(f"{n:>8} {dist:>6} run {args.run}: {dict(counts)}", flush=True)


if __name__ == "__main__":
    main()
