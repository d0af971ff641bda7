"""CPU model of the CUDA top-k kernel's algorithm (backends_cuda/kernels/topk.cu), checked against the
reference on adversarial inputs.

The model follows the kernel step by step: the uint32 keys, the clipped window, the list path (window in
shared memory), the stream path with its candidate buffer, the three radix levels with their early exit,
and both instances of the kernel: deterministic=True (ordered compactions: per-chunk block scan of packed
16-bit counts, the 16-byte vector layout of the window, the early break; rows come out ascending and are
compared exactly) and deterministic=False (unordered compactions: every copy and the final write take
slots of a shared counter in any order, modelled by a random permutation; the ties at the threshold take
the `need` smallest columns through a radix select over the tied keys' column keys ~(col - p_lo); a split
row's CTA c takes min(part_eq, need - min(base_eq, need)) ties at output base_gt + min(base_eq, need);
compared as sets). Shared-memory capacities are parameters here, so small rows reach every path. It
cannot see races or CUDA semantics; it pins down the arithmetic.
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


def unordered_take(row, pred, rng):
    """unordered_take: every item the predicate takes, at slots 0, 1, ... in any order (a random
    permutation here). Returns [(slot, key, col)] and the count."""
    taken = [(key, col) for key, col in row.all_valid() if pred(key, col)]
    perm = rng.permutation(len(taken)) if taken else []
    return [(int(perm[i]), key, col) for i, (key, col) in enumerate(taken)], len(taken)


def unordered_sample_filter(keys_row, g, k, cap, threads, samples, rng):
    """sample_filter of the unordered instance: the same threshold, then keys >= it in any order."""
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
    e = ss["prefix"]
    placed, count = unordered_take(g, lambda key, col: key >= e, rng)
    ck = np.zeros(min(count, cap), dtype=np.uint32)
    cc = np.zeros(min(count, cap), dtype=np.int64)
    for pos, key, col in placed:
        if pos < cap:  # CandEmit: slots past the buffer are counted, not stored
            ck[pos], cc[pos] = key, col
    assert count == sum(1 for key, _ in g.all_valid() if key >= e)
    return count, Row(ck, 0, len(ck), 4, 0, cols=cc)


def column_select(src, st, need, ties, p_lo, threads):
    """column_select: of the `ties` keys equal to the prefix, the need-th largest column key
    ~(col - p_lo) (uint32) by the same radix levels; take the ties whose column key is at or above
    the returned prefix under the returned mask (the `need` smallest columns)."""
    assert 1 <= need < ties
    ckeys = [(~(col - p_lo)) & 0xFFFFFFFF for key, col in src.all_valid() if key & st["mask"] == st["prefix"]]
    assert len(ckeys) == ties
    cs = dict(prefix=0, mask=0, krem=need, count=ties)
    for level in range(3):
        if cs["count"] == cs["krem"]:
            break
        hist = [0] * BINS
        for c in ckeys:
            if c & cs["mask"] == cs["prefix"]:
                hist[(c >> SHIFTS[level]) & 0x7FF] += 1
        refine(hist, level, cs, threads)
    assert cs["count"] == cs["krem"]  # unique columns
    assert sum(1 for c in ckeys if c & cs["mask"] >= cs["prefix"]) == need
    return cs


def model_row(keys_row, k, start, length, width, *, list_words, cap, threads, items, mis, csize=1,
              sample=0, lcap=0, ordered=True, rng=None):
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
            if ordered:
                count, lst = sample_filter(keys_row, g, k, cap, threads, sample)
            else:
                count, lst = unordered_sample_filter(keys_row, g, k, cap, threads, sample, rng)
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

                if ordered:
                    ordered_select(c["src"], st, 0xFFFFFFFF, mine, lput, threads)
                    assert np.all(np.diff(cc) > 0)
                else:
                    m, p = st["mask"], st["prefix"]
                    placed, count = unordered_take(c["src"], lambda key, col, m=m, p=p: key & m >= p, rng)
                    assert count == mine
                    for pos, key, col in placed:
                        lput(pos, key, col)
                assert len(seen) == mine
                c["src"] = Row(ck, 0, mine, 4, 0, cols=cc)
                c["in_list"] = c["compacted"] = True
        level += 1
        for c in ctas:
            c["hist"] = hist_pass(c["src"], st, SHIFTS[level])
    base_gt = base_eq = 0
    need = st["krem"]
    for c in ctas:
        if ordered:
            ordered_select(c["src"], st, need, k, lambda pos, key, col: put(pos, col), threads,
                           run_gt=base_gt, run_eq=base_eq)
        else:
            eq_before = min(base_eq, need)
            my_need = min(c["eq"], need - eq_before)
            ties = 0 if my_need == 0 else (1 if my_need == c["eq"] else 2)
            p_lo = c["g"].lo
            cs = column_select(c["src"], st, my_need, c["eq"], p_lo, threads) if ties == 2 else None
            m, p = st["mask"], st["prefix"]

            def pred(key, col, m=m, p=p, ties=ties, cs=cs, p_lo=p_lo):
                mk = key & m
                if mk != p:
                    return mk > p
                if ties != 2:
                    return ties == 1
                return ((~(col - p_lo)) & 0xFFFFFFFF) & cs["mask"] >= cs["prefix"]

            placed, count = unordered_take(c["src"], pred, rng)
            assert count == c["gt"] + my_need
            base = base_gt + eq_before
            for pos, _key, col in placed:
                assert base + pos < k  # OutEmit's guard never drops a key
                put(base + pos, col)
        base_gt += c["gt"]
        base_eq += c["eq"]
    assert base_gt + min(base_eq, st["krem"]) == k
    assert all(v is not None for v in out)
    return out


def model(scores, k, lengths=None, row_starts=None, deterministic=True, seed=0, **kw):
    rows, width = scores.shape
    keys = float_keys(scores)
    rng = np.random.default_rng(seed)
    res = []
    for r in range(rows):
        s = int(row_starts[r]) if row_starts is not None else 0
        ln = int(lengths[r]) if lengths is not None else None
        res.append(model_row(keys[r], k, s, ln, width, ordered=deterministic, rng=rng, **kw))
    return torch.tensor(res, dtype=torch.int32)


def check(got, ref, deterministic, what):
    """deterministic: the exact rows (ascending); else the same set per row (any order)."""
    if deterministic:
        assert torch.equal(got, ref), what
    else:
        assert torch.equal(got.sort(dim=1).values, ref.sort(dim=1).values), what


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


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("k", [1, 7, 64, 250, 400])
def test_model_matches_reference(cfg, k, deterministic):
    kw = dict(zip(NAMES, cfg, strict=False))
    for name, x in _cases():
        ref = window_topk(x, k)
        got = model(x, k, deterministic=deterministic, **kw)
        check(got, ref, deterministic, (name, cfg, k))


def test_model_windows():
    g = torch.Generator().manual_seed(1)
    R, W = 12, 200
    x = torch.randint(0, 5, (R, W), generator=g).float()
    starts = torch.tensor([0, 5, -7, 150, 199, 200, 250, -300, 3, 0, 10, -2**31], dtype=torch.int32)
    lengths = torch.tensor([200, 100, 50, 100, -5, 10, 10, 400, 0, 2**31 - 1, 64, 2**31 - 1],
                           dtype=torch.int32)
    for det in (True, False):
        for k in (1, 16, 64, 300):
            for cfg in CONFIGS[::2]:
                kw = dict(zip(NAMES, cfg, strict=False))
                ref = window_topk(x, k, lengths, starts)
                got = model(x, k, lengths, starts, deterministic=det, **kw)
                check(got, ref, det, (k, cfg, det))
                ref = window_topk(x, k, None, starts)
                got = model(x, k, None, starts, deterministic=det, **kw)
                check(got, ref, det, (k, cfg, det, "no lengths"))


def _tie_cases():
    """Heavy ties at the threshold: plateaus, all-equal rows, a few distinct values in long runs
    (the ties then lie in every CTA of a split row), ties just below a handful of larger keys."""
    g = torch.Generator().manual_seed(2)
    W = 700
    yield "equal", torch.full((2, W), -1.5)
    yield "two_values", torch.randint(0, 2, (3, W), generator=g).float()
    x = torch.zeros(3, W)
    x[0, ::50] = 2.0  # 14 keys above a plateau of 686 ties
    x[1, 600:] = 1.0  # the larger keys all in the last CTAs
    x[2, :30] = 3.0  # the larger keys all in the first CTA
    yield "plateau", x
    x = torch.randint(0, 3, (2, W), generator=g).float()
    x[:, 300:400] = 1.0  # a run of ties in the middle
    yield "runs", x
    yield "signed_zero", torch.where(torch.rand(2, W, generator=g) < 0.5, 0.0, -0.0)
    x = torch.full((2, W), float("nan"))
    x[0, ::7] = -float("inf")
    yield "nan_plateau", x


# Split rows with ties spread over the CTAs, list / stream / mixed parts, the sampled filter.
TIE_CONFIGS = [
    (1 << 20, 0, 64, 4, 0, 1),
    (1 << 20, 0, 64, 4, 0, 1, 0, 900),
    (1 << 20, 0, 64, 4, 0, 4),
    (1 << 20, 0, 64, 4, 0, 5, 0, 120),
    (96, 60, 64, 4, 2, 8, 0, 40),
    (16, 0, 64, 8, 3, 3),
    (16, 800, 64, 4, 1, 1),
    (16, 800, 64, 4, 3, 1, 64),
]


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("cfg", TIE_CONFIGS)
@pytest.mark.parametrize("k", [1, 13, 100, 333, 699, 800])
def test_model_heavy_ties(cfg, k, deterministic):
    kw = dict(zip(NAMES, cfg, strict=False))
    for name, x in _tie_cases():
        for seed in (0, 1):
            ref = window_topk(x, k)
            got = model(x, k, deterministic=deterministic, seed=seed, **kw)
            check(got, ref, deterministic, (name, cfg, k, seed))
