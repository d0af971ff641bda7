"""Runs every GPU provider once on small shapes and checks each result: the script compute-sanitizer
(memcheck, racecheck) walks in the sanitize stage of benchmarks/device_run.sh.

    compute-sanitizer --tool racecheck --error-exitcode 9 python tools/sanitize_small.py

The top-k launcher's test overrides pick the paths: DSA_OPS_TOPK_CLUSTER=N (CTAs a row) and
DSA_OPS_TOPK_SAMPLE=0 (no sampling: the exact fallback).
"""

import dsa_ops
import torch
from dsa_ops import registry
from dsa_ops.ops._common import map_through_page_table, window_topk
from dsa_ops.ops.topk_ragged_transform import reference as ragged_reference
from dsa_ops.testing import filter_retry_rows

dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)
idx = torch.randint(-2, 5000, (37, 13), device=dev, dtype=torch.int32, generator=g)
pt = torch.randint(-1, 100, (3, 50), device=dev, dtype=torch.int32, generator=g)
rtb = torch.randint(-1, 4, (37,), device=dev, dtype=torch.int32, generator=g)
want = map_through_page_table(idx, pt, rtb, None, 64)
ran = []
for backend in ("cuda", "hip", "triton"):
    with registry.use_backend(backend):
        try:
            got = dsa_ops.page_table_transform(idx, pt, row_to_batch=rtb, page_size=64)
        except registry.DispatchError as e:
            print(f"page_table_transform[{backend}]: not served: {e}")
            continue
        assert torch.equal(got, want), backend
        ran.append(f"page_table_transform[{backend}]")

# Top-k: one shape per path. deterministic=True: the ordered kernel (kernels/topk.cu): shared-memory
# list, streamed rows, short windows, compacted list candidates. deterministic=False: the filter kernel
# (kernels/topk_filter.cu): whole window as candidates (3000), sampled threshold with a cluster split of
# few rows (70000, 40000), short windows, and the exact fallback with ordered ties (the all-equal row)
# and the plateau early exit (relu zeros, 20000), smooth rows (random walks, 50000).
def as_sets(x):
    return torch.sort(torch.where(x < 0, torch.full_like(x, 2**31 - 1), x), dim=1).values


for rows, width, k in ((5, 3000, 64), (2, 70000, 2048), (4, 100, 2048), (1, 70000, 300), (3, 40000, 2048),
                       (2, 20000, 2048), (2, 50000, 2048)):
    s = torch.randn(rows, width, device=dev, generator=g)
    if width == 50000:  # random walks: the sampled threshold is re-selected at the middle aim
        s = s.cumsum(dim=1)
    if rows == 1:  # all-equal row: the candidates never fit, so the exact rescan / ordered ties run
        s.fill_(0.5)
    if width == 20000:  # relu plateau: the k-th largest is 0, shared by most of the row
        s = torch.relu(s - 2.5)
    lengths = torch.randint(-5, width + 10, (rows,), device=dev, dtype=torch.int32, generator=g)
    want = window_topk(s, k, lengths)
    for backend in ("cuda", "hip", "triton"):
        with registry.use_backend(backend):
            try:
                got = dsa_ops.topk(s, k, lengths=lengths, deterministic=True)
                got_any = dsa_ops.topk(s, k, lengths=lengths)
            except registry.DispatchError:
                continue
            assert torch.equal(got, want), (backend, rows, width, k)
            assert torch.equal(as_sets(got_any), as_sets(want)), (backend, rows, width, k, "any order")
            ran.append(f"topk[{backend}] {rows}x{width} k={k}")
# The filter kernel on more rows than the SMs hold CTAs, fp32 and bf16, relu rows among them: 300 rows
# (the wide shape) and six a SM (the narrow shape, topk_heuristics::narrow_rows).
narrow_rows = 6 * torch.cuda.get_device_properties(dev).multi_processor_count
for rows in (300, narrow_rows):
    for dtype in (torch.float32, torch.bfloat16):
        s = torch.randn(rows, 12000, device=dev, generator=g)
        s[::3] = torch.relu(s[::3] - 2.5)
        s = s.to(dtype)
        lengths = torch.randint(-5, 12010, (rows,), device=dev, dtype=torch.int32, generator=g)
        with registry.use_backend("cuda"):
            got_any = dsa_ops.topk(s, 2048, lengths=lengths)
        assert torch.equal(as_sets(got_any), as_sets(window_topk(s, 2048, lengths))), ("many rows", rows, dtype)
        ran.append(f"topk[cuda] {rows}x12000 {dtype}")
    # their page-table form (one-CTA rows: the lookups of the write path), shifted
    # table rows past both ends of a table of odd stride
    pt = torch.randint(-1, 5000, (rows, 12000 // 16 + 3), device=dev, dtype=torch.int32, generator=g)
    ptrs = torch.randint(-30, 30, (rows,), device=dev, dtype=torch.int32, generator=g)
    want = map_through_page_table(window_topk(s, 2048, lengths), pt, None, ptrs, 16)
    with registry.use_backend("cuda"):
        got_any = dsa_ops.topk_page_table_transform(s, pt, lengths, 2048, page_size=16, page_table_row_starts=ptrs)
    assert torch.equal(as_sets(got_any), as_sets(want)), ("many rows, page-table form", rows)
    ran.append(f"topk_page_table_transform[cuda] {rows}x12000")
# The filter kernel's second sampled attempt (dsa_ops.testing.filter_retry_rows): row 0 is finished by
# the retry, row 1 by the exact fallback after it.
s = filter_retry_rows().to(dev)
with registry.use_backend("cuda"):
    got_any = dsa_ops.topk(s, 2048)
assert torch.equal(as_sets(got_any), as_sets(window_topk(s, 2048))), "sampled retry"
ran.append("topk[cuda] 2x70000 sampled retry")
# A split row's finish at every outcome of the spread select (run with DSA_OPS_TOPK_CLUSTER=4: hist_select):
# a ranked bin (normal), ties of one value past 256 and mixed values past 256 in the bin (the cluster-wide
# finish after it).
s = torch.randn(3, 70000, device=dev, generator=g)
s[1] = torch.randint(0, 40, (70000,), device=dev, generator=g).float()
s[2, 777] = float("inf")
with registry.use_backend("cuda"):
    got_any = dsa_ops.topk(s, 2048)
assert torch.equal(as_sets(got_any), as_sets(window_topk(s, 2048))), "spread select"
ran.append("topk[cuda] 3x70000 spread select")
# The page-table form of both top-k kernels, one CTA a row and split rows (a race in the page-table
# path can show only here, under graph replay: keep the filter kernel's page-table path in this script).
s = torch.randn(6, 70000, device=dev, generator=g)
lengths = torch.randint(-5, 70010, (6,), device=dev, dtype=torch.int32, generator=g)
pt = torch.randint(-1, 5000, (6, 1100), device=dev, dtype=torch.int32, generator=g)
want = map_through_page_table(window_topk(s, 2048, lengths), pt, None, None, 64)
with registry.use_backend("cuda"):
    got = dsa_ops.topk_page_table_transform(s, pt, lengths, 2048, deterministic=True)
    got_any = dsa_ops.topk_page_table_transform(s, pt, lengths, 2048)
assert torch.equal(got, want) and torch.equal(as_sets(got_any), as_sets(want)), "page-table form"
ran.append("topk_page_table_transform[cuda] 6x70000")
# The ragged form (the filter kernel, offsets added; sums past int32 give -1).
offsets = torch.tensor([0, 5, -3, 2**31 - 60000, -(2**31), 1000], dtype=torch.int32, device=dev)
want = ragged_reference(s, offsets, lengths, 2048, None)
with registry.use_backend("cuda"):
    got_any = dsa_ops.topk_ragged_transform(s, offsets, lengths, 2048)
assert torch.equal(as_sets(got_any), as_sets(want)), "ragged form"
ran.append("topk_ragged_transform[cuda] 6x70000")
# A table narrower than the rows, slot offsets before and past it, batches outside it: every lookup
# must stay inside its table row.
pt = torch.randint(-1, 5000, (3, 700), device=dev, dtype=torch.int32, generator=g)
ptrs = torch.tensor([-40, 0, 650, 690, 800, 5], dtype=torch.int32, device=dev)
rtb = torch.tensor([0, 2, 1, 3, 0, -1], dtype=torch.int32, device=dev)
want = map_through_page_table(window_topk(s, 2048, lengths), pt, rtb, ptrs, 64)
with registry.use_backend("cuda"):
    got_any = dsa_ops.topk_page_table_transform(s, pt, lengths, 2048, page_table_row_starts=ptrs, row_to_batch=rtb)
assert torch.equal(as_sets(got_any), as_sets(want)), "page-table form, narrow table"
ran.append("topk_page_table_transform[cuda] 6x70000 narrow table")
# A decode row split over 8 CTAs in the page-table form (the exchanges of the largest cluster).
s = torch.randn(1, 140000, device=dev, generator=g)
lengths = torch.tensor([139990], dtype=torch.int32, device=dev)
pt = torch.randint(-1, 5000, (1, 2200), device=dev, dtype=torch.int32, generator=g)
want = map_through_page_table(window_topk(s, 2048, lengths), pt, None, None, 64)
with registry.use_backend("cuda"):
    got_any = dsa_ops.topk_page_table_transform(s, pt, lengths, 2048)
assert torch.equal(as_sets(got_any), as_sets(want)), "page-table form, 8-CTA row"
ran.append("topk_page_table_transform[cuda] 1x140000")
# Native HIP top-k: the row-split kernel sequence (forced through its one override) and the
# single-workgroup tie-buffer overflow (an all-equal long row), with page-table outputs.
try:
    from dsa_ops.backends.rocm import topk_heuristics as hip_topk
except ImportError:
    hip_topk = None
if hip_topk is not None:
    s = torch.randn(3, 70000, device=dev, generator=g)
    s[2] = 0.25
    lengths = torch.tensor([70000, 5000, 69000], dtype=torch.int32, device=dev)
    pt = torch.arange(3 * 1100, dtype=torch.int32, device=dev).view(3, 1100)
    for force in (1, 4):
        hip_topk.force = force
        with registry.use_backend("hip"):
            try:
                got = dsa_ops.topk_page_table_transform(s, pt, lengths, 2048, deterministic=True)
            except registry.DispatchError:
                break
            want = map_through_page_table(window_topk(s, 2048, lengths), pt, None, None, 64)
            assert torch.equal(got, want), force
            ran.append(f"topk_page_table_transform[hip] split={force}")
    hip_topk.force = None
torch.cuda.synchronize()
print("sanitize_small ran:", ", ".join(ran))
