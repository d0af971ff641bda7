"""Where the fused Triton indexer_topk spends its time, and whose scores it reproduces (H200, one run).

Per benchmark shape (4096 rows, k 2048, D 128, fp8, full windows, precise=False): the Triton
indexer_logits kernel alone, dsa.indexer_logits (the provider the registry picks), dsa.topk on its
scores, the dense route, the fused path end to end (filter EMIT 2: running count; EMIT 1: an atomic per
tile and row) and each fused stage on its own (the filter with EMIT 0, 1 and 2: counting only, and the
two emissions). Then, on 256 rows x 32768 keys in both modes: the fused result against the top-k of the
Triton logits (sets, and returned scores bitwise) and how many logits the CUDA and Triton kernels agree
on bitwise.

    python tools/probe_indexer_topk.py [out.json]
"""

from __future__ import annotations

import json
import sys

import dsa_ops  # noqa: F401
import torch
from dsa_ops.backends.triton import indexer_logits as il
from dsa_ops.backends.triton import indexer_topk as it

FP8 = torch.float8_e4m3fn
D, K = 128, 2048
INT32_MAX = 2**31 - 1


def median_us(fn, warmup=2, iters=10):
    """Median time of fn() in us, CUDA events, one launch sequence per sample."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    times.sort()
    return round(times[len(times) // 2], 1)


def inputs(t, n, h, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(t, h, D, device="cuda", generator=g).to(FP8)
    kv = torch.randn(n, D, device="cuda", generator=g).to(FP8)
    s = torch.rand(n, device="cuda", generator=g) + 0.5
    w = torch.randn(t, h, device="cuda", generator=g)
    ks = torch.zeros(t, dtype=torch.int32, device="cuda")
    ke = torch.full((t,), n, dtype=torch.int32, device="cuda")
    return q, kv, s, w, ks, ke


def as_sets(x):
    return torch.sort(torch.where(x < 0, torch.full_like(x, INT32_MAX), x), dim=1).values


def timings(t, n, h):
    args = inputs(t, n, h)
    q, kv, s, w, ks, ke = args
    lengths = (ke - ks).int()
    scores = torch.ops.dsa.indexer_logits(*args)
    topk_us = median_us(lambda x=scores: torch.ops.dsa.topk(x, K, lengths=lengths, row_starts=ks))
    del scores
    row = {"rows": t, "keys": n, "heads": h,
           "logits_backend": it._logits_backend(q, kv, s, w, ks, ke, False),
           "triton_logits_us": median_us(lambda: il.launch(*args, True, False)),
           "op_logits_us": median_us(lambda: torch.ops.dsa.indexer_logits(*args)),
           "topk_us": topk_us,
           "dense_route_us": median_us(lambda: it.launch_dense(*args, K, True, False))}
    for emit in (2, 1):
        row[f"fused_emit{emit}_us"] = median_us(lambda e=emit: it.launch_fused(*args, K, True, False, emit=e))
    for emit in (0, 1, 2):
        counts = torch.empty(t, dtype=torch.int32, device="cuda")
        stages, _ = it.fused_stages(*args, K, True, False, counts=counts, emit=emit)
        fns = dict(stages)
        for _, fn in stages:
            fn()
        torch.cuda.synchronize()
        row[f"emit{emit}_candidates_median"] = int(counts.float().median())
        row[f"filter_emit{emit}_us"] = median_us(lambda f=fns: (f["zero"](), f["filter"]()))
        if emit == 2:
            for name in ("sample", "gate", "select", "rescan"):
                row[f"{name}_us"] = median_us(fns[name])
    print(json.dumps(row), flush=True)
    return row


def agreement(precise):
    """The fused path against the top-k of the Triton logits, and CUDA vs Triton logits bitwise."""
    from dsa_ops.backends.cuda import providers_indexer as cuda_indexer

    args = inputs(256, 32768, 64, seed=1)
    q, kv, s, w, ks, ke = args
    counts = torch.empty(256, dtype=torch.int32, device="cuda")
    out, sc = it.launch_fused(*args, K, True, precise, return_scores=True, counts=counts)
    tri = il.launch(*args, True, precise)
    rel = torch.ops.dsa.topk(tri, K, lengths=(ke - ks).int(), row_starts=ks)
    col = out.long().clamp(0, 32767)
    got = {"precise": precise,
           "fused_rows_differing_from_triton_topk": int((as_sets(out) != as_sets(rel)).any(1).sum()),
           "fused_scores_bitwise_triton_logits": bool(torch.equal(sc.view(torch.int32),
                                                                   tri.gather(1, col).view(torch.int32))),
           "candidates_median": int(counts.float().median())}
    try:
        cud = cuda_indexer.run(*args, True, precise)
        got["cuda_vs_triton_logits_bitwise_fraction"] = float((cud.view(torch.int32) == tri.view(torch.int32))
                                                              .float().mean())
        got["cuda_vs_triton_max_rel_diff"] = float(((cud - tri).abs().amax(1) / tri.abs().amax(1)).max())
        crel = torch.ops.dsa.topk(cud, K, lengths=(ke - ks).int(), row_starts=ks)
        got["rows_topk_cuda_vs_triton_differ"] = int((as_sets(crel) != as_sets(rel)).any(1).sum())
    except Exception as e:  # noqa: BLE001  (the CUDA library may be missing: say so)
        got["cuda"] = f"{type(e).__name__}: {str(e)[:200]}"
    print(json.dumps(got), flush=True)
    return got


def main():
    rows = [agreement(False), agreement(True)]
    for t, n, h in ((4096, 131072, 64), (4096, 131072, 32), (4096, 32768, 64)):
        rows.append(timings(t, n, h))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
