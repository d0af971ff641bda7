"""Smoke run of the cuda sparse_mla_decode provider: one small case per (layout, heads, path) against the
exact reference, one line each with the max errors, so a failure is easy to place from a log.

    python tools/smoke_sparse_mla_decode.py            # exits 1 if any case is off or NaN
    python tools/smoke_sparse_mla_decode.py --time     # also times the kernel beside FlashMLA
    python tools/smoke_sparse_mla_decode.py --variant 3  # only variant 3's cases (a shorter compute-sanitizer run)

Each case runs kernel variants 0 (sm90_sparse_mla_decode.cuh) and 3 (three warpgroup roles,
sm90_sparse_mla_decode_ws.cuh); --time times variant 3 ("v3") and the provider's choice ("op", variant_for: 3 on
SM90).

--time runs the benchmark's shapes (benchmarks/bench_sparse_mla_decode.py: its caches, inputs and
FlashMLA from .peer): us by CUDA-graph replay after an L2 flush (median of 30), FlashMLA's us, its
time over ours, and ours against the reference on the first request.

Cases come from tests/sparse_mla_decode_cases.py (NaN-filled unused cache slots, invalid indices,
topk_lens cutting a request and a request of length 0, attn_sink).
"""

from __future__ import annotations

import functools
import os
import sys
import time

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "tests"))

from sparse_mla_decode_cases import compare, make_case, oracle  # noqa: E402

SCALE = {"v32": 576**-0.5, "v4": 512**-0.5}


def main() -> int:
    from dsa_ops.backends import cuda
    from dsa_ops.backends.cuda import providers_sparse_mla_decode as pm

    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(dev)}, available: {cuda.available(dev) or 'yes'}", flush=True)
    t = time.perf_counter()
    print(f"library: {cuda.load(dev)} ({time.perf_counter() - t:.1f} s)", flush=True)
    failed = 0
    args = sys.argv[1:]
    variants = (int(args[args.index("--variant") + 1]),) if "--variant" in args else (0, 3)
    for layout, heads, splits, variant in ((lo, h, sp, v) for v in variants for lo in ("v32", "v4") for h in (64, 128)
                                           for sp in (1, 3)):
        q, cache, idx, lens, sink = make_case(layout, 3, 2, heads, 512, page=64, num_blocks=24,
                                              lens=[512, 300, 0], seed=heads + splits, device=dev)
        out = torch.full((3, 2, heads, 512), float("nan"), dtype=torch.bfloat16, device=dev)
        lse = torch.full((3, heads, 2), float("nan"), dtype=torch.float32, device=dev)
        name = f"variant={variant} {layout} heads={heads} splits={splits}"
        try:
            pm.launch(q, cache, idx, SCALE[layout], layout, lens, sink, splits=splits, out=out, lse=lse,
                      variant=variant)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (reported per case; the next case still runs)
            print(f"{name}: FAILED to run: {type(e).__name__}: {e}", flush=True)
            failed += 1
            continue
        ro, rl, vmax = oracle(q, cache, idx, SCALE[layout], layout, lens, sink)
        fin = torch.isfinite(rl)
        oerr = (out.double() - ro).abs().max().item()
        lerr = ((lse.double() - rl).abs() / rl.abs().clamp(min=1))[fin].max().item()
        nan = int(torch.isnan(out).sum()) + int(torch.isnan(lse).sum())
        why = compare(out, lse, ro, rl, vmax)
        print(f"{name}: max |out err| {oerr:.3g} (max |out| {ro.abs().max().item():.3g}), "
              f"max lse rel err {lerr:.3g}, NaN {nan}: {'ok' if why is None else 'FAIL ' + why}", flush=True)
        failed += why is not None
    print("smoke:", "ok" if failed == 0 else f"{failed} failed")
    if "--time" in sys.argv[1:]:
        failed += time_variants()
    return 1 if failed else 0


def time_variants() -> int:
    """One line per benchmark shape: us of each variant and of the op's choice; FlashMLA's us, over the op's."""
    sys.path.insert(0, os.path.join(_ROOT, "benchmarks"))
    import bench_sparse_mla_decode as bm
    from dsa_ops.backends.cuda import providers_sparse_mla_decode as pm
    from dsa_ops.ops.sparse_mla_decode import reference
    from harness import Timer, capture_graph

    timer = Timer()
    fm = bm._flashmla()
    bad = 0
    for layout, heads, s_q, batch in bm.CASES:
        cache = bm._pool(layout)
        q, idx = bm._inputs(batch, s_q, heads, layout=layout)
        scale = bm.D_QK[layout] ** -0.5
        out = torch.empty((batch, s_q, heads, 512), dtype=torch.bfloat16, device="cuda")
        lse = torch.empty((batch, heads, s_q), dtype=torch.float32, device="cuda")
        variants = {"v3": {"variant": 3}, "op": {}}  # variant 0 (forced only) is not timed
        times = {}
        ro, rl = reference(q[:1], cache, idx[:1], scale, layout, None, None)
        err = lerr = 0.0
        for name, kw in variants.items():
            out.fill_(float("nan"))
            fn = functools.partial(pm.launch, q, cache, idx, scale, layout, out=out, lse=lse, **kw)
            times[name] = timer.median_us(capture_graph(fn).replay, iters=30)
            err = max(err, ((out[:1].float() - ro.float()).abs().max() / ro.float().abs().max()).item())
            lerr = max(lerr, ((lse[:1] - rl).abs() / rl.abs().clamp(min=1)).max().item())
        ok = err < 2 / 128 and lerr < 1e-5
        bad += not ok
        peer = ""
        if fm is not None:
            try:
                g = capture_graph(bm.flashmla_decode(fm, q, cache, idx, scale)[1])
                tf = timer.median_us(g.replay, iters=30)
                peer = f" | flashmla {tf:.1f} us, flashmla/op {tf / times['op']:.3f}"
            except Exception as e:  # noqa: BLE001  (reported; ours is still timed)
                peer = f" | flashmla failed: {type(e).__name__}: {str(e)[:120]}"
        flops = 2 * (bm.D_QK[layout] + 512) * bm.TOPK * batch * s_q * heads
        cells = ", ".join(f"{k} {v:.1f}" for k, v in times.items())
        print(f"{layout} h{heads} s_q{s_q} b{batch} splits {pm.split_count(batch, s_q, heads, bm.TOPK)}: {cells} us "
              f"(op {flops / times['op'] / 1e6:.0f} TFLOP/s), err {err:.2g} lse {lerr:.2g}"
              f"{'' if ok else ' FAIL'}{peer}", flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(main())
