"""sparse_attention: the Triton provider against our split-K path, vLLM's Triton kernel and the copy floor.

Shapes of a DSA decode/verify/prefill step: 24 query / 2 KV heads, D 128, every row its own request of
65536 tokens on random pages of 64 drawn from a 65536-page pool (2 GiB of fp8 KV, far past L2), 2048
distinct random positions a row. Caches in vLLM's layout (K and V views of one [pages, Hkv, P, 2 D]
buffer). Every figure is a CUDA-graph replay of one call after an L2 flush (CUDA events, median), so
launch and Python costs stay out at every row count and each kernel starts cold, as in a decode step.
Floor: the selected K and V bytes (rows x Hkv x topk x 2 D x element size) at the device-copy rate
of the same run. Baselines: `splitk` (our split-K path forced), `vllm` (qsa_peer's
qsa_sparse_paged_attention, when .peer/ holds it; gate 30.0 so its sigmoid output gate is 1).

    python -m pytest benchmarks/bench_sparse_attention.py -m gpu -s --dsa-results OUT.json
"""

from __future__ import annotations

import functools
import os
import sys

import pytest
import torch
from harness import host_overhead_us, record

pytestmark = pytest.mark.gpu

HQ, HKV, D, PAGE, TOPK, REQ_LEN, POOL_PAGES = 24, 2, 128, 64, 2048, 65536, 65536
SCALE = D**-0.5
CASES = [("fp8", r) for r in (1, 16, 64, 400, 1600, 4096)] + [("bf16", 1600)]
_PEER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".peer")


def _peer():
    """vLLM's kernel module from .peer/ (a measuring stick, never a dependency), or None."""
    if not os.path.exists(os.path.join(_PEER_DIR, "qsa_peer.py")):
        return None
    sys.path.insert(0, _PEER_DIR)
    try:
        import qsa_peer
    finally:
        sys.path.remove(_PEER_DIR)
    return qsa_peer


@functools.lru_cache(maxsize=2)
def _pool(dtype: str):
    """[pages, Hkv, P, 2 D] KV buffer (vLLM's layout) and its K, V views [pages, P, Hkv, D]."""
    g = torch.Generator(device="cuda").manual_seed(0)
    buf = torch.empty((POOL_PAGES, HKV, PAGE, 2 * D), dtype=torch.bfloat16, device="cuda")
    step = 4096
    for p0 in range(0, POOL_PAGES, step):
        buf[p0:p0 + step].normal_(generator=g)
    if dtype == "fp8":
        buf = buf.to(torch.float8_e4m3fn)
    kv = buf.transpose(1, 2)
    return kv[..., :D], kv[..., D:]


def _inputs(rows: int, seed: int = 1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((rows, HQ, D), generator=g, device="cuda").to(torch.bfloat16)
    bt = torch.randint(0, POOL_PAGES, (rows, REQ_LEN // PAGE), generator=g, device="cuda", dtype=torch.int32)
    t2r = torch.arange(rows, device="cuda", dtype=torch.int32)
    idx = torch.empty((rows, TOPK), dtype=torch.int32, device="cuda")
    for r0 in range(0, rows, 512):
        r1 = min(rows, r0 + 512)
        idx[r0:r1] = torch.rand((r1 - r0, REQ_LEN), generator=g, device="cuda").topk(TOPK, dim=1).indices.int()
    return q, idx, bt, t2r


def _graph(fn):
    """fn captured in a CUDA graph (after a warm-up call on a side stream); returns its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


@pytest.mark.parametrize("dtype,rows", CASES)
def test_sparse_attention(bench, dtype, rows):
    from dsa_ops.backends.triton import sparse_attention as sa
    from dsa_ops.ops.sparse_attention import reference

    kc, vc = _pool(dtype)
    q, idx, bt, t2r = _inputs(rows)
    out = torch.empty((rows, HQ, D), dtype=torch.bfloat16, device="cuda")
    out_split = torch.empty_like(out)
    ours = lambda: sa.launch(q, kc, vc, idx, bt, t2r, SCALE, 1.0, 1.0, out)  # noqa: E731
    splitk = lambda: sa.launch(q, kc, vc, idx, bt, t2r, SCALE, 1.0, 1.0, out_split, split=True)  # noqa: E731
    fns = {"triton": ours, "splitk": splitk}
    peer = _peer()
    if peer is not None:
        out_peer = torch.empty_like(out)
        packed = torch.cat([idx, torch.full((rows, 1), TOPK, dtype=torch.int32, device="cuda")], dim=1)
        gate = torch.full((rows, HQ, D), 30.0, dtype=torch.bfloat16, device="cuda")
        fns["vllm"] = lambda: peer.qsa_sparse_paged_attention(  # noqa: E731
            q, kc, vc, packed, bt, t2r, True, out_peer, 1.0, 1.0, output_gate=gate)

    graphs = {name: _graph(fn) for name, fn in fns.items()}
    times = {name: bench.timer.median_us(g.replay, iters=50) for name, g in graphs.items()}

    sample = slice(0, min(rows, 16))  # the reference on a few rows: the timed outputs are right
    ref = reference(q[sample], kc, vc, idx[sample], bt, t2r[sample], SCALE, 1.0, 1.0).float()
    errors = {name: ((o[sample].float() - ref).abs().max() / ref.abs().max()).item()
              for name, o in (("triton", out), ("splitk", out_split), *([("vllm", out_peer)] if peer else []))}
    assert errors["triton"] < 2e-2 and errors["splitk"] < 2e-2, errors

    nbytes = rows * HKV * TOPK * 2 * D * kc.element_size()
    us = times.pop("triton")
    extra = {"timing": "cuda-graph replay, cold L2", "achieved_gbps": round(nbytes / (us * 1e-6) / 1e9, 1),
             "path": "split-K" if sa.use_split(rows, HKV) else "single-pass",
             "max_rel_err": {k: float(f"{v:.3g}") for k, v in errors.items()}}
    if rows <= 64:
        extra["host_overhead_us"] = round(host_overhead_us(ours)[0], 2)
    bench.add(record("sparse_attention", "triton",
                     {"rows": rows, "tokens": REQ_LEN, "topk": TOPK, "heads": f"{HQ}/{HKV}", "head_dim": D,
                      "dtype": dtype, "page_size": PAGE},
                     us, floor_us=bench.floor_us(nbytes), floor_kind="memory (selected K+V bytes at copy rate)",
                     baselines=times, **extra))


# Sweep variants (CONFIG_OVERRIDE dicts of backends_triton/sparse_attention.py).
SWEEP_SINGLES = [dict(single_config=c) for c in ((32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 4, 4),
                                                 (64, 8, 3), (128, 4, 2), (128, 8, 2), (128, 8, 3), (32, 2, 3))]
SWEEP_SINGLES += [dict(single_config=(64, 4, 3), fp8_pairs=False), dict(single_config=(32, 4, 3), fp8_pairs=False)]
SWEEP_SPLITS = [dict(split_config=c, slots_inline=i, splits=s)
                for c in ((32, 4, 2), (32, 4, 3), (64, 4, 3), (16, 4, 2)) for i in (True, False) for s in (None, 8, 32)]


def _compile_one(job) -> str:
    """Compile one sweep variant (a launch on small inputs of the benchmark's layout) into Triton's cache."""
    dtype, split, override = job
    from dsa_ops.backends.triton import sparse_attention as sa

    g = torch.Generator(device="cuda").manual_seed(0)
    buf = torch.randn((8, HKV, PAGE, 2 * D), generator=g, device="cuda").to(
        torch.float8_e4m3fn if dtype == "fp8" else torch.bfloat16).transpose(1, 2)
    q = torch.randn((2, HQ, D), generator=g, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, 8 * PAGE, (2, TOPK), generator=g, device="cuda", dtype=torch.int32)
    bt = torch.arange(16, device="cuda", dtype=torch.int32).view(2, 8) % 8
    t2r = torch.arange(2, device="cuda", dtype=torch.int32)
    out = torch.empty((2, HQ, D), dtype=torch.bfloat16, device="cuda")
    sa.CONFIG_OVERRIDE = override
    try:
        sa.launch(q, buf[..., :D], buf[..., D:], idx, bt, t2r, SCALE, 1.0, 1.0, out, split=split)
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:  # noqa: BLE001  (reported by the sweep)
        return f"{type(e).__name__}: {str(e)[:200]}"


def precompile(procs: int = 12) -> None:
    """Fill Triton's on-disk cache with every sweep variant, `procs` compiles at a time."""
    import multiprocessing as mp

    jobs = [(d, False, o) for d in ("fp8", "bf16") for o in SWEEP_SINGLES if d == "fp8" or "fp8_pairs" not in o]
    jobs += [("fp8", True, o) for o in SWEEP_SPLITS if o["splits"] is None]
    with mp.get_context("spawn").Pool(procs) as pool:
        for job, res in zip(jobs, pool.map(_compile_one, jobs)):
            if res != "ok":
                print("precompile", job, res, flush=True)


def sweep(out_path: str, rows_list=(1, 16, 32, 64, 128, 400, 1600, 4096)) -> None:
    """Time configs of both paths (and vLLM's) over row counts, cold-L2 graph replays; write json + print a
    table. For choosing SINGLE_CONFIG, SPLIT_CONFIG, the split count and SPLIT_MAX_PROGRAMS."""
    import json
    import time

    from dsa_ops.backends.triton import sparse_attention as sa
    from dsa_ops.ops.sparse_attention import reference
    from harness import Timer

    timer = Timer()
    peer = _peer()
    results = []
    singles, splits = SWEEP_SINGLES, SWEEP_SPLITS
    for dtype, rows in [("fp8", r) for r in rows_list] + [("bf16", 1600)]:
        kc, vc = _pool(dtype)
        q, idx, bt, t2r = _inputs(rows)
        out = torch.empty((rows, HQ, D), dtype=torch.bfloat16, device="cuda")
        ref = reference(q[:4], kc, vc, idx[:4], bt, t2r[:4], SCALE, 1.0, 1.0).float()
        variants = []
        if rows >= 32 or dtype == "bf16":
            variants += [("single", o) for o in singles if dtype == "fp8" or o.get("fp8_pairs", True)]
        else:
            variants += [("single", dict(single_config=(64, 4, 3)))]
        if rows <= 128 and dtype == "fp8":
            variants += [("split", o) for o in splits]
        for path, o in variants:
            sa.CONFIG_OVERRIDE = o
            try:
                t0 = time.time()
                g = _graph(functools.partial(sa.launch, q, kc, vc, idx, bt, t2r, SCALE, 1.0, 1.0, out,
                                             split=path == "split"))
                err = ((out[:4].float() - ref).abs().max() / ref.abs().max()).item()
                us = timer.median_us(g.replay, iters=20)
                row = dict(dtype=dtype, rows=rows, path=path, us=round(us, 2), err=float(f"{err:.3g}"),
                           compile_s=round(time.time() - t0, 1), **{k: str(v) for k, v in o.items()})
            except Exception as e:  # noqa: BLE001  (a config that fails to compile is a sweep result)
                row = dict(dtype=dtype, rows=rows, path=path, error=f"{type(e).__name__}: {str(e)[:200]}",
                           **{k: str(v) for k, v in o.items()})
            finally:
                sa.CONFIG_OVERRIDE = None
            results.append(row)
            print(json.dumps(row), flush=True)
        if peer is not None:
            packed = torch.cat([idx, torch.full((rows, 1), TOPK, dtype=torch.int32, device="cuda")], dim=1)
            gate = torch.full((rows, HQ, D), 30.0, dtype=torch.bfloat16, device="cuda")
            po = torch.empty_like(out)
            for pre in (True, False):
                g = _graph(functools.partial(peer.qsa_sparse_paged_attention, q, kc, vc, packed, bt, t2r, pre, po,
                                             1.0, 1.0, output_gate=gate))
                err = ((po[:4].float() - ref).abs().max() / ref.abs().max()).item()
                us = timer.median_us(g.replay, iters=20)
                row = dict(dtype=dtype, rows=rows, path=f"vllm-prefill{int(pre)}", us=round(us, 2),
                           err=float(f"{err:.3g}"))
                results.append(row)
                print(json.dumps(row), flush=True)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    print("\ndtype rows | best single (us, cfg) | best split (us, cfg) | vllm us")
    for dtype, rows in [("fp8", r) for r in rows_list] + [("bf16", 1600)]:
        sel = [r for r in results if r["rows"] == rows and r["dtype"] == dtype and "us" in r]

        def best(path, sel=sel):
            c = [r for r in sel if r["path"] == path]
            if not c:
                return "-"
            b = min(c, key=lambda r: r["us"])
            return f"{b['us']:.1f} {[v for k, v in b.items() if k not in ('dtype', 'rows', 'path', 'us', 'compile_s')]}"
        vl = min((r["us"] for r in sel if r["path"].startswith("vllm")), default=None)
        print(f"{dtype} {rows} | {best('single')} | {best('split')} | {vl}")


if __name__ == "__main__":
    # python benchmarks/bench_sparse_attention.py precompile | sweep OUT.json
    if sys.argv[1:2] == ["precompile"]:
        precompile()
    else:
        sweep(sys.argv[2] if len(sys.argv) > 2 else "sweep_sparse_attention.json")
