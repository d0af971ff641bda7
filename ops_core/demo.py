"""`python -m dsa_ops demo`: one DSA indexer step on synthetic long-context data.

Runs on the best available device (the GPU when there is one, else the CPU reference): indexer scores,
exact top-k per query row, the page-table mapping to physical KV slots, and the dequantisation of the
selected fp8 MLA cache rows, printing which provider served each step and how long it took.
"""

from __future__ import annotations

import argparse
import time

import torch

from . import registry


def _timed(device, fn):
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, (time.perf_counter() - t0) * 1e3


def _run_step(name, device, args, kwargs):
    """Run torch.ops.dsa.<name>; on a GPU without a kernel for it, say so and run the reference."""
    fn = getattr(torch.ops.dsa, name)
    if device.type != "cuda":
        out, ms = _timed(device, lambda: fn(*args, **kwargs))
        return out, ms, "reference (CPU)"
    try:
        provider = registry.select(name, _kernel_args(name, args, kwargs)).backend
    except registry.DispatchError:
        with registry.use_backend("reference"):
            out, ms = _timed(device, lambda: fn(*args, **kwargs))
        return out, ms, "reference (no GPU kernel for this op yet)"
    out, ms = _timed(device, lambda: fn(*args, **kwargs))  # first call: includes any one-time build
    out, ms = _timed(device, lambda: fn(*args, **kwargs))
    return out, ms, provider


def _kernel_args(name, args, kwargs):
    from ._define import OPS, _normalize

    d = OPS[name]
    a = _normalize(name, d.arg_names, d.defaults, args, kwargs)
    if d.out is not None:
        a = a + d.out.alloc(*a)
    return a


def main(argv=()) -> int:
    import dsa_ops  # noqa: F401
    from dsa_ops.ops._common import window_topk

    ap = argparse.ArgumentParser(prog="python -m dsa_ops demo")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--keys", type=int, default=None)
    ap.add_argument("--k", type=int, default=2048)
    args = ap.parse_args(list(argv))
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    T = args.rows or (1024 if gpu else 32)
    N = args.keys or (65536 if gpu else 8192)
    H, D, P, k = 64, 128, 64, min(args.k, N)
    g = torch.Generator(device="cpu").manual_seed(0)
    print(f"dsa_ops demo on {torch.cuda.get_device_name(device) if gpu else 'CPU (exact reference)'}: "
          f"{T} query rows x {N} keys, {H} heads x {D}, fp8 e4m3, top-{k}, page size {P}")

    q = (torch.randn(T, H, D, generator=g) * 0.5).to(torch.float8_e4m3fn).to(device)
    kv = (torch.randn(N, D, generator=g) * 0.5).to(torch.float8_e4m3fn).to(device)
    kv_scale = (torch.rand(N, generator=g) + 0.5).to(device)
    weights = (torch.randn(T, H, generator=g) / H).to(device)
    ke = torch.arange(N - T + 1, N + 1, dtype=torch.int32).to(device)  # causal windows
    ks = torch.zeros(T, dtype=torch.int32, device=device)
    pages = (N + P - 1) // P
    page_table = torch.randperm(pages * 2, generator=g)[:pages].int().view(1, pages).to(device)
    row_to_batch = torch.zeros(T, dtype=torch.int32, device=device)

    steps = []
    logits, ms, who = _run_step("indexer_logits", device, (q, kv, kv_scale, weights, ks, ke), {})
    steps.append(("indexer_logits", ms, who, f"fp32 scores {list(logits.shape)}"))
    idx, ms, who = _run_step("topk", device, (logits, k), dict(lengths=ke - ks, row_starts=ks))
    steps.append(("topk", ms, who, f"int32 indices {list(idx.shape)}"))
    slots, ms, who = _run_step("page_table_transform", device, (idx, page_table),
                                dict(row_to_batch=row_to_batch, page_size=P))
    steps.append(("page_table_transform", ms, who, f"physical slots {list(slots.shape)}"))
    # An fp8 MLA cache ("v32": 656 bytes a token) holding every page, and the selected rows of one query.
    cache = torch.randint(0, 120, (pages * 2, P, 1, 656), dtype=torch.uint8, generator=g).to(device)
    scales = torch.full((pages * 2, P, 1, 4), 0.01, dtype=torch.float32).to(device)
    cache[..., 512:528] = scales.view(torch.uint8)
    rows, ms, who = _run_step("dequant_k_cache_paged", device, (cache, slots[-1]), dict(layout="v32"))
    steps.append(("dequant_k_cache_paged", ms, who, f"bf16 rows {list(rows.shape)}"))

    # Check the pipeline end to end against the reference on a few rows.
    check = slice(T - 4, T)
    ref_idx = window_topk(logits[check], k, (ke - ks)[check], ks[check])
    same = all(set(a.tolist()) == set(b.tolist()) for a, b in zip(idx[check].cpu(), ref_idx.cpu()))
    for name, ms, who, what in steps:
        print(f"  {name:22} {ms:9.3f} ms  {what:28} via {who}")
    print(f"top-k of the last 4 rows equals the reference: {same}")
    return 0 if same else 1
