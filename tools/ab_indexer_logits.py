"""Dev tool (GPU): CUDA dense indexer_logits configs timed in interleaved rounds beside DeepGEMM.

One sweep times each config once after the other, and the H200 moves the same kernel by up to 6% between
such back-to-back timings (clocks under sustained fp8 load). Here every round times each config and
DeepGEMM once in turn (a median of a few calls each), and the rounds' medians are reported with their
range, so configs are compared under the same conditions. Inputs as benchmarks/bench_indexer_logits.py
builds them (fp8 operands).

    python3 tools/ab_indexer_logits.py 1,2 [rounds]     # configs (IndexerLogitsParams::config), default 5 rounds
    python3 tools/ab_indexer_logits.py 3,4 3 --precise  # the exact mode's configs, beside the bf16 matmul rate

DeepGEMM (fp8 MMAs: not the exact mode's peer, its column the yardstick all the same) is timed when
.peer/deep_gemm is there (unpacked from ../shared/peers), else left out. With --precise each config's TFLOP/s is
also given as a fraction of the bf16 matmul rate measured before the case.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_indexer_logits as b  # noqa: E402
from harness import Timer, matmul_tflops  # noqa: E402

CASES = [(4096, 32768, 64, "full"), (4096, 32768, 64, "causal"), (4096, 131072, 64, "full"),
         (4096, 131072, 64, "causal"), (4096, 32768, 32, "full")]


def time_case(case, configs: list[int], rounds: int, dg, timer: Timer, precise: bool = False) -> str:
    """One line: each config's and DeepGEMM's median over the rounds, its range, x DeepGEMM (and with `precise`
    the fraction of the bf16 matmul rate)."""
    from dsa_ops.backends.cuda import providers_indexer as pi

    t, n, h, windows = case
    q, kv, s, w, ks, ke = b._inputs(t, n, h, b.FP8, windows)
    out = torch.empty(t, n, device="cuda")
    fns = {f"config {c}": (lambda c=c: pi.run(q, kv, s, w, ks, ke, True, precise, config=c, out=out))
           for c in configs}
    if dg is not None:
        fns["deepgemm"] = lambda: dg.fp8_fp4_mqa_logits(q, None, kv, s, w, ks, ke, n, None)
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    iters = 5 if n >= 131072 else 10
    got = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            got[k].append(timer.median_us(fn, warmup=1, iters=iters))
    med = {k: statistics.median(v) for k, v in got.items()}
    ref = med.get("deepgemm")
    cols = [f"{k} {v:.1f} us [{min(got[k]):.0f}-{max(got[k]):.0f}]" + (f" {v / ref:.3f}x" if ref else "")
            for k, v in med.items()]
    if precise:
        bf16 = matmul_tflops(timer, torch.bfloat16)
        flops = 2.0 * h * b.D * b.visible_keys(t, n, windows, ks, ke)  # as the benchmark counts them
        cols += [f"bf16 {bf16:.0f} TFLOP/s"] + [f"{k} {flops / (v * 1e-6) / 1e12 / bf16:.3f} of bf16"
                                                for k, v in med.items() if k != "deepgemm"]
    return f"{t} x {n}, H {h}, {windows}: " + "  ".join(cols)


def main(configs: list[int], rounds: int, precise: bool = False) -> None:
    dg, why = b.deep_gemm()
    if dg is None:
        print(f"deepgemm left out: {why}")
    timer = Timer()
    for case in CASES:
        print(time_case(case, configs, rounds, dg, timer, precise), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    args = [x for x in sys.argv[1:] if x != "--precise"]
    main([int(x) for x in args[0].split(",")], int(args[1]) if len(args) > 1 else 5, "--precise" in sys.argv[1:])
