"""CPU model of the native HIP top-k (backends_rocm/kernels/topk.hip), checked against the reference.

The model follows the kernels' arithmetic: the uint32 keys, the clipped window, the three levels
(12-bit digits of bits 31..20 and 19..8, then bits 7..0) with their early exit, the row split into
parts (partial histograms summed), and the ordered write (tiles of threads * 4 consecutive keys, a
scan of packed 16-bit counts, running totals across tiles and parts, the early break). Small thread
counts reach multi-tile paths on small rows. It cannot see races or GPU semantics.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dsa_ops.ops._common import window_topk

from tests.test_topk_radix_model import float_keys

SHIFTS = (20, 8, 0)
DIGIT_MASKS = (0xFFF, 0xFFF, 0xFF)
MASKS = (0xFFF00000, 0xFFFFFF00, 0xFFFFFFFF)


def select(parts: list, k: int):
    """The select over the keys of every part (a split row sums the parts' histograms)."""
    prefix, mask, need = 0, 0, k
    for level in range(3):
        hist = np.zeros(4096, dtype=np.int64)
        for p in parts:
            c = p[(p & np.uint32(mask)) == np.uint32(prefix)]
            d = (c >> np.uint32(SHIFTS[level])) & np.uint32(DIGIT_MASKS[level])
            hist += np.bincount(d, minlength=4096)
        acc, found = 0, None
        for b in range(4095, -1, -1):  # from the highest bin down
            if acc < need <= acc + hist[b]:
                found = (b, acc, int(hist[b]))
            acc += int(hist[b])
        assert found is not None
        b, above, count = found
        prefix |= b << SHIFTS[level]
        mask = MASKS[level]
        need -= above
        if need == count:
            break
    return prefix, mask, need


def ordered_write(keys, lo, hi, prefix, mask, need, k, run_gt, run_eq, out, threads, items=4):
    tile = threads * items
    for base in range(lo, hi, tile):
        if run_gt + min(run_eq, need) >= k:
            break
        cols = np.arange(base, min(base + tile, hi))
        mk = keys[cols] & np.uint32(mask)
        gt = mk > prefix
        eq = mk == prefix
        # per-thread packed counts, exclusive scan in thread order
        t_of = (cols - base) // items
        n_gt = np.bincount(t_of[gt], minlength=threads)
        n_eq = np.bincount(t_of[eq], minlength=threads)
        packed = (n_gt << 16) | n_eq
        assert (n_gt < 65536).all() and packed.sum() < 2**32
        excl = np.cumsum(packed) - packed
        total = int(packed.sum())
        for t in range(threads):
            g = run_gt + (int(excl[t]) >> 16)
            e = run_eq + (int(excl[t]) & 0xFFFF)
            for c in cols[t_of == t]:
                m = int(keys[c]) & mask
                if m > prefix:
                    pos = g + min(e, need)
                    if pos < k:
                        assert out[pos] == -2
                        out[pos] = c
                    g += 1
                elif m == prefix:
                    if e < need:
                        assert out[g + e] == -2
                        out[g + e] = c
                    e += 1
        run_gt += total >> 16
        run_eq += total & 0xFFFF


def model_row(keys, lo, hi, start, k, split, threads):
    out = np.full(k, -2, dtype=np.int64)
    n = hi - lo
    if n <= k:
        for j in range(k):
            out[j] = lo + j - start if j < n else -1
        return out
    bounds = [(lo + n * s // split, lo + n * (s + 1) // split) for s in range(split)]
    prefix, mask, need = select([keys[a:b] for a, b in bounds], k)
    run_gt = run_eq = 0
    for a, b in bounds:
        mk = keys[a:b] & np.uint32(mask)
        ordered_write(keys, a, b, prefix, mask, need, k, run_gt, run_eq, out, threads)
        run_gt += int((mk > prefix).sum())
        run_eq += int((mk == prefix).sum())
    assert (out != -2).all()
    return np.where(out >= 0, out - start, -1)


def model(scores, k, lengths=None, starts=None, split=1, threads=8):
    rows, width = scores.shape
    res = np.zeros((rows, k), dtype=np.int64)
    for r in range(rows):
        keys = float_keys(scores[r])  # the CUDA kernels' order-preserving keys
        start = int(starts[r]) if starts is not None else 0
        ln = int(lengths[r]) if lengths is not None else width - start
        ln = max(ln, 0)
        lo = min(max(start, 0), width)
        hi = max(min(max(start + ln, 0), width), lo)
        res[r] = model_row(keys, lo, hi, start, k, split, threads)
    return torch.from_numpy(res).to(torch.int32)


def gen(dist, rows, width, g):
    if dist == "normal":
        return torch.randn(rows, width, generator=g)
    if dist == "equal":
        return torch.full((rows, width), 0.6875)
    if dist == "ties":
        return torch.randint(0, 5, (rows, width), generator=g).float()
    if dist == "mostly_zero":
        return torch.relu(torch.randn(rows, width, generator=g) - 1.5)
    if dist == "nan_inf":
        x = torch.randn(rows, width, generator=g)
        u = torch.rand(rows, width, generator=g)
        x[u < 0.2] = float("nan")
        x[(u >= 0.2) & (u < 0.3)] = float("inf")
        x[(u >= 0.3) & (u < 0.4)] = -float("inf")
        x[(u >= 0.4) & (u < 0.5)] = -0.0
        return x
    if dist == "narrow":
        return 1.0 + 0.245 * torch.rand(rows, width, generator=g)
    raise ValueError(dist)


@pytest.mark.parametrize("dist", ["normal", "equal", "ties", "mostly_zero", "nan_inf", "narrow"])
@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_model_matches_reference(dist, split, dtype):
    g = torch.Generator().manual_seed(7)
    x = gen(dist, 4, 300, g).to(dtype)
    lengths = torch.tensor([300, 250, 40, -3], dtype=torch.int32)
    starts = torch.tensor([0, 30, -5, 10], dtype=torch.int32)
    for k in (1, 7, 64, 120):
        want = window_topk(x, k, lengths, starts)
        got = model(x, k, lengths, starts, split=split)
        assert torch.equal(got, want), (dist, split, k)
