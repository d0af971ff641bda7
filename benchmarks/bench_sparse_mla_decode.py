"""sparse_mla_decode: our providers (cuda, triton) against FlashMLA's sparse decode, the copy floor and bf16 ceiling.

FlashMLA's DeepSeek-V3.2 decode shapes: FP8 v32 cache (656 bytes a token), pages of 64 drawn at random
from a 65536-page pool (2.6 GiB, far past L2), every request 65536 tokens, each query token 2048
distinct random positions of its request mapped to slots; q bf16 [B, s_q, H, 576]; heads 64/128, s_q 1/2,
batch 32/64/128, plus batch 1 and 4. Every figure is a CUDA-graph replay of one call after an L2 flush
(CUDA events), the median of five interleaved rounds (each round times every kernel of the case in turn, a
median of 10 replays each), so clock drift falls on ours and FlashMLA's alike. tflops counts
2 * (576 + 512) * topk per (query token, head); the floor is the
selected cache bytes (B * s_q * topk * bytes a token) read once at the device-copy rate of the same run;
ceiling_tflops is the bf16 matmul rate of the same run. Baselines: `flashmla` (vLLM 0.33.0's
_flashmla_C.sparse_decode_fwd from .peer/vllm, when present: a measuring stick, never imported by
project code), timed on the same inputs. Each of our providers that runs on the device (cuda: SM90 only)
gets its own row, with the other provider and flashmla as its baselines; `cuda` runs the provider's
choice of kernel (variant 3 on SM90, the three-role sm90_sparse_mla_decode_ws.cuh with the lean producer and
softmax), `cuda_v0` forces variant 0.
The V4 layout (584 bytes a token: 448 e4m3 with a ue8m0 scale per 64, 64 bf16 rope, q 512 wide) has its
own rows at the batch 32/64/128 shapes (flops counted with 512 + 512).

    python -m pytest benchmarks/bench_sparse_mla_decode.py -m gpu -s --dsa-results OUT.json
"""

from __future__ import annotations

import functools
import glob
import lzma
import os
import shutil
import tempfile

import pytest
import torch
from harness import capture_graph, host_overhead_us, host_overheads_us, interleaved_times_us, matmul_tflops, record

pytestmark = pytest.mark.gpu

D_V, PAGE, TOPK, REQ_LEN, POOL_PAGES = 512, 64, 2048, 65536, 65536
D_QK = {"v32": 576, "v4": 512}
BPT = {"v32": 656, "v4": 584}
CASES = ([("v32", h, s, b) for h in (64, 128) for s in (1, 2) for b in (32, 64, 128)]
         + [("v32", h, 1, b) for h in (64, 128) for b in (1, 4)]
         + [("v4", h, s, b) for h in (64, 128) for s in (1, 2) for b in (32, 64, 128)])
_PEER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".peer", "vllm")


def flashmla_decode(fm, q, cache, idx, scale):
    """FlashMLA's sparse_decode_fwd on these inputs: its first call's outputs (the call also makes its scheduling
    metadata) and a call that reuses that metadata, as an engine does across layers."""
    first = fm.sparse_decode_fwd(q, cache, idx, None, None, None, None, None, None, None, D_V, scale, None, False)
    _, _, meta, nsp = first
    return first, functools.partial(fm.sparse_decode_fwd, q, cache, idx, None, None, meta, nsp, None, None, None, D_V,
                                    scale, None, False)


@functools.lru_cache(maxsize=1)
def _flashmla():
    """torch.ops._flashmla_C from .peer/vllm (unpacking the .xz copies into a temp dir if needed), or None."""
    so = os.path.join(_PEER_DIR, "_flashmla_C.abi3.so")
    if not os.path.exists(so):
        packed = sorted(glob.glob(os.path.join(_PEER_DIR, "_flashmla*.abi3.so.xz")))
        if not packed:
            return None
        tmp = tempfile.mkdtemp(prefix="flashmla_")
        for p in packed:
            with lzma.open(p) as src, open(os.path.join(tmp, os.path.basename(p)[:-3]), "wb") as dst:
                shutil.copyfileobj(src, dst)
        so = os.path.join(tmp, "_flashmla_C.abi3.so")
    ext = os.path.join(os.path.dirname(so), "_flashmla_extension_C.abi3.so")
    try:
        torch.ops.load_library(so)
        if os.path.exists(ext):
            torch.ops.load_library(ext)
    except Exception as e:  # noqa: BLE001  (a peer that does not load is reported, not fatal)
        print(f"\n  flashmla not loaded: {type(e).__name__}: {str(e)[:200]}")
        return None
    return torch.ops._flashmla_C


@functools.lru_cache(maxsize=1)
def _pool_v4() -> torch.Tensor:
    """uint8 [POOL_PAGES, 64, 1, 584] v4 cache: N(0, 1) values, per-64 power-of-two scales (ue8m0) covering
    the group's amax; a page is its 64 tokens' 576 bytes (448 e4m3, 64 bf16 rope), then their 8 scale bytes."""
    g = torch.Generator(device="cuda").manual_seed(0)
    cache = torch.empty((POOL_PAGES, PAGE * BPT["v4"]), dtype=torch.uint8, device="cuda")
    step = 1 << 14  # pages
    for p0 in range(0, POOL_PAGES, step):
        p1 = min(POOL_PAGES, p0 + step)
        x = torch.randn(((p1 - p0) * PAGE, 512), generator=g, device="cuda")
        grp = x[:, :448].reshape(-1, 7, 64)
        e = torch.ceil(torch.log2(grp.abs().amax(-1).clamp_min(1e-30) / 448.0)).clamp(-127, 127)
        codes = (grp / torch.exp2(e)[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        tok = torch.cat([codes.reshape(-1, 448), x[:, 448:].to(torch.bfloat16).contiguous().view(torch.uint8)], 1)
        sc = torch.zeros(((p1 - p0) * PAGE, 8), dtype=torch.uint8, device="cuda")
        sc[:, :7] = (e + 127).to(torch.uint8)
        page = cache[p0:p1]
        page[:, :PAGE * 576] = tok.reshape(p1 - p0, PAGE * 576)
        page[:, PAGE * 576:] = sc.reshape(p1 - p0, PAGE * 8)
    return cache.view(POOL_PAGES, PAGE, 1, BPT["v4"])


def _pool(layout: str = "v32") -> torch.Tensor:
    return _pool_v32() if layout == "v32" else _pool_v4()


@functools.lru_cache(maxsize=1)
def _pool_v32() -> torch.Tensor:
    """uint8 [POOL_PAGES, 64, 1, 656] v32 cache: N(0, 1) values quantised with per-128 amax scales."""
    g = torch.Generator(device="cuda").manual_seed(0)
    cache = torch.empty((POOL_PAGES * PAGE, BPT["v32"]), dtype=torch.uint8, device="cuda")
    step = 1 << 20
    for t0 in range(0, cache.shape[0], step):
        t1 = min(cache.shape[0], t0 + step)
        x = torch.randn((t1 - t0, D_QK["v32"]), generator=g, device="cuda")
        grp = x[:, :512].reshape(-1, 4, 128)
        sc = grp.abs().amax(-1).clamp_min(1e-4) / 448.0
        codes = (grp / sc[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        cache[t0:t1, :512] = codes.reshape(-1, 512)
        cache[t0:t1, 512:528] = sc.contiguous().view(torch.uint8)
        cache[t0:t1, 528:] = x[:, 512:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return cache.view(POOL_PAGES, PAGE, 1, BPT["v32"])


def _inputs(batch: int, s_q: int, heads: int, seed: int = 1, layout: str = "v32"):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((batch, s_q, heads, D_QK[layout]), generator=g, device="cuda").to(torch.bfloat16)
    bt = torch.randint(0, POOL_PAGES, (batch, REQ_LEN // PAGE), generator=g, device="cuda", dtype=torch.int32)
    rows = batch * s_q
    pos = torch.empty((rows, TOPK), dtype=torch.int64, device="cuda")
    for r0 in range(0, rows, 128):
        r1 = min(rows, r0 + 128)
        pos[r0:r1] = torch.rand((r1 - r0, REQ_LEN), generator=g, device="cuda").topk(TOPK, dim=1).indices
    req = torch.arange(batch, device="cuda").repeat_interleave(s_q)[:, None]
    slots = bt[req, pos // PAGE].long() * PAGE + pos % PAGE
    return q, slots.to(torch.int32).view(batch, s_q, TOPK)


def _bf16_ceiling(bench) -> float:
    if "bf16_tflops" not in bench.ceilings:
        bench.ceilings["bf16_tflops"] = round(matmul_tflops(bench.timer, torch.bfloat16), 1)
    return bench.ceilings["bf16_tflops"]


def _ours() -> dict:
    """Our providers that run here: name -> (launch, split_count(batch, s_q, heads, topk))."""
    from dsa_ops.backends import cuda
    from dsa_ops.backends.cuda import providers_sparse_mla_decode as mc
    from dsa_ops.backends.triton import sparse_mla_decode as mt

    found = {"triton": (mt.launch, lambda b, s, h, k: mt.split_count(b, s, h, k, mt._sm_count(None)))}
    dev = torch.device("cuda")
    why = cuda.available(dev) or cuda.sm90_only(torch.zeros(1, device=dev), "CUDA sparse MLA decode")
    if why is None:
        found["cuda"] = (mc.launch, lambda b, s, h, k: mc.split_count(b, s, h, k, cuda.sm_count(None)))
        # variant 0 forced at every shape: its own row, and a baseline column of the others
        found["cuda_v0"] = (functools.partial(mc.launch, variant=0),
                            lambda b, s, h, k: mc.split_count(b, s, h, k, cuda.sm_count(None)))
    else:
        print(f"\n  cuda provider not timed: {why}")
    return found


@pytest.mark.parametrize("layout,heads,s_q,batch", CASES)
def test_sparse_mla_decode(bench, layout, heads, s_q, batch):
    from dsa_ops.ops.sparse_mla_decode import reference

    cache = _pool(layout)
    q, idx = _inputs(batch, s_q, heads, layout=layout)
    scale = D_QK[layout]**-0.5
    ours = _ours()
    outs = {name: (torch.empty((batch, s_q, heads, D_V), dtype=torch.bfloat16, device="cuda"),
                   torch.empty((batch, heads, s_q), dtype=torch.float32, device="cuda")) for name in ours}
    fns = {name: functools.partial(launch, q, cache, idx, scale, layout, out=outs[name][0], lse=outs[name][1])
           for name, (launch, _) in ours.items()}
    fm = _flashmla()
    peer_out = peer_lse = None
    if fm is not None:
        try:
            first, fns["flashmla"] = flashmla_decode(fm, q, cache, idx, scale)
            peer_out, peer_lse = first[0], first[1]
        except Exception as e:  # noqa: BLE001  (reported; ours is still timed)
            print(f"\n  flashmla failed: {type(e).__name__}: {str(e)[:200]}")
    graphs = {name: capture_graph(fn) for name, fn in fns.items()}
    times = interleaved_times_us(bench.timer, {name: g.replay for name, g in graphs.items()}, rounds=5, iters=10)

    # Each timed output against the reference on the first request (float32 math on the dequantised rows).
    ro, rl = reference(q[:1], cache, idx[:1], scale, layout, None, None)
    flops = 2 * (D_QK[layout] + D_V) * TOPK * batch * s_q * heads
    nbytes = batch * s_q * TOPK * BPT[layout]
    case = {"batch": batch, "s_q": s_q, "heads": heads, "topk": TOPK, "tokens": REQ_LEN, "layout": layout,
            "page_size": PAGE, "head_dim": D_QK[layout]}
    failures = []
    for name, (_, splits) in ours.items():
        out, lse = outs[name]
        err = ((out[:1].float() - ro.float()).abs().max() / ro.float().abs().max()).item()
        lse_err = ((lse[:1] - rl).abs() / rl.abs().clamp(min=1)).max().item()
        if not (err < 2 / 128 and lse_err < 1e-5):
            failures.append((name, err, lse_err))
        us = times[name]
        extra = {"timing": "cuda-graph replay, cold L2", "tflops": round(flops / (us * 1e-6) / 1e12, 1),
                 "ceiling_tflops": _bf16_ceiling(bench), "achieved_gbps": round(nbytes / (us * 1e-6) / 1e9, 1),
                 "splits": splits(batch, s_q, heads, TOPK),
                 "max_rel_err": float(f"{err:.3g}"), "lse_max_rel_err": float(f"{lse_err:.3g}")}
        if peer_out is not None:
            extra["flashmla_max_rel_err"] = float(
                f"{((peer_out[:1].float() - ro.float()).abs().max() / ro.float().abs().max()).item():.3g}")
            # FlashMLA's lse against the same reference, by ours' measure (natural log; [B, H, s_q] or [B, s_q, H]).
            pl = peer_lse[:1].float()
            pl = pl if pl.shape == rl.shape else pl.transpose(1, 2)
            extra["flashmla_lse_max_rel_err"] = float(f"{((pl - rl).abs() / rl.abs().clamp(min=1)).max().item():.3g}")
        if batch <= 4:
            extra["host_overhead_us"] = round(host_overhead_us(fns[name])[0], 2)
        bench.add(record("sparse_mla_decode", name, case, us, floor_us=bench.floor_us(nbytes),
                         floor_kind="memory (selected cache bytes at copy rate)",
                         baselines={k: v for k, v in times.items() if k != name}, **extra))
    assert not failures, failures


@pytest.mark.skipif(not os.environ.get("DSA_BENCH_SWEEP"), reason="set DSA_BENCH_SWEEP=1 for the split sweep")
@pytest.mark.parametrize("heads,batch", [(64, 1), (128, 1), (64, 4), (128, 4), (64, 8), (128, 8), (64, 32)])
def test_sparse_mla_decode_splits_sweep(bench, heads, batch):
    """The CUDA kernel (the provider's variant) by forced split count, v32, s_q 1, FlashMLA beside: the measurements
    behind providers_sparse_mla_decode.split_count. Graph replay, cold L2, interleaved rounds."""
    from dsa_ops.backends.cuda import providers_sparse_mla_decode as mc

    cache = _pool("v32")
    q, idx = _inputs(batch, 1, heads)
    scale = D_QK["v32"]**-0.5
    out = torch.empty((batch, 1, heads, D_V), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((batch, heads, 1), dtype=torch.float32, device="cuda")
    fns = {s: functools.partial(mc.launch, q, cache, idx, scale, "v32", splits=s, out=out, lse=lse)
           for s in (1, 2, 4, 8, 16, 32)}
    fm = _flashmla()
    if fm is not None:
        fns["flashmla"] = flashmla_decode(fm, q, cache, idx, scale)[1]
    graphs = {name: capture_graph(fn) for name, fn in fns.items()}
    times = interleaved_times_us(bench.timer, {name: g.replay for name, g in graphs.items()}, rounds=5, iters=10)
    res = {name: round(v, 1) for name, v in times.items()}
    print(f"\n  mla splits sweep h{heads} b{batch}: heuristic {mc.split_count(batch, 1, heads, TOPK)}: {res}")


@pytest.mark.parametrize("heads,batch", [(64, 1), (128, 1), (128, 4), (128, 32)])
def test_sparse_mla_decode_op(bench, heads, batch):
    """The op as users call it (`torch.ops.dsa.sparse_mla_decode`, functional, automatic choice), v32, s_q 1, called
    eagerly: the host time a call of back-to-back calls (no sync), beside FlashMLA's sparse_decode_fwd on the same
    inputs (its scheduling metadata made once, as an engine reuses it across layers) and torch.add(out=) as the
    host's pace, timed in turn (harness.host_overheads_us); the GPU times of both from graph replays beside."""
    import dsa_ops  # noqa: F401  (registers torch.ops.dsa)
    from dsa_ops import registry

    cache = _pool("v32")
    q, idx = _inputs(batch, 1, heads, layout="v32")
    scale = D_QK["v32"]**-0.5
    a, b, c = (torch.ones(1024, device="cuda") for _ in range(3))
    fns = {"op": lambda: torch.ops.dsa.sparse_mla_decode(q, cache, idx, softmax_scale=scale),
           "torch_add": lambda: torch.add(a, b, out=c)}
    fm = _flashmla()
    if fm is not None:
        fns["flashmla"] = flashmla_decode(fm, q, cache, idx, scale)[1]
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    backend = registry.select("sparse_mla_decode", (q, cache, idx, scale, "v32", None, None)).backend
    got = dict(zip(fns, host_overheads_us(list(fns.values()), calls=2000, batches=20)))
    med, best = got.pop("op")
    graph_us = {name: round(bench.timer.median_us(capture_graph(fns[name]).replay, iters=50), 2)
                for name in fns if name != "torch_add"}
    case = {"batch": batch, "s_q": 1, "heads": heads, "topk": TOPK, "tokens": REQ_LEN, "layout": "v32",
            "page_size": PAGE, "head_dim": D_QK["v32"]}
    bench.add(record("sparse_mla_decode", "op-eager-host", case, med, baselines={k: v[0] for k, v in got.items()},
                     timing="host time a call of back-to-back eager calls (median of 20 batches; not GPU time)",
                     host_min_us=round(best, 2), backend=backend, graph_replay_us=graph_us))
