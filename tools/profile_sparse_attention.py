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

The CUDA kernel's per-CTA timeline (a -DDSA_SA_TRACE build: %globaltimer at each CTA's start, after its
prologue and at each unit's end; see smxx_sparse_attention.cuh):

    python3 tools/profile_sparse_attention.py build-trace          # prints the trace library's path
    DSA_OPS_CUDA_LIB=<that path> python3 tools/profile_sparse_attention.py trace 400 [SPLITS WHOLE]
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
        fn = b._vllm_fn(peer, q, kc, vc, idx, bt, t2r, out)
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
    print(f"{which} rows {rows} {dtype}: done")


def build_trace() -> None:
    """Builds the CUDA library with -DDSA_SA_TRACE and prints its path (profile_topk's variant build)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import profile_topk

    profile_topk.build("-DDSA_SA_TRACE")


def _quantiles(xs, qs=(0.0, 0.1, 0.5, 0.9, 1.0)) -> str:
    xs = sorted(xs)
    return " / ".join(f"{xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]:.1f}" for q in qs)


def trace(rows: int, splits=None, whole: int = 0) -> None:
    """One launch of the trace build at `rows` (after a warm-up; `splits` / `whole` forced as launch() takes
    them), its CTAs' stamps read back from the device printf and summarised in us from the earliest CTA start:
    quantiles (min / 10% / median / 90% / max) of each CTA's start, prologue end, unit ends and end, the last
    unit's length for CTAs of one and of two units; with a split tail, the tail CTAs' start and end."""
    import tempfile

    from dsa_ops.backends.cuda import providers_sparse_attention as cu

    kc, vc = b._pool("fp8")
    q, idx, bt, t2r = b._inputs(rows)
    out = torch.empty((rows, b.HQ, b.D), dtype=torch.bfloat16, device="cuda")
    lines = []
    for _ in range(2):  # the first launch warms up; the second is read
        sys.stdout.flush()
        with tempfile.TemporaryFile(mode="w+") as f:
            saved = os.dup(1)
            os.dup2(f.fileno(), 1)
            try:
                cu.launch(q, kc, vc, idx, bt, t2r, b.SCALE, 1.0, 1.0, out, splits=splits, whole=whole)
                torch.cuda.synchronize()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
            f.seek(0)
            lines = [ln.split() for ln in f if ln.startswith("satrace ")]
    if not lines:
        raise SystemExit("no satrace lines: run with DSA_OPS_CUDA_LIB set to the build-trace library")
    ctas = [(int(v[1]), int(v[2]), [int(x) for x in v[4:4 + int(v[3])]]) for v in lines]
    t0 = min(st[0] for _, _, st in ctas)
    us = [[(x - t0) / 1e3 for x in st] for _, _, st in ctas]
    print(f"{torch.cuda.get_device_name()}, {rows} rows, splits {splits} whole {whole}: {len(ctas)} CTAs; us from "
          "the first CTA's start, min / 10% / median / 90% / max")
    print(f"  start          {_quantiles([u[0] for u in us])}")
    print(f"  prologue end   {_quantiles([u[1] for u in us])}")
    for k in (2, 3):
        ends = [u[k] for u in us if len(u) > k]
        if ends:
            print(f"  unit {k - 1} end     {_quantiles(ends)}  ({len(ends)} CTAs)")
    print(f"  end            {_quantiles([u[-1] for u in us])}")
    for n in (3, 4):
        last = [u[-1] - u[-2] for u in us if len(u) == n]
        if last:
            print(f"  last unit of CTAs with {n - 2} unit(s): {_quantiles(last)}")
    tail = [u for (cta, _, _), u in zip(ctas, us) if whole and cta >= whole]
    if tail:
        print(f"  tail start     {_quantiles([u[0] for u in tail])}  ({len(tail)} CTAs)")
        print(f"  tail end       {_quantiles([u[-1] for u in tail])}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["build-trace"]:
        build_trace()
    elif sys.argv[1:2] == ["trace"]:
        trace(int(sys.argv[2]), *(int(x) for x in sys.argv[3:5]))
    else:
        main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "fp8")
