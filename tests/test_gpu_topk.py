"""GPU tests of the CUDA top-k family against the exact reference: the ordered kernel
(backends_cuda/kernels/topk.cu, deterministic=True) and the filter kernel (kernels/topk_filter.cu, the
default).

The reference (dsa_ops.ops._common.window_topk, map_through_page_table) runs on the GPU tensors
themselves. Order inside a row is unspecified unless deterministic=True, so the plain calls are compared
as sets (each row sorted) and deterministic=True exactly; a test that compares rows exactly passes
deterministic=True.
Run on the H200: `pytest -m gpu tests/test_gpu_topk.py`.

Few long rows are split over a thread-block cluster by default, and long rows try a sampled threshold
first (sm90_topk_heuristics.cuh). DSA_OPS_TOPK_CLUSTER forces the CTAs per row and
DSA_OPS_TOPK_SAMPLE=0 turns sampling off (the filter kernel then runs its exact fallback), so the
`cluster` fixtures below reach every path of both kernels on the same inputs: the heuristics' choice,
one CTA per row with and without sampling, 8-CTA clusters with and without sampling. The launcher reads
the two at its first launch and when told (torch.ops.dsa_cuda.topk_read_env): _mode tells it after
setting them, and _overrides_follow_env after each test, once monkeypatch has put them back.
"""

from __future__ import annotations

import dsa_ops
import pytest
import torch
from dsa_ops.ops._common import INT32_MAX, map_through_page_table, window_topk
from dsa_ops.ops.topk_ragged_transform import reference as ragged_reference
from dsa_ops.testing import filter_retry_rows, filter_sample_positions, topk_scores

pytestmark = pytest.mark.gpu
DEV = "cuda"
POISON = 0x7AAAAAAA
CLUSTER_ENV = "DSA_OPS_TOPK_CLUSTER"
SAMPLE_ENV = "DSA_OPS_TOPK_SAMPLE"


def _read_env():
    """Have the loaded library re-read the two variables (one loaded later reads them at its first launch)."""
    if hasattr(torch.ops.dsa_cuda, "topk_read_env"):
        torch.ops.dsa_cuda.topk_read_env()


@pytest.fixture(autouse=True)
def _overrides_follow_env():
    # (autouse: set up before monkeypatch, so torn down after it has restored the environment)
    yield
    _read_env()


def _mode(monkeypatch, mode):
    """auto: the heuristics; "1": one CTA per row (long rows try the sampled threshold first);
    "1-nosample": one CTA per row, plain stream path; "8": rows split over 8-CTA clusters."""
    monkeypatch.delenv(CLUSTER_ENV, raising=False)
    monkeypatch.delenv(SAMPLE_ENV, raising=False)
    if mode != "auto":
        monkeypatch.setenv(CLUSTER_ENV, mode.split("-")[0])
    if mode.endswith("nosample"):
        monkeypatch.setenv(SAMPLE_ENV, "0")
    _read_env()
    return mode


@pytest.fixture(params=["auto", "1", "1-nosample"])
def cluster(request, monkeypatch):
    return _mode(monkeypatch, request.param)


@pytest.fixture(params=["auto", "1", "1-nosample", "8", "8-nosample"])
def cluster3(request, monkeypatch):
    return _mode(monkeypatch, request.param)


def as_pair_sets(raw: torch.Tensor, mapped: torch.Tensor) -> torch.Tensor:
    """Each row's (raw, mapped) pairs as int64 (raw in the high word), sorted: equal for two outputs that
    pair the same raw indices with the same mapped ones, in any order."""
    pairs = (raw.long() << 32) | (mapped.long() & 0xFFFFFFFF)
    return torch.sort(pairs, dim=1).values


def as_sets(x: torch.Tensor) -> torch.Tensor:
    """Each row's entries sorted, -1s last: equal for two outputs that hold the same multiset per row."""
    big = torch.where(x == -1, torch.full_like(x, INT32_MAX, dtype=torch.int64), x.long())
    s, _ = torch.sort(big, dim=1)
    return s


def cuda_topk(scores, k, lengths=None, row_starts=None, deterministic=False):
    with dsa_ops.use_backend("cuda"):
        return dsa_ops.topk(scores, k, lengths=lengths, row_starts=row_starts, deterministic=deterministic)


def check_topk(scores, k, lengths=None, row_starts=None, what=""):
    ref = window_topk(scores, k, lengths, row_starts)
    got = cuda_topk(scores, k, lengths, row_starts)
    assert got.shape == ref.shape and got.dtype == torch.int32
    bad = (as_sets(got) != as_sets(ref)).any(dim=1)
    assert not bad.any(), f"{what}: rows {bad.nonzero().flatten()[:8].tolist()} differ (as sets)"
    got_d = cuda_topk(scores, k, lengths, row_starts, deterministic=True)
    bad = (got_d != ref).any(dim=1)
    assert not bad.any(), f"{what}: rows {bad.nonzero().flatten()[:8].tolist()} differ (deterministic)"


def gen_rows(dist: str, rows: int, width: int, dtype, g: torch.Generator) -> torch.Tensor:
    return topk_scores(dist, rows, width, dtype, generator=g, device=DEV)


DISTS = ["normal", "equal", "zeros", "mostly_zero", "ties", "narrow", "big", "nan_inf", "signed_zero", "walk"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Widths: the shared-memory list path (3000, 40000; after the first level the keys at or above the
# threshold bin are compacted into a candidate area after the list when they fit: k=2048 at 40000
# normally does, k=2048 at 3000 and the tie-heavy distributions fall back to full-list levels); the
# stream path (70000: rows wider than the shared memory; its candidate buffer or the full rescan,
# depending on the data).
SHAPES = [(8, 3000), (3, 40000), (3, 70000)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("dist", DISTS)
def test_distributions(dist, dtype, shape, cluster):
    g = torch.Generator(device=DEV).manual_seed(100 * DISTS.index(dist) + SHAPES.index(shape))
    x = gen_rows(dist, *shape, dtype, g)
    for k in (1, 7, 64, 2048):
        check_topk(x, k, what=f"{dist} {dtype} {shape} k={k}")


# The filter kernel's narrow shape (256 threads, four CTAs an SM: topk_heuristics::narrow_rows) takes
# many rows (three a SM or more) of 8193 to 49152 keys, k <= 2048.
NARROW = [(torch.float32, 8200), (torch.float32, 49152), (torch.bfloat16, 30000), (torch.float16, 20000)]


def narrow_rows() -> int:
    return 6 * torch.cuda.get_device_properties(DEV).multi_processor_count


@pytest.mark.parametrize("dtype_width", NARROW, ids=lambda d: f"{str(d[0]).replace('torch.', '')}-{d[1]}")
@pytest.mark.parametrize("dist", DISTS)
def test_narrow_rows_distributions(dist, dtype_width, cluster):
    dtype, width = dtype_width
    g = torch.Generator(device=DEV).manual_seed(1000 + 10 * DISTS.index(dist) + NARROW.index(dtype_width))
    x = gen_rows(dist, narrow_rows(), width, dtype, g)
    for k in (1, 64, 2048):
        check_topk(x, k, what=f"narrow {dist} {dtype} {width} k={k}")


def test_narrow_rows_windows_and_forms(cluster):
    """The narrow shape with windows (edges as test_windows), a non-contiguous row stride, and the
    page-table and ragged forms."""
    g = torch.Generator(device=DEV).manual_seed(13)
    rows, width = narrow_rows(), 30000
    base = torch.randint(0, 200, (rows, width + 5), device=DEV, generator=g).float()
    x = base[:, 2:2 + width]
    starts = torch.randint(-width // 2, width + 100, (rows,), device=DEV, dtype=torch.int32, generator=g)
    lengths = torch.randint(-100, width + 100, (rows,), device=DEV, dtype=torch.int32, generator=g)
    starts[:12] = torch.tensor([0, 0, 10, -5, width - 3, width, width + 7, -2**31, 2**31 - 1, -7, 0, 0])
    lengths[:12] = torch.tensor([0, -9, 64, 100, 100, 5, 5, 2**31 - 1, 2**31 - 1, 2**31 - 1, 2048, 2049])
    for k in (64, 2048):
        check_topk(x, k, lengths, starts, what=f"narrow windows k={k}")
    full = torch.full((rows,), width, dtype=torch.int32, device=DEV)
    table = torch.randint(0, 1 << 20, (rows, (width + 63) // 64), dtype=torch.int32, device=DEV, generator=g)
    raw = window_topk(x, 2048, full, None)
    out_raw = torch.full((rows, 2048), POISON, device=DEV, dtype=torch.int32)
    with dsa_ops.use_backend("cuda"):
        out = dsa_ops.topk_page_table_transform(x, table, full, 2048, page_size=64, out_raw=out_raw)
    want = map_through_page_table(raw, table, None, None, 64)
    assert torch.equal(as_pair_sets(out_raw, out), as_pair_sets(raw, want))
    # windows, batches (some outside the table), shifted table rows, an odd table stride and pages of 16
    # (1875 slots a row: the lookups of a long window in small pages)
    table = torch.randint(-2, 1 << 20, (7, width // 16 + 5), dtype=torch.int32, device=DEV, generator=g)
    rtb = torch.randint(-1, 8, (rows,), device=DEV, dtype=torch.int32, generator=g)
    ptrs = torch.randint(-40, 40, (rows,), device=DEV, dtype=torch.int32, generator=g)
    raw = window_topk(x, 2048, lengths, starts)
    with dsa_ops.use_backend("cuda"):
        out = dsa_ops.topk_page_table_transform(x, table, lengths, 2048, page_size=16, out_raw=out_raw,
                                                row_starts=starts, row_to_batch=rtb, page_table_row_starts=ptrs)
    want = map_through_page_table(raw, table, rtb, ptrs, 16)
    assert torch.equal(as_pair_sets(out_raw, out), as_pair_sets(raw, want))
    offsets = torch.randint(-1000, 1 << 20, (rows,), device=DEV, dtype=torch.int32, generator=g)
    with dsa_ops.use_backend("cuda"):
        got = dsa_ops.topk_ragged_transform(x, offsets, full, 2048)
    assert torch.equal(as_sets(got), as_sets(ragged_reference(x, offsets, full, 2048, None)))


def test_one_cta_one_round_outcomes(cluster):
    """A one-CTA row's one-round select (its candidates binned on the sampled range [E, the samples'
    largest key], 2048 bins) on rows built for each outcome, in the narrow shape (auto: 6 x SMs rows) and
    the wide one ("1"): normal rows (a small threshold bin, ranked or taken whole); 2500 unsampled keys
    above every sample (the k-th largest in the top bin: the candidates' own select); 3000 unsampled
    distinct keys packed in [2, 2 + 1e-4) (a threshold bin of thousands of mixed values: the same);
    and +inf in the samples (no binning)."""
    width, samples = 32768, 2048
    at = filter_sample_positions(width, samples)
    unsampled = torch.ones(width, dtype=torch.bool)
    unsampled[at] = False
    free = unsampled.nonzero().flatten().to(DEV)
    g = torch.Generator(device=DEV).manual_seed(21)
    rows = narrow_rows()
    x = torch.randn(rows, width, device=DEV, generator=g)
    for r in range(1, rows, 4):
        cols = free[torch.randperm(len(free), device=DEV, generator=g)[:2500]]
        x[r, cols] = 10.0 + torch.rand(2500, device=DEV, generator=g)
    for r in range(2, rows, 4):
        cols = free[torch.randperm(len(free), device=DEV, generator=g)[:3000]]
        x[r, cols] = 2.0 + 1e-4 * torch.rand(3000, device=DEV, generator=g)
    x[3::4, at[5]] = float("inf")
    for k in (64, 2048):
        check_topk(x, k, what=f"one-CTA one-round outcomes k={k}")


def test_plateau_the_sample_overstates(cluster3):
    """The filter kernel's sampled runs (2048 samples in runs of 16 for a 40000-key window) hold a value
    V that the rest of the row lacks: to the sample V is a plateau, yet the row has fewer keys equal to
    V (1024) than k = 2048 needs, so the plateau path must notice and redo the row exactly."""
    width, samples = 40000, 2048
    at = filter_sample_positions(width, samples)
    g = torch.Generator().manual_seed(7)
    x = torch.rand(3, width, generator=g)
    x[:, at[: samples // 2]] = 5.0
    x = x.to(DEV)
    for k in (1, 64, 1024, 1025, 2048):
        check_topk(x, k, what=f"k={k}")


def test_sample_misses_then_retry(cluster3):
    """The filter kernel's second sampled attempt: rows whose sampled runs overstate their top
    (dsa_ops.testing.filter_retry_rows): one finished by the wider retry, one by the exact fallback after
    both attempts miss."""
    x = filter_retry_rows().to(DEV)
    for k in (1500, 2048):
        check_topk(x, k, what=f"k={k}")


def test_list_candidates_compacted_or_not(cluster3):
    # 4096x32768-like rows (the main benchmark shape, list path with compaction) with the
    # distributions that overflow the candidate area (plateaus, ties) or barely fit it.
    g = torch.Generator(device=DEV).manual_seed(13)
    for dist in ("normal", "equal", "mostly_zero", "ties", "narrow", "nan_inf", "signed_zero"):
        x = gen_rows(dist, 6, 32768, torch.float32, g)
        x[5] = torch.randn(32768, device=DEV, generator=g)
        x[5, ::4] = 1.5  # a heavy tie inside the threshold bin
        for k in (1, 2048, 4096, 7000):
            check_topk(x, k, what=f"{dist} 32768 k={k}")
    x = gen_rows("normal", 4, 32768, torch.bfloat16, g)
    check_topk(x, 2048, what="bf16 32768")


def test_k_4096_and_widths_across_the_smem_threshold(cluster):
    g = torch.Generator(device=DEV).manual_seed(3)
    for width in (2047, 2048, 2049, 4100, 8193, 24576, 24577, 50000, 55808, 55809, 57000, 100003):
        x = torch.randn(2, width, device=DEV, generator=g)
        for k in (64, 2048, 4096):
            check_topk(x, k, what=f"width={width} k={k}")


def test_windows(cluster3):
    g = torch.Generator(device=DEV).manual_seed(4)
    for width in (5000, 70000):
        rows = 64
        x = torch.randint(0, 50, (rows, width), device=DEV, generator=g).float()
        starts = torch.randint(-width // 2, width + 100, (rows,), device=DEV, dtype=torch.int32, generator=g)
        lengths = torch.randint(-100, width + 100, (rows,), device=DEV, dtype=torch.int32, generator=g)
        # edges: empty, negative length, past the end, negative start, int32 extremes, exactly k, k + 1
        starts[:12] = torch.tensor([0, 0, 10, -5, width - 3, width, width + 7, -2**31, 2**31 - 1, -7, 0, 0])
        lengths[:12] = torch.tensor([0, -9, 64, 100, 100, 5, 5, 2**31 - 1, 2**31 - 1, 2**31 - 1, 2048, 2049])
        for k in (1, 64, 2048):
            check_topk(x, k, lengths, starts, what=f"width={width} k={k}")
            check_topk(x, k, None, starts, what=f"width={width} k={k} no lengths")
            check_topk(x, k, lengths, None, what=f"width={width} k={k} no starts")


def test_empty_shapes():
    for rows, width in ((0, 100), (5, 0), (0, 0)):
        x = torch.randn(rows, width, device=DEV)
        check_topk(x, 8, what=f"{rows}x{width}")


def check_page_table_form(x, lengths, pt, k=2048, backend="cuda"):
    """The page-table form (page size 64) of the top k of each row's window against the reference's:
    the same (raw, mapped) pairs, both outputs poisoned before the call."""
    raw = window_topk(x, k, lengths)
    want = map_through_page_table(raw, pt, None, None, 64)
    out = torch.full((x.shape[0], k), POISON, device=x.device, dtype=torch.int32)
    out_raw = torch.full((x.shape[0], k), POISON, device=x.device, dtype=torch.int32)
    with dsa_ops.use_backend(backend):
        dsa_ops.topk_page_table_transform(x, pt, lengths, k, page_size=64, out=out, out_raw=out_raw)
    assert torch.equal(as_pair_sets(out_raw, out), as_pair_sets(raw, want))


def test_decode_rows_on_8_cta_clusters():
    # A few rows of 256K keys, each split over 8 CTAs by the heuristic: every distribution, both
    # finishes (the candidates gathered into rank 0, or kept by each CTA when they outnumber one
    # buffer), and the page-table form with shorter windows.
    g = torch.Generator(device=DEV).manual_seed(16)
    for dist in DISTS:
        for dtype in (torch.float32, torch.bfloat16):
            x = gen_rows(dist, 2, 1 << 18, dtype, g)
            for k in (64, 2048, 4096):
                check_topk(x, k, what=f"8-CTA {dist} {dtype} k={k}")
    x = torch.randn(3, 1 << 18, device=DEV, generator=g)
    lengths = torch.tensor([1 << 18, 200000, 150000], device=DEV, dtype=torch.int32)
    check_page_table_form(x, lengths, torch.randint(-1, 1 << 20, (3, 4200), device=DEV, dtype=torch.int32,
                                                    generator=g))


@pytest.mark.parametrize("csize", [2, 3, 4, 5])
def test_decode_rows_by_cluster_size(csize, monkeypatch):
    # Rows split over 2 to 5 CTAs: below kSpreadFinishMinCluster (4) rank 0 writes the gathered
    # candidates alone; from it up every CTA writes its own and sends its threshold-bin entries to
    # rank 0 (ranked, or split by column when they are ties of one key). Every distribution.
    _mode(monkeypatch, str(csize))
    g = torch.Generator(device=DEV).manual_seed(17 + csize)
    for dist in DISTS:
        for dtype in (torch.float32, torch.bfloat16):
            x = gen_rows(dist, 2, 1 << 17, dtype, g)
            check_topk(x, 2048, what=f"{csize}-CTA {dist} {dtype}")
    x = torch.randn(2, 1 << 17, device=DEV, generator=g)
    lengths = torch.tensor([1 << 17, 100000], device=DEV, dtype=torch.int32)
    check_page_table_form(x, lengths, torch.randint(-1, 1 << 20, (2, 2100), device=DEV, dtype=torch.int32,
                                                    generator=g))


@pytest.mark.parametrize("csize", [4, 8])
def test_split_rows_winners_in_one_cta(csize, monkeypatch):
    # A split row deals its window to its CTAs in chunks of 128 fp32 keys (kChunkVecs vectors): here every
    # winner lies in chunks that one CTA reads, so its warps take ~128 entries each and write them in
    # batches of four steps, while the other CTAs' warps take none (a spread row's warp otherwise takes
    # ~16-32 and writes them in one step). Both forms, and the winners' chunks dealt to rank 0 and to the
    # last rank.
    _mode(monkeypatch, str(csize))
    g = torch.Generator(device=DEV).manual_seed(60 + csize)
    w, k = 1 << 17, 2048
    x = torch.randn(2, w, device=DEV, generator=g)
    chunk = torch.arange(w, device=DEV) // 128
    for row, cta in ((0, 0), (1, csize - 1)):
        cols = torch.nonzero(chunk % csize == cta).flatten()
        pick = cols[torch.randperm(cols.numel(), device=DEV, generator=g)[:k + 100]]
        x[row, pick] = 10.0 + torch.rand(pick.numel(), device=DEV, generator=g)
    check_topk(x, k, what=f"{csize}-CTA winners in one CTA's chunks")
    lengths = torch.full((2,), w, device=DEV, dtype=torch.int32)
    check_page_table_form(x, lengths, torch.randint(-1, 1 << 20, (2, w // 64), device=DEV, dtype=torch.int32,
                                                    generator=g))


@pytest.mark.parametrize("csize", [2, 4, 8])
def test_split_rows_page_table_forms(csize, monkeypatch):
    # Split rows' page-table form with every option (each CTA writes its own outputs; at 2 CTAs rank 0
    # writes the gathered candidates): windows with starts (negative too), first table slots below 0 and
    # past the window's pages, batches outside the table, an odd table stride (table rows not 16-byte
    # aligned), pages of 16, 64 and 2^20 keys; windows of the whole row (rows 0 and 2: a length past the
    # row end), with bf16 and fp16 scores too.
    _mode(monkeypatch, str(csize))
    g = torch.Generator(device=DEV).manual_seed(50 + csize)
    rows, w, k, nb = 6, 1 << 17, 2048, 3
    x = torch.randn(rows, w, device=DEV, generator=g)
    x[3:] = x[3:].bfloat16().float()  # (ties of bf16 values in half the rows)
    lengths = torch.tensor([w, 100000, w + 50, 70001, 90000, w - 7], device=DEV, dtype=torch.int32)
    starts = torch.tensor([0, -5, 1000, 17, -3000, 3], device=DEV, dtype=torch.int32)
    rtb = torch.tensor([0, 2, 1, -1, 2, 3], device=DEV, dtype=torch.int32)
    for page_size in (16, 64, 1 << 20):
        max_pages = w // page_size + 11  # (odd for 16 and 64: every table row but the first misaligned)
        pt = torch.randint(-1, 1 << 20, (nb, max_pages), device=DEV, dtype=torch.int32, generator=g)
        ptrs = torch.tensor([0, -3, 5, 2, -(w // page_size) // 2, max_pages - 3], device=DEV, dtype=torch.int32)
        for kw in (dict(), dict(row_starts=starts, row_to_batch=rtb, page_table_row_starts=ptrs)):
            raw = window_topk(x, k, lengths, kw.get("row_starts"))
            want = map_through_page_table(raw, pt, kw.get("row_to_batch"), kw.get("page_table_row_starts"),
                                          page_size)
            out = torch.full((rows, k), POISON, device=DEV, dtype=torch.int32)
            out_raw = torch.full((rows, k), POISON, device=DEV, dtype=torch.int32)
            with dsa_ops.use_backend("cuda"):
                dsa_ops.topk_page_table_transform(x, pt, lengths, k, page_size=page_size, out=out, out_raw=out_raw,
                                                  **kw)
            assert torch.equal(as_pair_sets(out_raw, out), as_pair_sets(raw, want)), (csize, page_size, kw.keys())
    full = torch.full((rows,), w, device=DEV, dtype=torch.int32)
    for dtype in (torch.bfloat16, torch.float16):
        check_topk(x.to(dtype), k, full, what=f"{csize}-CTA {dtype}, whole-row windows")


@pytest.mark.parametrize("csize", [4, 8])
def test_spread_select_paths(csize, monkeypatch):
    # A spread row's select (hist_select: the CTAs' histograms summed slice by slice through distributed
    # shared memory, one level) on rows built for its outcomes: a threshold bin ranked by rank 0 (normal,
    # narrow, 1/64 steps); more than 256 ties of one value in the bin (integer scores: the cluster-wide
    # finish splits them by column); more than 256 mixed values in it (an +inf widens the candidates'
    # range so the bins are coarse: the cluster-wide finish runs more levels). k = 4096 takes the exact
    # fallback; DISTS' plateau rows in test_decode_rows_by_cluster_size take a bin whole.
    _mode(monkeypatch, str(csize))
    g = torch.Generator(device=DEV).manual_seed(30 + csize)
    w = 1 << 17
    x = torch.randn(6, w, device=DEV, generator=g)
    x[1] = torch.randint(0, 100, (w,), device=DEV, generator=g).float()
    x[2, 12345] = float("inf")
    x[3, ::64] = -float("inf")
    x[3, 7] = float("inf")
    x[4] = torch.randint(0, 5000, (w,), device=DEV, generator=g).float() / 64
    x[5] = 1.0 + 0.245 * torch.rand(w, device=DEV, generator=g)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for k in (1, 100, 2048, 4096):
            check_topk(x.to(dtype), k, what=f"{csize}-CTA spread select {dtype} k={k}")
    lengths = torch.tensor([w, 90000, 70001, w, 5000, 65536], device=DEV, dtype=torch.int32)
    check_topk(x, 2048, lengths, what=f"{csize}-CTA spread select, windows")


def test_million_key_rows(cluster):
    g = torch.Generator(device=DEV).manual_seed(5)
    w = 1 << 20
    x = torch.randn(4, w, device=DEV, generator=g)
    x[1] = torch.rand(w, device=DEV, generator=g)  # uniform: a wide top bin
    x[2] = torch.randint(0, 3, (w,), device=DEV, generator=g).float()  # ties: the full rescan path
    x[3] = 1.0 + 0.245 * torch.rand(w, device=DEV, generator=g)
    for k in (2048, 4096):
        check_topk(x, k, what=f"1M fp32 k={k}")
    check_topk(x.bfloat16(), 2048, what="1M bf16")
    lengths = torch.tensor([w, 700000, 5000, 1], device=DEV, dtype=torch.int32)
    starts = torch.tensor([0, 300000, w - 2000, 17], device=DEV, dtype=torch.int32)
    check_topk(x, 2048, lengths, starts, what="1M windows")


def test_many_short_rows():
    g = torch.Generator(device=DEV).manual_seed(6)
    rows = 150000
    x = torch.randn(rows, 300, device=DEV, generator=g)
    lengths = torch.randint(0, 300, (rows,), device=DEV, dtype=torch.int32, generator=g)
    check_topk(x, 16, what="150000 rows")
    check_topk(x, 16, lengths, what="150000 rows, lengths")
    check_topk(x, 2048, what="150000 rows, k > width")


def test_non_contiguous_rows(cluster3):
    g = torch.Generator(device=DEV).manual_seed(7)
    for dtype in DTYPES:
        for width, pad, off in ((3000, 17, 1), (70000, 5, 3), (40000, 1, 0)):
            base = torch.randn(5, width + pad, device=DEV, generator=g).to(dtype)
            x = base[:, off:off + width]  # row stride width + pad, unaligned row starts
            assert not x.is_contiguous()
            check_topk(x, 64, what=f"strided {dtype} {width}")
            check_topk(x, 2048, what=f"strided {dtype} {width}")


def test_many_rows_mixed(cluster):
    """More rows than the SMs hold CTAs, of every kind one after the other (sampled, plateau, fitting the
    buffer, shorter than k, empty), at odd starts in a strided tensor of each dtype."""
    g = torch.Generator(device=DEV).manual_seed(12)
    rows, width = 700, 20000
    kinds = ["normal", "mostly_zero", "ties", "equal", "nan_inf", "narrow"]
    for dtype in DTYPES:
        parts = [gen_rows(kinds[i % len(kinds)], 1, width + 3, torch.float32, g) for i in range(rows)]
        base = torch.cat(parts).to(dtype)
        x = base[:, 1:1 + width]  # row stride width + 3, unaligned rows
        starts = torch.randint(0, 2000, (rows,), device=DEV, dtype=torch.int32, generator=g) | 1
        lengths = torch.randint(9000, width, (rows,), device=DEV, dtype=torch.int32, generator=g)
        lengths[::7] = 5000  # fits the candidate buffer
        lengths[::11] = 100  # shorter than k
        lengths[::13] = -1  # empty
        for k in (64, 2048):
            check_topk(x, k, lengths, starts, what=f"mixed rows {dtype} k={k}")
        check_topk(x, 2048, what=f"mixed rows {dtype} whole rows")


def test_outputs_poisoned_before_the_call(cluster3):
    g = torch.Generator(device=DEV).manual_seed(8)
    for rows, width, k in ((37, 5000, 64), (5, 70000, 2048), (9, 100, 2048)):
        x = torch.randn(rows, width, device=DEV, generator=g)
        lengths = torch.randint(-5, width + 5, (rows,), device=DEV, dtype=torch.int32, generator=g)
        pt = torch.randint(0, 1000, (rows, width // 64 + 1), device=DEV, dtype=torch.int32, generator=g)
        out = torch.full((rows, k), POISON, device=DEV, dtype=torch.int32)
        out_raw = torch.full((rows, k), POISON, device=DEV, dtype=torch.int32)
        with dsa_ops.use_backend("cuda"):
            dsa_ops.topk_page_table_transform(x, pt, lengths, k, deterministic=True, out=out, out_raw=out_raw)
        raw = window_topk(x, k, lengths)  # exact comparisons below: ascending rows need deterministic=True
        assert torch.equal(out_raw, raw)
        assert torch.equal(out, map_through_page_table(raw, pt, None, None, 64))
        # the functional form: its output lands in the just-freed poisoned block
        del out, out_raw
        junk = torch.full((rows * k,), POISON, device=DEV, dtype=torch.int32)
        del junk
        check_topk(x, k, lengths, what="poisoned functional")


def _page_case(g, rows, width, k, page_size, nb=5):
    x = torch.randint(0, 20, (rows, width), device=DEV, generator=g).float()
    lengths = torch.randint(-3, width + 3, (rows,), device=DEV, dtype=torch.int32, generator=g)
    starts = torch.randint(-10, 50, (rows,), device=DEV, dtype=torch.int32, generator=g)
    max_pages = width // min(page_size, 1 << 12) + 3
    hi = min(2**31 // page_size + 5, INT32_MAX)
    pt = torch.randint(-2, hi, (nb, max_pages), device=DEV, dtype=torch.int32, generator=g)
    rtb = torch.randint(-1, nb + 1, (rows,), device=DEV, dtype=torch.int32, generator=g)
    ptrs = torch.randint(-2, 3, (rows,), device=DEV, dtype=torch.int32, generator=g)
    return x, lengths, starts, pt, rtb, ptrs


@pytest.mark.parametrize("page_size", [1, 16, 64, 2**31])
def test_page_table_transform(page_size, cluster):
    g = torch.Generator(device=DEV).manual_seed(9)
    for rows, width, k in ((40, 5000, 64), (6, 70000, 2048), (10, 300, 2048)):
        x, lengths, starts, pt, rtb, ptrs = _page_case(g, rows, width, k, page_size)
        for kw in (dict(), dict(row_starts=starts, row_to_batch=rtb, page_table_row_starts=ptrs)):
            raw = window_topk(x, k, lengths, kw.get("row_starts"))
            want = map_through_page_table(raw, pt, kw.get("row_to_batch"), kw.get("page_table_row_starts"),
                                          page_size)
            # outputs with a row stride wider than k
            out = torch.full((rows, k + 3), POISON, device=DEV, dtype=torch.int32)[:, :k]
            out_raw = torch.full((rows, k + 5), POISON, device=DEV, dtype=torch.int32)[:, 2:k + 2]
            with dsa_ops.use_backend("cuda"):
                got = dsa_ops.topk_page_table_transform(x, pt, lengths, k, page_size=page_size,
                                                        deterministic=True, out=out, out_raw=out_raw, **kw)
                functional = dsa_ops.topk_page_table_transform(x, pt, lengths, k, page_size=page_size, **kw)
            assert got is out
            assert torch.equal(out_raw, raw), (rows, width, k, kw.keys())
            assert torch.equal(out, want), (rows, width, k, kw.keys())
            # order unspecified without deterministic: compare the mapped indices per row, and with out_raw
            # the (raw, mapped) pairs, each raw index beside its own mapping
            assert torch.equal(as_sets(functional), as_sets(want))
            out.fill_(POISON)
            out_raw.fill_(POISON)
            with dsa_ops.use_backend("cuda"):
                dsa_ops.topk_page_table_transform(x, pt, lengths, k, page_size=page_size, out=out, out_raw=out_raw,
                                                  **kw)
            assert torch.equal(as_pair_sets(out_raw, out), as_pair_sets(raw, want)), (rows, width, k, kw.keys())


def test_ragged_transform(cluster):
    g = torch.Generator(device=DEV).manual_seed(10)
    for rows, width, k in ((40, 5000, 64), (6, 70000, 2048), (10, 300, 2048)):
        x = torch.randn(rows, width, device=DEV, generator=g)
        lengths = torch.randint(-3, width + 3, (rows,), device=DEV, dtype=torch.int32, generator=g)
        starts = torch.randint(-10, 50, (rows,), device=DEV, dtype=torch.int32, generator=g)
        offsets = torch.randint(-1000, 1 << 20, (rows,), device=DEV, dtype=torch.int32, generator=g)
        offsets[0], offsets[1] = INT32_MAX - 10, -(2**31)
        for st in (None, starts):
            want = ragged_reference(x, offsets, lengths, k, st)
            with dsa_ops.use_backend("cuda"):
                got = dsa_ops.topk_ragged_transform(x, offsets, lengths, k, row_starts=st)
            # (the filter kernel: order unspecified; an offset sum past int32 is -1 in any position)
            assert torch.equal(as_sets(got), as_sets(want))


def test_repeatable_bits(cluster):
    g = torch.Generator(device=DEV).manual_seed(11)
    x = torch.randint(0, 4, (64, 40000), device=DEV, generator=g).float()
    y = torch.randint(0, 4, (4, 200000), device=DEV, generator=g).float()
    first_x = cuda_topk(x, 2048, deterministic=True)
    first_y = cuda_topk(y, 2048, deterministic=True)
    for _ in range(100):
        assert torch.equal(cuda_topk(x, 2048, deterministic=True), first_x)
        assert torch.equal(cuda_topk(y, 2048, deterministic=True), first_y)
    assert torch.equal(first_x, window_topk(x, 2048))
    assert torch.equal(first_y, window_topk(y, 2048))


def test_cuda_graph_and_side_stream(cluster):
    g = torch.Generator(device=DEV).manual_seed(12)
    x = torch.randn(16, 70000, device=DEV, generator=g)
    lengths = torch.randint(0, 70000, (16,), device=DEV, dtype=torch.int32, generator=g)
    out = torch.empty(16, 2048, device=DEV, dtype=torch.int32)
    out_any = torch.empty(16, 2048, device=DEV, dtype=torch.int32)
    pt = torch.arange(16 * 1100, device=DEV, dtype=torch.int32).view(16, 1100)
    with dsa_ops.use_backend("cuda"):
        dsa_ops.topk_page_table_transform(x, pt, lengths, 2048, out=out)  # warm-up (build, attributes)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=s):
                dsa_ops.topk_page_table_transform(x, pt, lengths, 2048, deterministic=True, out=out)
                dsa_ops.topk_page_table_transform(x, pt, lengths, 2048, out=out_any)  # the filter kernel
        torch.cuda.current_stream().wait_stream(s)
    for _ in range(2):
        x.copy_(torch.randn(16, 70000, device=DEV, generator=g))
        lengths.copy_(torch.randint(0, 70000, (16,), device=DEV, dtype=torch.int32, generator=g))
        out.fill_(POISON)
        out_any.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        raw = window_topk(x, 2048, lengths)
        assert torch.equal(out, map_through_page_table(raw, pt, None, None, 64))
        assert torch.equal(as_sets(out_any), as_sets(out))


# ---------------------------------------------------------------------------------------------
# nan_first=True: NaN above every number (torch.topk's order), key 0xFFFFFFFF in both kernels


def nan_rows(rows: int, width: int, dtype, k: int, g: torch.Generator) -> torch.Tensor:
    """Normal rows with, in turn: no NaN; a few; exactly k; k + a few (a threshold at NaN's key, with
    +inf keys that the widened filter threshold also passes); 90% NaN (a NaN plateau); a +inf plateau
    with a few NaNs above it; all NaN; NaN and -inf only. Row r gets pattern r % 8."""
    x = torch.randn(rows, width, device=DEV, generator=g)
    for r in range(rows):
        kind = r % 8
        perm = torch.randperm(width, device=DEV, generator=g)
        if kind == 1:
            x[r, perm[:37]] = float("nan")
        elif kind == 2:
            x[r, perm[:k]] = float("nan")
        elif kind == 3:
            x[r, perm[:k + 300]] = float("nan")
            x[r, perm[k + 300:k + 800]] = float("inf")
        elif kind == 4:
            x[r, perm[: width * 9 // 10]] = float("nan")
        elif kind == 5:
            x[r, perm[: width // 2]] = float("inf")
            x[r, perm[width // 2:width // 2 + 20]] = float("nan")
        elif kind == 6:
            x[r] = float("nan")
        elif kind == 7:
            x[r] = float("-inf")
            x[r, perm[:k // 2]] = float("nan")
    return x.to(dtype)


def check_nan_first(scores, k, lengths=None, row_starts=None, what=""):
    ref = window_topk(scores, k, lengths, row_starts, nan_first=True)
    with dsa_ops.use_backend("cuda"):
        got = dsa_ops.topk(scores, k, lengths=lengths, row_starts=row_starts, nan_first=True)
        got_d = dsa_ops.topk(scores, k, lengths=lengths, row_starts=row_starts, deterministic=True, nan_first=True)
        last = dsa_ops.topk(scores, k, lengths=lengths, row_starts=row_starts)
    bad = (as_sets(got) != as_sets(ref)).any(dim=1)
    assert not bad.any(), f"{what}: rows {bad.nonzero().flatten()[:8].tolist()} differ (nan_first, as sets)"
    bad = (got_d != ref).any(dim=1)
    assert not bad.any(), f"{what}: rows {bad.nonzero().flatten()[:8].tolist()} differ (nan_first, deterministic)"
    bad = (as_sets(last) != as_sets(window_topk(scores, k, lengths, row_starts))).any(dim=1)
    assert not bad.any(), f"{what}: rows {bad.nonzero().flatten()[:8].tolist()} differ (NaN last)"


NAN_SHAPES = [(16, 3000), (16, 40000), (16, 70000), (4, 262144)]


@pytest.mark.parametrize("shape", NAN_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_nan_first_rows(dtype, shape, cluster3):
    g = torch.Generator(device=DEV).manual_seed(31 + NAN_SHAPES.index(shape))
    for k in (7, 2048):
        x = nan_rows(*shape, dtype, k, g)
        check_nan_first(x, k, what=f"nan_first {dtype} {shape} k={k}")


def test_nan_first_narrow_rows_and_windows(cluster):
    g = torch.Generator(device=DEV).manual_seed(37)
    rows, width = narrow_rows(), 30000
    x = nan_rows(rows, width, torch.float32, 2048, g)
    check_nan_first(x, 2048, what="nan_first narrow")
    starts = torch.randint(-100, width // 2, (rows,), device=DEV, dtype=torch.int32, generator=g)
    lengths = torch.randint(-10, width, (rows,), device=DEV, dtype=torch.int32, generator=g)
    lengths[::5] = 2000  # shorter than k
    for k in (64, 2048):
        check_nan_first(x, k, lengths, starts, what=f"nan_first windows k={k}")


def test_nan_first_page_table_and_ragged(cluster3):
    g = torch.Generator(device=DEV).manual_seed(41)
    rows, width, k = 24, 70000, 2048
    x = nan_rows(rows, width, torch.float32, k, g)
    lengths = torch.randint(k // 2, width, (rows,), device=DEV, dtype=torch.int32, generator=g)
    starts = torch.randint(0, 500, (rows,), device=DEV, dtype=torch.int32, generator=g)
    table = torch.randint(0, 1 << 20, (rows, (width + 63) // 64 + 8), dtype=torch.int32, device=DEV, generator=g)
    rtb = torch.randperm(rows, device=DEV, generator=g).int()
    raw = window_topk(x, k, lengths, starts, nan_first=True)
    out_raw = torch.full((rows, k), POISON, device=DEV, dtype=torch.int32)
    with dsa_ops.use_backend("cuda"):
        out = dsa_ops.topk_page_table_transform(x, table, lengths, k, row_starts=starts, row_to_batch=rtb,
                                                nan_first=True, out_raw=out_raw)
        out_d = dsa_ops.topk_page_table_transform(x, table, lengths, k, row_starts=starts, row_to_batch=rtb,
                                                  nan_first=True, deterministic=True)
        offsets = torch.randint(0, 1 << 20, (rows,), device=DEV, dtype=torch.int32, generator=g)
        ragged = dsa_ops.topk_ragged_transform(x, offsets, lengths, k, row_starts=starts, nan_first=True)
    want = map_through_page_table(raw, table, rtb, None, 64)
    assert torch.equal(as_pair_sets(out_raw, out), as_pair_sets(raw, want))
    assert torch.equal(out_d, want)
    assert torch.equal(as_sets(ragged), as_sets(ragged_reference(x, offsets, lengths, k, starts, True)))


def test_nan_first_is_torch_topk_set_on_gpu():
    """torch.topk on the GPU against the nan_first form, whole rows: the same values picked (NaNs tie)."""
    g = torch.Generator(device=DEV).manual_seed(43)
    x = nan_rows(16, 50000, torch.float32, 2048, g)
    with dsa_ops.use_backend("cuda"):
        got = dsa_ops.topk(x, 2048, nan_first=True).long()
    want = torch.topk(x, 2048, sorted=False).indices
    gv, wv = x.gather(1, got).sort(1).values, x.gather(1, want).sort(1).values
    assert torch.equal(gv.isnan(), wv.isnan()) and torch.equal(gv.nan_to_num(), wv.nan_to_num())
