"""Runs every GPU provider once on small shapes, for compute-sanitizer (memcheck, racecheck)."""

import os

import dsa_ops
import torch
from dsa_ops import registry
from dsa_ops.ops._common import map_through_page_table, window_topk

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

# Top-k: one shape per path (single CTA from shared memory, long rows from global memory, short windows,
# the list path with its compacted candidates). The CUDA kernel runs both its instances on each:
# deterministic=True (ordered, compared exactly) and False (unordered: warp-aggregated compactions and
# the column select of the ties; compared as sets); the other backends deterministic=True only.
# (3, 40000, 2048): the list path whose first-level candidates are compacted after the list.
# (2, 70000, 2048): split rows, or the sampled-threshold filter under DSA_OPS_TOPK_CLUSTER=1;
# (1, 70000, 300): an all-equal row (the candidates never fit: the exact 4-read rescan, and the
# column select over every key).
# (2, 9000, 700) heavy ties: the column select on the list path.
# The caller's DSA_OPS_TOPK_CLUSTER / DSA_OPS_TOPK_SAMPLE (device_run.sh's sanitizer modes) are kept;
# without a forced cluster size, the tie-heavy shapes also run split over a 4-CTA cluster (ties
# spread over the CTAs: the split-row tie allocation, DSMEM merges, cluster barriers).


def _sets(x):
    return torch.sort(torch.where(x == -1, torch.full_like(x, 2**31 - 1), x), dim=1).values


SHAPES = ((5, 3000, 64), (2, 70000, 2048), (4, 100, 2048), (1, 70000, 300), (3, 40000, 2048), (2, 9000, 700))
caller_cluster = os.environ.get("DSA_OPS_TOPK_CLUSTER")
passes = [(caller_cluster, SHAPES)]
if caller_cluster is None:
    passes.append(("4", ((1, 70000, 300), (3, 40000, 2048), (2, 9000, 700))))
for cluster_env, shapes in passes:
    if cluster_env is None:
        os.environ.pop("DSA_OPS_TOPK_CLUSTER", None)
    else:
        os.environ["DSA_OPS_TOPK_CLUSTER"] = cluster_env
    for rows, width, k in shapes:
        s = torch.randn(rows, width, device=dev, generator=g)
        if rows == 1:  # all-equal row: the candidates never fit, so the exact 4-read rescan runs
            s.fill_(0.5)
        if k == 700:  # heavy ties at the threshold
            s = torch.randint(0, 3, (rows, width), device=dev, generator=g).float()
        lengths = torch.randint(-5, width + 10, (rows,), device=dev, dtype=torch.int32, generator=g)
        want = window_topk(s, k, lengths)
        for backend in ("cuda", "hip", "triton"):
            if cluster_env != caller_cluster and backend != "cuda":
                continue
            for det in (True, False) if backend == "cuda" else (True,):
                with registry.use_backend(backend):
                    try:
                        got = dsa_ops.topk(s, k, lengths=lengths, deterministic=det)
                    except registry.DispatchError:
                        continue
                if det:
                    assert torch.equal(got, want), (backend, rows, width, k, cluster_env)
                else:
                    assert torch.equal(_sets(got), _sets(want)), (backend, rows, width, k, cluster_env)
                ran.append(f"topk[{backend}] {rows}x{width} k={k} det={det} cluster={cluster_env or 'auto'}")
if caller_cluster is None:
    os.environ.pop("DSA_OPS_TOPK_CLUSTER", None)
else:
    os.environ["DSA_OPS_TOPK_CLUSTER"] = caller_cluster
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
