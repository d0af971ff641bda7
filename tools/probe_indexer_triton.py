"""The Triton indexer_logits kernel's exact fp8 path (fp16 MMA) on the GPU: its configs and its kv widening,
for re-tuning `backends_triton/indexer_logits.py` (H200 figures are in that file's comments).

    python tools/probe_indexer_triton.py

The launcher widens kv to fp16 once when the call has enough rows (negating the rows of negative scale so
that the kernel applies |scale| after the head sum), since widening inside the kernel widens every key
once per row tile. Timed here, per shape and head count, as TFLOP/s against the fp8 ceiling measured in
the same run: the launcher's default, widen_kv alone, the in-loop widening, the widened path under a few
(BLOCK_T, BLOCK_N, num_warps, num_stages) configs, and bf16 operands under the 16-bit config and the fp8
one. Each exact variant is compared with the default's output.
"""

import os
import sys

import dsa_ops  # noqa: F401
import torch

# benchmarks/: harness, bench_indexer_logits
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_indexer_logits import _inputs  # noqa: E402
from dsa_ops.backends.triton import indexer_logits as il  # noqa: E402
from harness import Timer, matmul_tflops  # noqa: E402

FP8 = torch.float8_e4m3fn
D = 128
WIDE_CONFIGS = {64: [(4, 128, 8, 3), (4, 64, 8, 3)], 32: [(8, 64, 8, 3), (8, 128, 8, 3)]}


def probe_shape(timer, fp8_ceil, t, n, h):
    flops = 2 * h * D * t * n
    args = _inputs(t, n, h, FP8, "full")  # the benchmark's inputs
    ref = il.launch(*args, True, True)

    def row(label, fn, ref=ref):
        try:
            if ref is not None:
                err = (fn() - ref).abs().max().item()
                if err != 0.0:  # same products; only a config's head-sum order may differ
                    label += f" (max |diff| {err:.3g})"
            us = timer.median_us(fn, warmup=2, iters=10 if n > 32768 else 20)
            tf = flops / (us * 1e-6) / 1e12
            print(f"  {t}x{n} H{h} {label}: {us:.0f} us, {tf:.0f} TFLOPS, {tf / fp8_ceil:.3f} of fp8", flush=True)
        except Exception as e:  # noqa: BLE001  (a config out of resources is a line, not a stop)
            print(f"  {t}x{n} H{h} {label}: failed: {type(e).__name__}: {str(e)[:160]}", flush=True)

    row(f"precise {il.config(h, True, True)} (kv widened once)", lambda: il.launch(*args, True, True))
    kv, s = args[1], args[2]
    print(f"  widen_kv alone: {timer.median_us(lambda: il.widen_kv(kv, s), iters=20):.1f} us", flush=True)
    floor, il.WIDEN_MIN_HEAD_ROWS = il.WIDEN_MIN_HEAD_ROWS, 1 << 62
    row(f"in-loop widening {il.config(h)}", lambda: il.launch(*args, True, True))
    il.WIDEN_MIN_HEAD_ROWS = floor
    for cfg in WIDE_CONFIGS[h] if n == 32768 else []:
        il.CONFIG_OVERRIDE = cfg
        row(f"widened once, cfg {cfg}", lambda: il.launch(*args, True, True))
    il.CONFIG_OVERRIDE = None
    if h == 64:
        bargs = _inputs(t, n, h, torch.bfloat16, "full")
        bref = il.launch(*bargs, True, False)
        for cfg in (il.config(h, True, True), il.config(h)):
            il.CONFIG_OVERRIDE = cfg
            row(f"bf16 operands, cfg {cfg}", lambda: il.launch(*bargs, True, False), ref=bref)
        il.CONFIG_OVERRIDE = None
    torch.cuda.empty_cache()


def main():
    timer = Timer()
    fp8_ceil = matmul_tflops(timer, FP8)
    print(f"ceilings: fp8 {fp8_ceil:.1f} TFLOPS, bf16 {matmul_tflops(timer, torch.bfloat16):.1f}", flush=True)
    for t, n, h in ((4096, 32768, 64), (4096, 32768, 32), (4096, 131072, 64)):
        probe_shape(timer, fp8_ceil, t, n, h)


if __name__ == "__main__":
    main()
