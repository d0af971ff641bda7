"""indexer_logits and paged_indexer_logits: every provider against the tensor-core ceiling and plain torch.

Ceilings are measured first in the same run (bench.ceilings: fp8 via torch._scaled_mm, bf16 via
matmul, 8192^3). tflops counts 2*T*H*D*(visible keys) (full windows: N; causal: the visible keys only).
The Triton and CUDA fp8 paths are timed in both MMA modes: `fp16-mma` (the default, exact products and fp32
accumulation) and `fp8-mma` (FP8_MMA = True in the provider module: 2x tensor rate, ~14-bit accumulation
inside the MMA); the row's provider is "triton" or "cuda" and case["mma"] says which. Whole file: about
30-60 s on the H200.

    python -m pytest benchmarks/bench_indexer_logits.py -m gpu -s --dsa-results /tmp/indexer.json
    python benchmarks/results_table.py merge /tmp/indexer.json benchmarks/results/h200.json \
        --ops indexer_logits --ops paged_indexer_logits --command "..."
"""

from __future__ import annotations

import os

import dsa_ops
import pytest
import torch
from dsa_ops import registry
from harness import matmul_tflops, record

pytestmark = pytest.mark.gpu
FP8 = torch.float8_e4m3fn
D = 128


def _ceilings(bench):
    if "fp8_tflops" not in bench.ceilings:
        bench.ceilings["fp8_tflops"] = round(matmul_tflops(bench.timer, FP8), 1)
        bench.ceilings["bf16_tflops"] = round(matmul_tflops(bench.timer, torch.bfloat16), 1)
        c = bench.ceilings
        print(f"\n  ceilings: fp8 {c['fp8_tflops']} TFLOPS, bf16 {c['bf16_tflops']} TFLOPS")
    return bench.ceilings


def test_ceilings(bench):
    c = _ceilings(bench)
    assert c["fp8_tflops"] > 0 and c["bf16_tflops"] > 0


def torch_indexer_logits(q, kv, s, w, ks, ke, rows_per_chunk):
    """Plain torch: bf16 matmul per chunk of rows, scale, relu, head-weighted sum, then the window mask."""
    t, h, d = q.shape
    n = kv.shape[0]
    out = torch.empty(t, n, dtype=torch.float32, device=q.device)
    kvb = kv.to(torch.bfloat16)
    for r0 in range(0, t, rows_per_chunk):
        r1 = min(t, r0 + rows_per_chunk)
        logits = (q[r0:r1].to(torch.bfloat16).reshape(-1, d) @ kvb.t()).view(r1 - r0, h, n).float()
        if s is not None:
            logits.mul_(s)
        logits.relu_()
        out[r0:r1] = torch.einsum("thn,th->tn", logits, w[r0:r1])
    col = torch.arange(n, device=q.device)
    inside = (col[None, :] >= ks[:, None].clamp(0, n)) & (col[None, :] < ke[:, None].clamp(0, n))
    return out.masked_fill_(~inside, float("-inf"))


def _inputs(t, n, h, dtype, windows):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(t, h, D, device="cuda", generator=g).to(dtype)
    kv = torch.randn(n, D, device="cuda", generator=g).to(dtype)
    s = (torch.rand(n, device="cuda", generator=g) + 0.5) if dtype == FP8 else None
    w = torch.randn(t, h, device="cuda", generator=g)
    ks = torch.zeros(t, dtype=torch.int32, device="cuda")
    if windows == "causal":
        ke = (n - t + torch.arange(t, device="cuda") + 1).to(torch.int32)
    else:
        ke = torch.full((t,), n, dtype=torch.int32, device="cuda")
    return q, kv, s, w, ks, ke


CASES = [
    # (T, N, H, dtype, windows)
    (4096, 131072, 64, FP8, "full"),
    (4096, 32768, 64, FP8, "full"),
    (4096, 131072, 64, FP8, "causal"),
    (4096, 32768, 32, FP8, "full"),
    (4096, 32768, 64, torch.bfloat16, "full"),
]


@pytest.mark.parametrize("case", CASES,
                         ids=lambda c: f"T{c[0]}-N{c[1]}-H{c[2]}-{'fp8' if c[3] == FP8 else 'bf16'}-{c[4]}")
@pytest.mark.parametrize("provider", ["cuda", "triton"])
def test_indexer_logits(bench, provider, case):
    t, n, h, dtype, windows = case
    ceil = _ceilings(bench)
    args = _inputs(t, n, h, dtype, windows)
    q, kv, s, w, ks, ke = args
    visible = t * n if windows == "full" else int((ke.long() - ks.long()).clamp(0, n).sum())
    flops = 2 * h * D * visible
    ceiling = ceil["fp8_tflops"] if dtype == FP8 else ceil["bf16_tflops"]
    big = t * n >= 1 << 29
    iters = 10 if big else 20
    modes = [None]
    if provider == "triton" and dtype == FP8:
        modes = [False, True]  # fp16-mma (default), fp8-mma
    elif provider == "cuda":  # (fp8-mma, math warpgroups per CTA)
        modes = [(m, wg) for m in ((False, True) if dtype == FP8 else (False,)) for wg in (2, 3)]
    with registry.use_backend(provider):
        try:
            out = dsa_ops.indexer_logits(*args)
        except registry.DispatchError as e:
            pytest.skip(str(e).splitlines()[1])
        del out
        rows_per_chunk = max(1, (1 << 28) // (h * n * 4))  # [chunk*H, N] fp32 logits of 256 MB
        t_us = bench.timer.median_us(lambda: torch_indexer_logits(*args, rows_per_chunk), warmup=1, iters=3)
        for mode in modes:
            if mode is None:
                fn = lambda: dsa_ops.indexer_logits(*args)  # noqa: E731
                label = None
            elif provider == "cuda":
                from dsa_ops.backends.cuda import providers_indexer as pi

                fn = lambda m=mode: pi.run(*args, True, fp8_mma=m[0], math_warpgroups=m[1])  # noqa: E731
                label = ("fp8-mma" if mode[0] else "fp16-mma") if dtype == FP8 else None
            else:
                from dsa_ops.backends.triton import indexer_logits as il

                fn = lambda m=mode: il.launch(*args, True, fp8_mma=m)  # noqa: E731
                label = "fp8-mma" if mode else "fp16-mma"
            us = bench.timer.median_us(fn, warmup=2, iters=iters)
            tflops = flops / (us * 1e-6) / 1e12
            case_d = {"rows": t, "keys": n, "heads": h, "head_dim": D,
                      "dtype": "fp8_e4m3" if dtype == FP8 else "bf16", "windows": windows}
            if label:
                case_d["mma"] = label
            if provider == "cuda":
                case_d["math_warpgroups"] = mode[1]
            out_bytes = t * n * 4
            bench.add(record(
                "indexer_logits", provider, case_d, us,
                floor_us=max(flops / (ceiling * 1e12) * 1e6, bench.floor_us(out_bytes)),
                floor_kind="max(tensor-core: flops / ceiling, memory: [T, N] fp32 write)",
                baselines={"torch": t_us},
                tflops=round(tflops, 1), ceiling_tflops=ceiling, ratio=round(tflops / ceiling, 3),
                flops_counted="2*H*D*visible keys",
            ))


def _paged_inputs(b, next_n, h, L):
    g = torch.Generator(device="cuda").manual_seed(0)
    blocks = L // 64
    nb = b * blocks
    q = torch.randn(b, next_n, h, D, device="cuda", generator=g).to(FP8)
    vals = torch.randn(nb, 64 * D, device="cuda", generator=g).to(FP8).view(torch.uint8)
    sc = (torch.rand(nb, 64, device="cuda", generator=g) + 0.5).view(torch.uint8)
    cache = torch.cat([vals, sc], 1).reshape(nb, 64, 1, D + 4)
    w = torch.randn(b * next_n, h, device="cuda", generator=g)
    ctx = torch.full((b,), L, dtype=torch.int32, device="cuda")
    table = torch.randperm(nb, device="cuda", generator=g).to(torch.int32).view(b, blocks)
    return q, cache, w, ctx, table


def torch_paged_indexer_logits(q, cache, w, ctx, table, L):
    """Plain torch: gather each request's pages, dequantise to bf16, matmul, relu, head-weighted sum."""
    b, next_n, h, d = q.shape
    out = torch.empty(b * next_n, L, dtype=torch.float32, device=q.device)
    raw = cache.view(cache.shape[0], -1)
    for r in range(b):
        pages = raw[table[r].long()]  # [blocks, 64*(D+4)]
        vals = pages[:, : 64 * d].contiguous().view(FP8).view(-1, d).to(torch.bfloat16)
        sc = pages[:, 64 * d:].contiguous().view(torch.float32).view(-1)
        logits = (q[r].to(torch.bfloat16).reshape(-1, d) @ vals.t()).float().view(next_n, h, -1)
        logits = (logits * sc).relu_()
        out[r * next_n:(r + 1) * next_n] = torch.einsum("thn,th->tn", logits, w[r * next_n:(r + 1) * next_n])
    return out  # visibility mask omitted: full contexts in this benchmark


PAGED_CASES = [
    # (B, next_n, H, L): the decode size first, then next_n 2, H 32, and few requests (the
    # CUDA kernel's key split must still fill the SMs)
    (64, 1, 64, 65536),
    (64, 2, 64, 32768),
    (64, 1, 32, 65536),
    (4, 1, 64, 65536),
    (1, 2, 64, 131072),
]


@pytest.mark.parametrize("case", PAGED_CASES, ids=lambda c: f"B{c[0]}-n{c[1]}-H{c[2]}-L{c[3]}")
def test_paged_indexer_logits(bench, case):
    """Every paged provider (CUDA and Triton, each in its fp16-mma default and the fp8-mma mode) in one
    run, so the CUDA rows carry the Triton time of the same mode as a baseline."""
    b, next_n, h, L = case
    ceil = _ceilings(bench)
    args = _paged_inputs(b, next_n, h, L)
    flops = 2 * b * next_n * h * D * L
    kv_bytes = b * L * (D + 4)
    nbytes = kv_bytes + b * next_n * L * 4 + q_bytes(args[0])
    floor = bench.floor_us(nbytes)
    # fp16-mma widens e4m3 to fp16: its tensor-core bound is the 16-bit rate (bf16 matmul ceiling).
    tensor_floor = {"fp16-mma": flops / (ceil["bf16_tflops"] * 1e12) * 1e6,
                    "fp8-mma": flops / (ceil["fp8_tflops"] * 1e12) * 1e6}
    t_us = bench.timer.median_us(lambda: torch_paged_indexer_logits(*args, L), warmup=1, iters=3)
    from dsa_ops.backends.triton import paged_indexer_logits as pil

    times = {}
    for provider in ("triton", "cuda"):
        with registry.use_backend(provider):
            try:
                dsa_ops.paged_indexer_logits(*args, max_context_len=L)
            except registry.DispatchError as e:
                print(f"\n  paged_indexer_logits [{provider}] {case}: skipped: {str(e).splitlines()[1]}")
                continue
        # CUDA: 2 and 3 math warpgroups per CTA (3 applies to next_n = 1 only).
        wgs = (None,) if provider == "triton" else ((2, 3) if next_n == 1 else (2,))
        for mode, wg in [(m, g) for m in (False, True) for g in wgs]:
            label = "fp8-mma" if mode else "fp16-mma"
            if provider == "triton":
                fn = lambda m=mode: pil.launch(*args, L, True, fp8_mma=m)  # noqa: E731
            else:
                from dsa_ops.backends.cuda import providers_paged_indexer as ppi

                fn = lambda m=mode, g=wg: ppi.run(*args, L, True, fp8_mma=m, math_warpgroups=g)  # noqa: E731
            us = bench.timer.median_us(fn, warmup=3, iters=30)
            times[provider, label] = us
            baselines = {"torch": t_us}
            if provider == "cuda" and ("triton", label) in times:
                baselines["triton"] = times["triton", label]
            bound = max(floor, tensor_floor[label])
            case_d = {"batch": b, "s_q": next_n, "keys": L, "heads": h, "head_dim": D, "dtype": "fp8_e4m3",
                      "page_size": 64, "mma": label}
            if wg is not None:
                case_d["math_warpgroups"] = wg
            bench.add(record(
                "paged_indexer_logits", provider, case_d,
                us,
                floor_us=floor, floor_kind="memory (kv cache read once + logits write + q)",
                baselines=baselines,
                tflops=round(flops / (us * 1e-6) / 1e12, 1), ceiling_tflops=ceil["fp8_tflops"],
                ratio=round(flops / (us * 1e-6) / 1e12 / ceil["fp8_tflops"], 3),
                tensor_floor_us=round(tensor_floor[label], 2),
                tensor_floor_kind="bf16 matmul ceiling" if label == "fp16-mma" else "fp8 _scaled_mm ceiling",
                bound_us=round(bound, 2), of_bound=round(bound / us, 3),
                achieved_gbps=round(nbytes / (us * 1e-6) / 1e9, 1),
            ))
    # The default path through the op (dispatch + allocation), for the per-call overhead.
    with registry.use_backend("cuda"):
        try:
            us = bench.timer.median_us(lambda: dsa_ops.paged_indexer_logits(*args, max_context_len=L), warmup=3,
                                       iters=30)
            print(f"\n  paged_indexer_logits via dsa_ops (cuda, default mode): {us:.1f} us")
        except registry.DispatchError:
            pass


def q_bytes(q):
    return q.numel() * q.element_size()


SWEEP = [(2, 64, 4, 3), (2, 64, 4, 4), (2, 128, 8, 3), (4, 64, 4, 3), (4, 128, 8, 3), (1, 128, 4, 3)]


@pytest.mark.skipif(os.environ.get("DSA_BENCH_SWEEP") != "1", reason="DSA_BENCH_SWEEP=1 runs it")
@pytest.mark.parametrize("fp8_mma", [False, True])
def test_triton_config_sweep(bench, fp8_mma):
    """Prints the Triton kernel's time per (BLOCK_T, BLOCK_N, num_warps, num_stages) at 4096 x 32768, H 64."""
    from dsa_ops.backends.triton import indexer_logits as il

    args = _inputs(4096, 32768, 64, FP8, "full")
    flops = 2 * 64 * D * 4096 * 32768
    try:
        for cfg in SWEEP:
            il.CONFIG_OVERRIDE = cfg
            try:
                fn = lambda: il.launch(*args, True, fp8_mma=fp8_mma)  # noqa: E731
                us = bench.timer.median_us(fn, warmup=2, iters=10)
                print(f"\n  sweep fp8_mma={fp8_mma} cfg(BT,BN,warps,stages)={cfg}: {us:.0f} us "
                      f"{flops / (us * 1e-6) / 1e12:.0f} TFLOPS")
            except Exception as e:  # noqa: BLE001  (an out-of-resources config is a row, not a failure)
                print(f"\n  sweep fp8_mma={fp8_mma} cfg={cfg}: failed: {type(e).__name__}: {str(e)[:120]}")
    finally:
        il.CONFIG_OVERRIDE = None
