"""Dev tool (GPU): why graph replays of paged_indexer_logits read slower than the config sweep's eager timing.

benchmarks/bench_indexer_logits.py times the same kernels two ways: the config sweep eagerly (`ppi.run(..., out=)`
after an L2 flush) and test_paged_indexer_logits_op by CUDA-graph replay of the op (its output allocated in the
graph); on the H200 the replays read 6-25% slower, DeepGEMM's too (docs/design_indexer.md, Next). Here each way
is timed in the same process, in interleaved rounds (every form once a round, a median of a few calls each), so
that clocks and L2 state meet all forms alike:

- ours: the kernel eagerly with `out=` (the sweep's form), the op eagerly (its own output), the graph of each;
- DeepGEMM (when .peer/deep_gemm is there): eagerly and by graph replay, its metadata made once;
- each with and without the L2 flush before the call.

    python3 tools/probe_paged_timing.py [rounds]      # 64 x 65536, H 64, next_n 1 and 2; default 7 rounds

Prints, per case and form, the median over the rounds and the range, and nvidia-smi's SM clock before and after.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_indexer_logits as b  # noqa: E402
import dsa_ops  # noqa: E402
from harness import Timer, capture_graph  # noqa: E402


def sm_clock() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi: {e}"


def forms(case) -> dict:
    """name -> a call with no arguments, for one (B, next_n, H, L) case."""
    from dsa_ops.backends.cuda import providers_paged_indexer as ppi

    bsz, next_n, h, L = case
    args = b._paged_inputs(bsz, next_n, h, L)
    out = torch.empty(bsz * next_n, L, dtype=torch.float32, device="cuda")
    fns = {"kernel out=": lambda: ppi.run(*args, L, True, False, out=out),
           "op": lambda: dsa_ops.paged_indexer_logits(*args, max_context_len=L)}
    dg, why = b.deep_gemm()
    if dg is not None:
        q, cache, w, _, table = args
        ctx_dg, sms = b.deepgemm_paged_ctx(args)
        meta = dg.get_paged_mqa_logits_metadata(ctx_dg, 64, sms, None)
        fns["deepgemm"] = lambda: dg.fp8_fp4_paged_mqa_logits(q, None, cache, w, ctx_dg, table, meta, L, None)
    else:
        print(f"  deepgemm not timed: {why}")
    for fn in list(fns.values()):
        fn()
    torch.cuda.synchronize()
    for name in list(fns):
        fns[f"{name} (graph)"] = capture_graph(fns[name]).replay
    return fns


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    timer = Timer()
    for case in [(64, 1, 64, 65536), (64, 2, 64, 65536)]:
        print(f"case B {case[0]} next_n {case[1]} H {case[2]} L {case[3]}; clocks before: {sm_clock()}", flush=True)
        fns = forms(case)
        got = {(name, cold): [] for name in fns for cold in (True, False)}
        for _ in range(rounds):
            for (name, cold), samples in got.items():
                samples.append(timer.median_us(fns[name], warmup=2, iters=10, cold_l2=cold))
        for (name, cold), samples in got.items():
            print(f"  {name:24s} {'cold L2' if cold else 'warm   '}: {statistics.median(samples):8.1f} us "
                  f"(range {min(samples):.1f}-{max(samples):.1f})", flush=True)
        print(f"  clocks after: {sm_clock()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
