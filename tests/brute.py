"""Brute-force oracles in plain Python loops: the references are tested against these."""

from __future__ import annotations

import math

import torch


def rank_key(x: float, nan_first: bool = False):
    # Larger first; NaN after every number (before, with nan_first); -0.0 == +0.0 in Python already.
    if math.isnan(x):
        return (-1, 0.0) if nan_first else (1, 0.0)
    return (0, -x)


def topk_row(row: list[float], k: int, start: int, length: int | None, nan_first: bool = False) -> set[int]:
    w = len(row)
    length = w - start if length is None else length
    length = max(length, 0)
    lo, hi = min(max(start, 0), w), min(max(start + length, 0), w)
    hi = max(hi, lo)
    order = sorted(range(lo, hi), key=lambda j: (rank_key(row[j], nan_first), j))
    return {j - start for j in order[:k]}


def page_map(i: int, pt: list[list[int]], b: int, ps: int, p: int) -> int:
    if i < 0 or b < 0 or b >= len(pt):
        return -1
    slot = ps + i // p
    if slot < 0 or slot >= len(pt[b]) or pt[b][slot] < 0:
        return -1
    v = pt[b][slot] * p + i % p
    return v if v <= 2**31 - 1 else -1


def indexer_logit(q, kv, s, w, t, j) -> float:
    """q [T,H,D], kv [N,D] float64 tensors; s [N] or None; w [T,H]."""
    total = 0.0
    for h in range(q.shape[1]):
        d = float((q[t, h] * kv[j]).sum()) * (float(s[j]) if s is not None else 1.0)
        total += float(w[t, h]) * max(d, 0.0)
    return total


def softmax_attend(scores: list[float], values: list[torch.Tensor]):
    """(out, lse) in float64 for one query over valid tokens; (zeros, inf) when none."""
    if not scores:
        return None, math.inf
    m = max(scores)
    e = [math.exp(s - m) for s in scores]
    total = sum(e)
    out = sum(ei * v for ei, v in zip(e, values)) / total
    return out, m + math.log(total)
