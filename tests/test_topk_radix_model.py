"""CPU model of the CUDA top-k kernel's algorithm (backends_cuda/kernels/topk.cu), checked against the
reference on adversarial inputs.

The model follows the kernel step by step: the uint32 keys, the clipped window, the list path (window in
shared memory), the stream path with its candidate buffer, the three radix levels with their early exit,
and the ordered compaction (per-chunk block scan of packed 16-bit counts, the 16-byte vector layout of
the window, the early break). Shared-memory capacities are parameters here, so small rows reach every
path. It cannot see races or CUDA semantics; it pins down the arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dsa_ops.ops._common import window_topk

BINS = 2048
SHIFTS = (21, 10, 0)
MASKS = (0xFFE00000, 0xFFFFFC00, 0xFFFFFFFF)


def float_keys(x: torch.Tensor) -> np.ndarray:
    """uint32 keys of kernels' radix::float_key (through fp32, as the kernel converts)."""
    f = x.float().numpy().astype(np.float32)
    b = f.view(np.uint32).copy()
    b[f == 0] = 0
    k = np.where(b & 0x80000000, ~b, b | 0x80000000).astype(np.uint32)
    k[np.isnan(f)] = 0
    return k


class Row:
    """A window as the kernel's sources see it: 16-byte vectors (items per vector) from a0."""

    def __init__(self, keys, lo, hi, items, mis, cols=None):
        self.keys, self.lo, self.hi, self.items = keys, lo, hi, items
        self.a0 = lo - mis
        self.cols = cols  # explicit columns (candidate list) or None
        self.vecs = (hi - self.a0 + items - 1) // items

    def vec(self, v):
        out = []
        for j in range(self.items):
            i = self.a0 + v * self.items + j
            if self.lo <= i < self.hi:
                col = int(self.cols[i]) if self.cols is not None else i
                out.append((int(self.keys[i]), col))
            else:
                out.append(None)
        return out

    def all_valid(self):
        for v in range(self.vecs):
            for it in self.vec(v):
                if it is not None:
                    yield it


def hist_pass(row, st, shift):
    hist = [0] * BINS
    for key, _ in row.all_valid():
        if key & st["mask"] == st["prefix"]:
            hist[(key >> shift) & 0x7FF] += 1
    return hist


def refine(hist, level, st, threads):
    # As radix::refine: thread t owns bins [t*per, (t+1)*per), a block scan, then a walk down.
    per = BINS // threads
    local = [sum(hist[t * per:(t + 1) * per]) for t in range(threads)]
    total = sum(local)
    found = []
    incl = 0
    for t in range(threads):
        incl += local[t]
        acc = total - incl
        for b in range(per - 1, -1, -1):
            h = hist[t * per + b]
            if acc < st["krem"] and acc + h >= st["krem"]:
                found.append((t * per + b, acc, h))
            acc += h
    assert len(found) == 1, found
    b, above, count = found[0]
    st["prefix"] |= b << SHIFTS[level]
    st["mask"] = MASKS[level]
    st["krem"] -= above
    st["count"] = count


def ordered_select(row, st, need, target, sink, threads, run_gt=0, run_eq=0):
    rounds = 0 if run_gt + min(run_eq, need) >= target else (row.vecs + threads - 1) // threads
    for r in range(rounds):
        per_thread = []
        for t in range(threads):
            v = r * threads + t
            items = row.vec(v) if v < row.vecs else [None] * row.items
            gt = eq = 0
            for j, it in enumerate(items):
                if it is None:
                    continue
                mk = it[0] & st["mask"]
                gt |= (mk > st["prefix"]) << j
                eq |= (mk == st["prefix"]) << j
            per_thread.append((v, items, gt, eq))
        packed = [(bin(g).count("1") << 16) | bin(e).count("1") for _, _, g, e in per_thread]
        assert sum(p >> 16 for p in packed) < 65536 and sum(p & 0xFFFF for p in packed) < 65536
        total = sum(packed)
        excl = 0
        for (_v, items, gt, eq), p in zip(per_thread, packed, strict=True):
            gb = run_gt + (excl >> 16)
            eb = run_eq + (excl & 0xFFFF)
            for j, it in enumerate(items):
                if (gt >> j) & 1:
                    sink(gb + min(eb, need), it[0], it[1])
                    gb += 1
                elif (eq >> j) & 1:
                    if eb < need:
                        sink(gb + eb, it[0], it[1])
                    eb += 1
            excl += p
        run_gt += total >> 16
        run_eq += total & 0xFFFF
        if run_gt + min(run_eq, need) >= target:
            break
    return run_gt + min(run_eq, need)


def sample_filter(keys_row, g, k, cap, threads, samples):
    """The kernel's sample_filter: the j-th largest of evenly spaced samples, then keys >= it."""
    pn = g.hi - g.lo
    sk = np.array([keys_row[g.lo + (i * pn + pn // 2) // samples] for i in range(samples)], dtype=np.uint32)
    want = min(cap // 2, 3 * k)
    j = min(max((samples * want) // pn, 1), samples)
    ss = dict(prefix=0, mask=0, krem=j, count=samples)
    lst = Row(sk, 0, samples, 4, 0)
    for level in range(3):
        if ss["count"] == ss["krem"]:
            break
        refine(hist_pass(lst, ss, SHIFTS[level]), level, ss, threads)
    filt = dict(prefix=ss["prefix"], mask=0xFFFFFFFF)
    ck, cc = [], []

    def put(pos, key, col):
        if pos < cap:
            assert pos == len(ck)
            ck.append(key)
            cc.append(col)

    count = ordered_select(g, filt, 0xFFFFFFFF, 0xFFFFFFFF, put, threads)
    assert count == sum(1 for key, _ in g.all_valid() if key >= ss["prefix"])
    return count, Row(np.array(ck, dtype=np.uint32), 0, len(ck), 4, 0, cols=np.array(cc, dtype=np.int64))


def model_row(keys_row, k, start, length, width, *, list_words, cap, threads, items, mis, csize=1,
              sample=0, lcap=0):
    """One row as the kernel computes it, with csize CTAs (a cluster) splitting the window."""
    out = [None] * k
    len_ = width - start if length is None else length
    len_ = max(len_, 0)
    lo = min(max(start, 0), width)
    hi = min(max(start + len_, lo), width)
    n = hi - lo

    def put(pos, col):
        assert 0 <= pos < k and out[pos] is None, (pos, out[pos])
        out[pos] = (col - start + 2**31) % 2**32 - 2**31  # int32 wrap

    if n <= k:
        for j in range(k):
            out[j] = ((lo + j - start + 2**31) % 2**32 - 2**31) if j < n else -1
        return out
    part = ((n + csize - 1) // csize + 15) & ~15
    ctas = []
    for rank in range(csize):
        p_lo = min(lo + part * rank, hi)
        p_hi = min(p_lo + part, hi)
        pn = p_hi - p_lo
        g = Row(keys_row, p_lo, p_hi, items, (mis + rank) % items)
        c = dict(g=g, src=g, gt=0, eq=0, in_list=pn <= list_words, compacted=False)
        # where the keys at or above the bin are compacted: after the list (list path), or the
        # list area itself (stream path)
        c["ccap"] = lcap if c["in_list"] else cap
        if c["in_list"]:
            c["src"] = Row(keys_row, p_lo, p_hi, 4, 0)  # the part's keys at column - p_lo
        elif sample and csize == 1 and 2 * k <= cap and pn > sample:
            count, lst = sample_filter(keys_row, g, k, cap, threads, sample)
            if k <= count <= cap:
                c["src"], c["in_list"], c["sampled"], c["compacted"] = lst, True, True, True
        ctas.append(c)
    st = dict(prefix=0, mask=0, krem=k, count=n)
    for c in ctas:  # level 0 reads device memory, or the sampled candidates
        c["hist"] = hist_pass(c["src"] if c.get("sampled") else c["g"], st, SHIFTS[0])
    level = 0
    while True:
        total = [sum(c["hist"][b] for c in ctas) for b in range(BINS)]
        refine(total, level, st, threads)
        b = (st["prefix"] >> SHIFTS[level]) & 0x7FF
        for c in ctas:
            c["gt"] += sum(c["hist"][b + 1:])
            c["eq"] = c["hist"][b]
        if st["count"] == st["krem"] or level + 1 == 3:
            break
        for c in ctas:
            mine = c["gt"] + c["eq"]
            if not c["compacted"] and c["ccap"] > 0 and mine <= c["ccap"]:
                ck = np.zeros(mine, dtype=np.uint32)
                cc = np.zeros(mine, dtype=np.int64)
                seen = set()

                def lput(pos, key, col, ck=ck, cc=cc, seen=seen, mine=mine):
                    assert pos < mine and pos not in seen
                    seen.add(pos)
                    ck[pos] = key
                    cc[pos] = col

                ordered_select(c["src"], st, 0xFFFFFFFF, mine, lput, threads)
                assert len(seen) == mine
                assert np.all(np.diff(cc) > 0)
                c["src"] = Row(ck, 0, mine, 4, 0, cols=cc)
                c["in_list"] = c["compacted"] = True
        level += 1
        for c in ctas:
            c["hist"] = hist_pass(c["src"], st, SHIFTS[level])
    base_gt = base_eq = 0
    for c in ctas:
        ordered_select(c["src"], st, st["krem"], k, lambda pos, key, col: put(pos, col), threads,
                       run_gt=base_gt, run_eq=base_eq)
        base_gt += c["gt"]
        base_eq += c["eq"]
    assert base_gt + min(base_eq, st["krem"]) == k
    assert all(v is not None for v in out)
    return out


def model(scores, k, lengths=None, row_starts=None, **kw):
    rows, width = scores.shape
    keys = float_keys(scores)
    res = []
    for r in range(rows):
        s = int(row_starts[r]) if row_starts is not None else 0
        ln = int(lengths[r]) if lengths is not None else None
        res.append(model_row(keys[r], k, s, ln, width, **kw))
    return torch.tensor(res, dtype=torch.int32)


def _cases():
    g = torch.Generator().manual_seed(0)
    W = 300
    yield "normal", torch.randn(3, W, generator=g)
    yield "equal", torch.full((2, W), 0.5)
    yield "zeros", torch.zeros(2, W)
    x = torch.zeros(2, W)
    x[0, ::37] = 1.0
    x[1, 5::11] = torch.rand(len(range(5, W, 11)), generator=g)
    yield "mostly_zero", x
    yield "ties", torch.randint(0, 4, (3, W), generator=g).float()
    yield "narrow", 1.0 + 0.245 * torch.rand(3, W, generator=g)
    yield "big", torch.randn(2, W, generator=g) * 1e6
    x = torch.randn(3, W, generator=g)
    x[0, ::3] = float("nan")
    x[1, ::5] = float("inf")
    x[1, 1::5] = -float("inf")
    x[2, ::2] = -float("nan")
    x[2, 1::7] = float("inf")
    yield "nan_inf", x
    x = torch.zeros(2, W)
    x[:, ::2] = -0.0
    x[1, ::9] = 1e-30
    yield "signed_zero", x
    yield "bf16", torch.randn(2, W, generator=g).bfloat16()
    yield "fp16", (torch.randn(2, W, generator=g) * 100).half()


# list_words, cap, threads, items, mis, csize, sample, lcap
CONFIGS = [
    (1 << 20, 0, 64, 4, 0, 1),  # list path, no room for candidates: every level over the list
    (1 << 20, 0, 64, 4, 0, 1, 0, 400),  # list path, the keys at or above the first bin compacted
    (1 << 20, 0, 64, 4, 0, 1, 0, 60),  # list path, small candidate area (compacts at a later level)
    (1 << 20, 0, 64, 4, 0, 3, 0, 40),  # split rows, list parts with candidates (per-CTA choice)
    (16, 400, 64, 4, 3, 1),  # stream path, candidates always fit
    (16, 64, 64, 8, 5, 1),  # stream path, small candidate buffer (falls back at some levels)
    (16, 0, 64, 4, 1, 1),  # stream path, no candidate buffer: 4 reads
    (1 << 20, 0, 64, 4, 0, 3),  # split rows: list path per part
    (40, 30, 64, 4, 2, 8),  # split rows: mixed list / stream parts, empty parts
    (16, 0, 64, 8, 1, 2),  # split rows: stream, no candidate buffer
    (16, 600, 64, 4, 3, 1, 32),  # sampled threshold (falls back on ties and plateaus)
    (16, 100, 64, 8, 1, 1, 16),  # sampled threshold, small buffer: more fallbacks
    (40, 30, 64, 4, 2, 8, 0, 24),  # split rows: mixed list (with candidates) / stream parts
]
NAMES = ("list_words", "cap", "threads", "items", "mis", "csize", "sample", "lcap")


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("k", [1, 7, 64, 250])
def test_model_matches_reference(cfg, k):
    kw = dict(zip(NAMES, cfg, strict=False))
    for name, x in _cases():
        ref = window_topk(x, k)
        got = model(x, k, **kw)
        assert torch.equal(got, ref), (name, cfg, k)


def test_model_windows():
    g = torch.Generator().manual_seed(1)
    R, W = 12, 200
    x = torch.randint(0, 5, (R, W), generator=g).float()
    starts = torch.tensor([0, 5, -7, 150, 199, 200, 250, -300, 3, 0, 10, -2**31], dtype=torch.int32)
    lengths = torch.tensor([200, 100, 50, 100, -5, 10, 10, 400, 0, 2**31 - 1, 64, 2**31 - 1],
                           dtype=torch.int32)
    for k in (1, 16, 64, 300):
        for cfg in CONFIGS[::2]:
            kw = dict(zip(NAMES, cfg, strict=False))
            ref = window_topk(x, k, lengths, starts)
            got = model(x, k, lengths, starts, **kw)
            assert torch.equal(got, ref), (k, cfg)
            ref = window_topk(x, k, None, starts)
            got = model(x, k, None, starts, **kw)
            assert torch.equal(got, ref), (k, cfg, "no lengths")
