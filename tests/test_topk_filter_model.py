"""CPU model of the CUDA top-k filter kernel's arithmetic (backends_cuda/kernels/topk_filter.cu), checked
against the reference.

What it pins down, step by step as the kernel does it:
- FloatThreshold: the filter compares scores as floats with the float of the threshold key E; it must
  agree with `key(x) >= E` for every float (NaN, +-0, +-inf, denormals) and every E, including the
  edges of the key space.
- select_list: the radix select over a list in offset space (d = value - min, first level's bins over
  the list's range, clamped last level, early stop with slack), and the tie split by a second select
  on inverted columns.
- the row: sampled threshold (runs of 16 keys, the 4-sigma aim and the run check), filter into a
  bounded buffer, finish, and the exact fallback (levels over the row, single-valued bin detection,
  gather, ordered ties).
Capacities are parameters, so small rows reach every path. It cannot see races or CUDA semantics.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dsa_ops.ops._common import window_topk
from dsa_ops.testing import filter_retry_rows, filter_sample_positions

from tests.test_topk_radix_model import float_keys

BINS = 2048


# ---- FloatThreshold --------------------------------------------------------------------------------

def float_threshold(E: int):
    """(e, take_all): the float the kernel's FloatThreshold(E) compares with, and whether its filter
    takes every key without comparing (E == 0: NaN, key 0, passes only then)."""
    take_all = E == 0
    if E <= 0x007FFFFF:
        e = np.float32(-np.inf)
    elif E > 0xFF800000:
        e = np.float32(np.nan)
    else:
        bits = (E & 0x7FFFFFFF) if (E & 0x80000000) else (~E & 0xFFFFFFFF)
        e = np.array([bits], dtype=np.uint32).view(np.float32)[0]
    return e, take_all


def test_float_threshold_matches_key_compare():
    rng = np.random.default_rng(0)
    special = np.array([0, 1, 0x007FFFFF, 0x00800000, 0x00800001, 0x7F7FFFFF, 0x7F800000, 0x7F800001,
                        0x7FFFFFFE, 0x7FFFFFFF, 0x80000000, 0x80000001, 0x80800000, 0xBF800000,
                        0xFF7FFFFF, 0xFF800000, 0xFF800001, 0xFFFFFFFE, 0xFFFFFFFF], dtype=np.uint64)
    bits = np.concatenate([
        rng.integers(0, 2**32, 200000, dtype=np.uint64),
        special, (special ^ 0x80000000) & 0xFFFFFFFF,  # the keys' own float patterns
        np.array([0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x7F800000, 0xFF800000, 0x7FC00000,
                  0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x007FFFFF, 0x807FFFFF], dtype=np.uint64),
    ]).astype(np.uint32)
    x = bits.view(np.float32)
    keys = float_keys(torch.from_numpy(x.copy())).astype(np.uint64)
    Es = np.concatenate([special, rng.integers(0, 2**32, 300, dtype=np.uint64), keys[:200]])
    with np.errstate(invalid="ignore"):
        for E in Es.tolist():
            e, take_all = float_threshold(int(E))
            got = (x >= e) | take_all
            want = keys >= E
            bad = np.nonzero(got != want)[0]
            assert bad.size == 0, (hex(int(E)), [hex(int(b)) for b in bits[bad[:4]]])


# ---- select_list ----------------------------------------------------------------------------------

def hist_level(d, valid, prefix, mask, shift):
    sel = valid & ((d & mask) == prefix)
    return np.bincount(((d[sel] >> shift) & 0x7FF).astype(np.int64), minlength=BINS)


def refine_at(hist, shift, st):
    """The kernel's refine_at: the bin of the krem-th largest, scanning bins from the top."""
    prefix, mask, krem, count = st
    acc = 0
    for b in range(BINS - 1, -1, -1):
        h = int(hist[b])
        if acc < krem <= acc + h:
            prefix |= b << shift
            mask = 0xFFFFFFFF if shift == 0 else (~((1 << shift) - 1)) & 0xFFFFFFFF
            return prefix, mask, krem - acc, h
        acc += h
    raise AssertionError("krem beyond the entries")


def first_shift(span: int, bits: int = 11) -> int:
    """The kernel's first_shift<bits>: the shift of a select's first level, 2^bits bins over `span` (> 0)."""
    b = int(span).bit_length()
    return b - bits if b > bits else 0


def select_list(values, valid, r, slack=0, small=0, lo=None, n_valid=None):
    """(base, prefix, mask, krem, count), as the kernel's select_list. lo: the range's lower end when
    it is not the smallest valid value (a bound below it); n_valid: the count the kernel is given."""
    values = values.astype(np.uint64)
    n_valid = int(valid.sum()) if n_valid is None else n_valid
    st = (0, 0, r, n_valid)
    if n_valid == r:
        return (0,) + st
    lo = int(values[valid].min()) if lo is None else lo
    hi = int(values[valid].max())
    span = hi - lo
    if span == 0:
        return (lo, 0, 0xFFFFFFFF, r, n_valid)
    d = (values - lo) & 0xFFFFFFFF
    shift = first_shift(span)
    while True:
        st = refine_at(hist_level(d, valid, st[0], st[1], shift), shift, st)
        if shift == 0 or (r - st[2]) + st[3] <= r + slack or st[3] <= small:
            return (lo,) + st
        shift = shift - 11 if shift > 11 else 0


def taken(v, sel):
    base, prefix, mask, krem, count = sel
    d = (int(v) - base) & mask & 0xFFFFFFFF
    return d > prefix or (d == prefix and count == krem)


WARP_BIN = 32  # the kernel's kWarpBin: the finish's levels stop at a bin of this many (fp32 keys)
RANK_BIN = 256  # the kernel's kRankBin: bins of up to this many are ranked


def finish(keys, cols, r):
    """The r largest candidates (ties: smallest columns), as a set of columns, as the kernel's finish:
    a select that stops at a bin of at most WARP_BIN entries (or at the last level), then the whole bin,
    a ranking of the bin by (key, column) when it holds at most RANK_BIN, or a column select over the
    ties of a single-key bin."""
    keys = np.asarray(keys, dtype=np.uint64)
    cols = np.asarray(cols, dtype=np.int64)
    base, prefix, mask, krem, count = ks = select_list(keys, np.ones(len(keys), bool), r, small=WARP_BIN)
    whole_bin = count == krem
    rank_bin = not whole_bin and count <= RANK_BIN
    tie = base + prefix
    if not whole_bin and not rank_bin:
        assert mask == 0xFFFFFFFF  # a single key
        cs = select_list((~cols) & 0xFFFFFFFF, keys == tie, krem)
    out, in_bin = [], []
    for key, col in zip(keys.tolist(), cols.tolist()):
        d = (key - base) & mask & 0xFFFFFFFF
        if d == prefix and rank_bin:
            in_bin.append((key, col))
        if d > prefix or (d == prefix and (whole_bin or (not rank_bin and taken((~col) & 0xFFFFFFFF, cs)))):
            out.append(col)
    if rank_bin:
        assert len(in_bin) == count
        for key, col in in_bin:
            rank = sum(kj > key or (kj == key and cj < col) for kj, cj in in_bin)
            if rank < krem:
                out.append(col)
    assert len(out) == r, ks
    return sorted(out)


def lists(rng):
    n = 3000
    yield rng.integers(0, 2**32, n, dtype=np.uint64)  # full range
    yield 0xBF800000 + rng.integers(0, 1 << 21, n, dtype=np.uint64)  # narrow
    yield np.full(n, 0x80000000, dtype=np.uint64)  # all equal
    yield rng.integers(0, 8, n, dtype=np.uint64) + 0xC0000000  # 8 values
    yield np.where(rng.random(n) < 0.01, 0xC0000000 + rng.integers(0, 1 << 20, n), 0x80000000).astype(np.uint64)
    yield np.array([0, 0xFFFFFFFF] * (n // 2), dtype=np.uint64)  # the span's extremes
    yield 0xC0000000 + rng.integers(0, n // 2, n, dtype=np.uint64) * 4096  # pairs and triples: ties in small bins


@pytest.mark.parametrize("r", [1, 2, 100, 2047, 2999, 3000])
def test_finish_is_the_exact_top_r(r):
    rng = np.random.default_rng(r)
    for keys in lists(rng):
        cols = rng.permutation(10**6)[: len(keys)]  # unordered, distinct columns
        order = sorted(range(len(keys)), key=lambda i: (-int(keys[i]), int(cols[i])))
        want = sorted(int(cols[i]) for i in order[:r])
        assert finish(keys, cols, r) == want


def test_sample_select_stops_within_slack():
    rng = np.random.default_rng(5)
    for keys in lists(rng):
        for j in (1, 50, 400):
            slack = j // 8 + 1
            base, prefix, mask, krem, count = select_list(keys, np.ones(len(keys), bool), j, slack=slack)
            at_or_above = int((keys >= base + prefix).sum())
            assert at_or_above == (j - krem) + count >= j  # E is never above the j-th largest
            assert at_or_above <= j + slack or mask == 0xFFFFFFFF  # close enough, or exact


def test_sample_bound_keeps_the_jth_largest_in_range():
    """The sample select's first level spans [bound, largest] only: the bound must never pass the
    j-th largest sample (else the threshold would be wrong, not merely rough), and the select's count
    of samples at or above its answer must stay exact."""
    rng = np.random.default_rng(9)
    for keys in [*lists(rng), np.zeros(3000, dtype=np.uint64)]:  # (+ all NaN: keys 0, no cap below)
        for S, threads in ((2048, 512), (4096, 512), (256, 32)):
            samples = rng.choice(keys, S)
            for j in (1, 5, 17, 98, 175, 511, 512, 513, 2000):
                j = min(j, S)
                bound = sample_bound(samples, j, threads)
                assert bound <= int(np.sort(samples)[-j]), (S, j)
                slack = j // 8 + 1
                base, prefix, mask, krem, count = select_list(samples, samples >= bound, j, slack=slack, lo=bound,
                                                              n_valid=S)
                at_or_above = int((samples >= base + prefix).sum())
                assert at_or_above == (j - krem) + count >= j, (S, j)


# ---- the row ---------------------------------------------------------------------------------------

def sample_count(n, max_samples, min_samples=None):
    """The kernel's sample_count, with its bounds scaled by max_samples / 16384 (or min_samples given)."""
    s = min_samples or 2048 * max_samples // 16384
    while s < max_samples and s * 48 < n:
        s *= 2
    return s


def sample_bound(samples, j, threads):
    """The kernel's bound below the j-th largest sample: thread t holds samples t, t + threads, ...;
    the smallest of the maxima of groups of g aligned lanes (G = threads / g >= j groups), each warp's
    capped one below its largest; the samples' smallest when j > threads."""
    if j > threads:
        return int(samples.min())
    g = min(32, 1 << ((threads // j).bit_length() - 1))
    held = samples.reshape(-1, threads).max(axis=0)  # each thread's largest
    group_max = held.reshape(-1, g).max(axis=1)
    warp_hi = held.reshape(-1, 32).max(axis=1)
    capped = np.minimum(group_max.reshape(-1, 32 // g), np.where(warp_hi == 0, 0, warp_hi - 1)[:, None])
    return int(capped.min())


def sample_threshold(keys, lo, n, k, capacity, max_samples, run=16, wide=False, spread=False, min_samples=None,
                     threads=None):
    """(E, promising, single) of the kernel's sample_threshold for the window [lo, lo + n) of `keys`:
    S samples in evenly spaced runs of `run` keys, a select aimed 4 sigma above the expected count
    (wide: at 0.85 of the buffer's share, branch miss-retry's second attempt), again at the middle aim
    when the samples at or above it sit in fewer than half the runs independent samples would fill.
    spread: a split row of 4 CTAs or more, which takes the samples of a window half as long.
    min_samples, threads: the kernel's shape when not scaled from the wide one's (the narrow shape)."""
    S = sample_count(n // 2 if spread else n, max_samples, min_samples)
    runs = S // run
    samples = keys[lo + filter_sample_positions(n, S, run).numpy()]
    j0 = S * k / n
    j_hi = S * 0.75 * capacity / n
    j = int(j0 + 4 * math.sqrt(j0) + 2)
    if wide:
        j = max(int(0.85 * j_hi), j)
    j = min(j, S)
    threads = threads or 512 * max_samples // 16384  # (the kernel's 512 threads, scaled with the samples)
    bound = sample_bound(samples, j, threads)
    sel = select_list(samples, samples >= bound, j, slack=j // 8 + 1, lo=bound, n_valid=S)
    if not wide:
        E = sel[0] + sel[1]
        hits = int((samples >= E).reshape(runs, run).any(axis=1).sum())
        expected = runs * (1 - (1 - ((j - sel[3]) + sel[4]) / S) ** run)
        j_mid = min(int(0.5 * (j0 + j_hi)), S)
        if hits < 0.5 * expected and j_mid > j:
            j = j_mid
            sel = select_list(samples, np.ones(S, bool), j, slack=j // 8 + 1)
    at_or_above = (j - sel[3]) + sel[4]
    return sel[0] + sel[1], at_or_above * n / S <= 0.75 * capacity, sel[2] == 0xFFFFFFFF


def filter_row(x: torch.Tensor, k: int, lo: int, hi: int, capacity: int, max_samples: int, sample=True):
    """Relative columns chosen by the filter kernel for one window (a set), as the kernel runs it."""
    keys = float_keys(x).astype(np.uint64)
    n = hi - lo
    if n <= k:
        return list(range(n))
    fits = n <= capacity
    fast = fits or (sample and 4 * k <= capacity)
    if fast:
        E, promising, single = 0, True, False
        if not fits:
            E, promising, single = sample_threshold(keys, lo, n, k, capacity, max_samples)
        win = keys[lo:hi]
        if promising:
            passing = np.nonzero(win >= E)[0]
            if k <= len(passing) <= capacity:
                return finish(win[passing], passing, k)
        elif single:  # a plateau at V = E: the keys above V, then the first keys equal to V
            passing = np.nonzero(win > E)[0]
            if len(passing) <= capacity:
                if len(passing) >= k:
                    return finish(win[passing], passing, k)
                ties = np.nonzero(win == E)[0][: k - len(passing)]
                if len(ties) == k - len(passing):
                    return sorted([int(c) for c in passing] + [int(c) for c in ties])
    return exact_row(keys[lo:hi], k, capacity)


def exact_row(win, k, capacity):
    cols = np.arange(len(win))
    prefix, mask, krem, count = 0, 0, k, len(win)
    shifts, masks = (21, 10, 0), (0xFFE00000, 0xFFFFFC00, 0xFFFFFFFF)
    for level in range(3):
        sel = (win & mask) == prefix
        digits = (win[sel] >> shifts[level]) & 0x7FF
        hist = np.bincount(digits.astype(np.int64), minlength=BINS)
        acc = 0
        for b in range(BINS - 1, -1, -1):
            if acc < krem <= acc + int(hist[b]):
                break
            acc += int(hist[b])
        in_bin = win[sel][digits == b]
        prefix |= b << shifts[level]
        mask = masks[level]
        krem -= acc
        count = int(hist[b])
        if count == krem or count <= capacity:
            break
        if int(np.bitwise_or.reduce(in_bin)) == int(np.bitwise_and.reduce(in_bin)):  # one value
            prefix, mask = int(in_bin[0]), 0xFFFFFFFF
            break
    out = [int(c) for c in cols[(win & mask) > prefix]]
    in_bin = (win & mask) == prefix
    if count == krem:
        return sorted(out + [int(c) for c in cols[in_bin]])
    if count <= capacity:
        return sorted(out + finish(win[in_bin], cols[in_bin], krem))
    return sorted(out + [int(c) for c in cols[in_bin][:krem]])  # ordered ties: the first ones


def rows(g):
    w = 5000
    yield torch.randn(w, generator=g)
    yield torch.full((w,), 0.6875)
    yield torch.relu(torch.randn(w, generator=g) - 2.5)
    yield torch.randint(0, 8, (w,), generator=g).float()
    yield 1.0 + 0.245 * torch.rand(w, generator=g)
    yield torch.sort(torch.randn(w, generator=g)).values  # ascending: the sample is all that helps
    x = torch.randn(w, generator=g)
    u = torch.rand(w, generator=g)
    yield torch.where(u < 0.1, float("nan"), torch.where(u > 0.95, float("inf"), x))
    # Hostile to the sample: the full window's sampled runs hold the only large values, so the
    # threshold passes fewer than k keys and the row must go to the exact fallback.
    x = torch.rand(w, generator=g)
    x[filter_sample_positions(w, sample_count(w, 1024))] += 10.0
    yield x


@pytest.mark.parametrize("k", [1, 64, 300])
@pytest.mark.parametrize("sample", [True, False])
def test_filter_row_model_matches_reference(k, sample):
    g = torch.Generator().manual_seed(k)
    for x in rows(g):
        for lo, hi in ((0, len(x)), (7, len(x) - 3), (100, 100 + k + 1)):
            # small buffer and sample sizes, so 5000-key windows take the sampled path and overflow
            got = filter_row(x, k, lo, hi, capacity=1200, max_samples=1024, sample=sample)
            ref = window_topk(x[None, :], k, torch.tensor([hi - lo]), torch.tensor([lo]))[0]
            want = sorted(int(i) for i in ref.tolist() if i >= 0)
            assert got == want, (k, lo, hi)


@pytest.mark.parametrize("k", [1500, 2048])
def test_filter_retry_rows_take_the_paths_they_name(k):
    """dsa_ops.testing.filter_retry_rows, on the kernel's own sizes (8192-pair buffer, 16384 samples at
    most): row 0's first attempt leaves fewer than k candidates and the wider one between k and the
    buffer; row 1's attempts both leave fewer than k (the exact fallback). If the kernel's sampling
    changes and this fails, the GPU tests and the sanitizer script do not reach the retry."""
    x = filter_retry_rows()
    n = x.shape[1]
    for row, retry_finishes in ((0, True), (1, False)):
        keys = float_keys(x[row]).astype(np.uint64)
        E, promising, _ = sample_threshold(keys, 0, n, k, 8192, 16384)
        assert promising and int((keys >= E).sum()) < k, row
        E, promising, _ = sample_threshold(keys, 0, n, k, 8192, 16384, wide=True)
        passing = int((keys >= E).sum())
        assert promising and (k <= passing <= 8192 if retry_finishes else passing < k), (row, passing)


@pytest.mark.parametrize("n", [131072, 134868, 262144, 1048576])
def test_spread_rows_half_samples_still_fit(n):
    """A spread split row samples as a window of n / 2 (the kernel's sample_threshold): on normal rows,
    fp32 and bf16-rounded, its first attempt must stay promising with k to a buffer's worth of
    candidates in every CTA's part, at 4 and 8 CTAs (else decode rows would retry or fall back)."""
    g = torch.Generator().manual_seed(n)
    for dtype in (torch.float32, torch.bfloat16):
        for _ in range(3):
            keys = float_keys(torch.randn(n, generator=g).to(dtype).float()).astype(np.uint64)
            E, promising, _ = sample_threshold(keys, 0, n, 2048, 8192, 16384, spread=True)
            assert promising and int((keys >= E).sum()) >= 2048, (n, dtype)
            for csize in (4, 8):
                part = -(-n // csize)
                assert max(int((keys[c * part:(c + 1) * part] >= E).sum()) for c in range(csize)) <= 8192


@pytest.mark.parametrize("n", [8193, 16384, 32768, 49152])
def test_narrow_rows_first_attempt_fits(n):
    """The narrow shape (256 threads, 4608-pair buffer, 2048 to 8192 samples; topk_heuristics::narrow_rows:
    8193 to 49152 keys, k <= 2048): on normal rows, fp32 and bf16-rounded, the first sampled attempt is
    promising and leaves k to a buffer's worth of candidates (else those rows would retry or fall back)."""
    g = torch.Generator().manual_seed(n)
    for dtype in (torch.float32, torch.bfloat16):
        for _ in range(5):
            keys = float_keys(torch.randn(n, generator=g).to(dtype).float()).astype(np.uint64)
            for k in (64, 2048):
                E, promising, _ = sample_threshold(keys, 0, n, k, 4608, 8192, min_samples=2048, threads=256)
                assert promising and k <= int((keys >= E).sum()) <= 4608, (n, dtype, k)


INF_KEY = 0xFF800000  # the kernel's kInfKey: +inf's key


def one_round_outcome(keys, n, k, capacity, max_samples, min_samples, threads, one_value_shift):
    """What a one-CTA row's first attempt does with its candidates (filter_row, finish): "skip" when it
    does not bin them (not promising, a plateau value, +inf among the samples, or too few or too many
    candidates), else the one-round select's threshold bin among 2048 bins over [E, the samples' largest
    key]: "top" and "big" send the row to the candidates' own select, "whole" and "rank" finish from it."""
    E, promising, single = sample_threshold(keys, 0, n, k, capacity, max_samples, min_samples=min_samples,
                                            threads=threads)
    S = sample_count(n, max_samples, min_samples)
    smax = int(keys[filter_sample_positions(n, S).numpy()].max())
    cand = keys[keys >= E].astype(np.int64)
    if not promising or single or smax >= INF_KEY or not k <= len(cand) <= capacity:
        return "skip"
    shift = first_shift(smax - E) if smax > E else 0
    hist = np.bincount(np.minimum((cand - E) >> shift, BINS - 1), minlength=BINS)
    prefix, _, krem, count = refine_at(hist, shift, (0, 0, k, len(cand)))
    if prefix >> shift == BINS - 1:
        return "top"
    if count == krem:
        return "whole"
    return "rank" if count <= (RANK_BIN if shift <= one_value_shift else WARP_BIN) else "big"


@pytest.mark.parametrize("n", [8193, 32768, 49152, 131072])
def test_one_cta_one_round_takes_normal_rows(n):
    """The one-round select's premise (kernels/topk_filter.cu, filter_row): on normal rows, fp32 and
    bf16-rounded, in the narrow shape (up to 49152 keys) and the wide one, the first attempt bins its
    candidates and the threshold bin is taken whole or ranked (k = 2048 every row; k = 64 most rows:
    its k-th largest can lie above every sample, the top bin), so the row skips the candidates' select."""
    narrow = n <= 49152
    capacity, max_samples, min_samples, threads = (4608, 8192, 2048, 256) if narrow else (8192, 16384, None, 512)
    g = torch.Generator().manual_seed(n + 1)
    for dtype, one_value_shift in ((torch.float32, -1), (torch.bfloat16, 16)):
        seen = []
        for _ in range(5):
            keys = float_keys(torch.randn(n, generator=g).to(dtype).float()).astype(np.uint64)
            for k in (64, 2048):
                o = one_round_outcome(keys, n, k, capacity, max_samples, min_samples, threads, one_value_shift)
                assert k == 64 or o in ("whole", "rank"), (n, dtype, k, o)
                seen.append(o)
        assert sum(o in ("whole", "rank") for o in seen) >= 9, (n, dtype, seen)


# ---- the filter pass's vector bookkeeping ------------------------------------------------------------

def filter_vectors(lo_mis: int, n: int, items: int, threads: int, stages: int, round_vecs: int,
                   csize: int = 1, rank: int = 0, warp: int = 32):
    """The filter pass's schedule for a window [lo, lo + n) whose lo sits lo_mis items past a 16-byte
    boundary a0: (vectors the rounds read, with each read's round kind, vectors the partial step reads,
    vectors the unchecked rounds issue), as filter_pass_as runs it. csize > 1: CTA `rank` of a split
    row, which takes the window's chunks of `warp` vectors (one a warp) in turn (FilterStages)."""
    vf = 0 if lo_mis == 0 else 1
    ve = (lo_mis + n) // items  # vectors wholly inside: [vf, ve)
    vecs = -(-(lo_mis + n) // items)
    if csize == 1:
        step = threads
        vec = lambda s, tid: s * threads + tid  # noqa: E731
    else:
        step = threads * csize
        vec = lambda s, tid: ((tid // warp) * csize + rank) * warp + tid % warp + s * step  # noqa: E731
    rounds = -(-vecs // step)
    read, issued_unchecked = [], []
    for s0 in range(0, rounds, round_vecs):
        unchecked = (s0 > 0 or vf == 0) and (s0 + stages + round_vecs) * step <= ve
        for h in range(round_vecs):
            for tid in range(threads):
                v = vec(s0 + h, tid)
                if unchecked or vf <= v < ve:
                    read.append((v, unchecked))
                if unchecked:
                    issued_unchecked.append(vec(s0 + stages + h, tid))
    partial = []
    if csize == 1 or rank == 0:  # (warp 0 of rank 0)
        partial = [0] if vf == 1 else []  # lane 0
        if ve < vecs and ve >= vf:
            partial.append(ve)  # lane 1 (ve < vf: the window lies inside vector 0, lane 0's)
    return read, partial, issued_unchecked, (vf, ve, vecs)


@pytest.mark.parametrize("items,round_vecs", [(4, 4), (8, 2)])  # fp32, 16-bit scores
def test_filter_pass_reads_every_vector_once(items, round_vecs):
    threads, stages = 8, 4  # (the kernel's 512 threads, scaled down: same arithmetic)
    for lo_mis in range(items):
        for n in list(range(1, 6 * items)) + list(range(threads * items - 3, threads * items * 12, 7)):
            read, partial, issued, (vf, ve, vecs) = filter_vectors(lo_mis, n, items, threads, stages, round_vecs)
            got = sorted([v for v, _ in read] + partial)
            assert got == list(range(vecs)), (lo_mis, n)  # each vector once: the rounds' or the partial step's
            assert all(vf <= v < ve for v, unchecked in read if unchecked), (lo_mis, n)
            assert all(vf <= v < ve for v in issued), (lo_mis, n)  # unchecked rounds issue inside only
            assert all(not (vf <= v < ve) for v in partial), (lo_mis, n)  # partial vectors are partial


@pytest.mark.parametrize("items,round_vecs", [(4, 4), (8, 2)])  # fp32, 16-bit scores
@pytest.mark.parametrize("csize", [2, 3, 5, 8])
def test_split_row_chunks_cover_the_window_once(items, round_vecs, csize):
    """A split row's CTAs deal the window's chunks (FilterStages, kInterleaved): every vector is read by
    exactly one CTA, in its rounds or in rank 0's partial step, and no unchecked round reads or issues
    a vector outside [vf, ve)."""
    threads, stages, warp = 8, 4, 4  # (512 threads of 32-lane warps, scaled down: same arithmetic)
    for lo_mis in range(items):
        for n in list(range(1, 6 * items)) + list(range(threads * items - 3, threads * items * csize * 9, 11)):
            got = []
            for rank in range(csize):
                read, partial, issued, (vf, ve, vecs) = filter_vectors(lo_mis, n, items, threads, stages,
                                                                       round_vecs, csize, rank, warp)
                got += [v for v, _ in read] + partial
                assert all(vf <= v < ve for v, unchecked in read if unchecked), (lo_mis, n, rank)
                assert all(vf <= v < ve for v in issued), (lo_mis, n, rank)
            assert sorted(got) == list(range(vecs)), (lo_mis, n, csize)
