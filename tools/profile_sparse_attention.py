"""Launch one sparse_attention shape a few times, for `ncu` (stall reasons, memory throughput) on the GPU machine.

Inputs as benchmarks/bench_sparse_attention.py builds them (fp8 cache, 24 / 2 heads, top-k 2048). Run with
`ours` (the Triton provider's chosen path), `cuda` (the CUDA provider, fp8 caches only) or `vllm` (qsa_peer from
.peer/, when present), e.g.

    ncu --clock-control none -k regex:attention_kernel --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
        python3 tools/profile_sparse_attention.py ours 1600
    ncu -k regex:sparse_attention_fp8 --launch-skip 1 --launch-count 1 --section SpeedOfLight \
        --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        python3 tools/profile_sparse_attention.py cuda 400
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_sparse_attention as b  # noqa: E402


def main(which: str, rows: int, dtype: str = "fp8") -> None:
    from dsa_ops.backends.triton import sparse_attention as sa

    kc, vc = b._pool(dtype)
    q, idx, bt, t2r = b._inputs(rows)
    out = torch.empty((rows, b.HQ, b.D), dtype=torch.bfloat16, device="cuda")
    if which == "ours":
        fn = lambda: sa.launch(q, kc, vc, idx, bt, t2r, b.SCALE, 1.0, 1.0, out)  # noqa: E731
    elif which == "cuda":
        from dsa_ops.backends.cuda import providers_sparse_attention as cu

        fn = lambda: cu.launch(q, kc, vc, idx, bt, t2r, b.SCALE, 1.0, 1.0, out)  # noqa: E731
    else:
        peer = b._peer()
        if peer is None:
            raise SystemExit("no .peer/qsa_peer.py")
        packed = torch.cat([idx, torch.full((rows, 1), b.TOPK, dtype=torch.int32, device="cuda")], dim=1)
        gate = torch.full((rows, b.HQ, b.D), 30.0, dtype=torch.bfloat16, device="cuda")
        fn = lambda: peer.qsa_sparse_paged_attention(  # noqa: E731
            q, kc, vc, packed, bt, t2r, True, out, 1.0, 1.0, output_gate=gate)
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
    print(f"{which} rows {rows} {dtype}: done")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "fp8")
