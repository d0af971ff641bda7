"""The DSA decode layer step on our ops against the same step on the peers, whole and step by step.

One decode step of a DeepSeek-V3.2 attention layer at batch 64 and 128, s_q (next_n) 1 and 2, 65536-token
contexts on random pages of 64 (one block table for both caches), 128 MLA heads, top-k 2048:

    ours   dsa.paged_indexer_logits (fp8, 64 heads x 128, default precision) -> dsa.topk_page_table_transform
           (top-k of each row's visible window, mapped to MLA cache slots) -> dsa.sparse_mla_decode (FP8 v32
           cache), called as `python -m dsa_ops demo` calls them (dsa_ops.demo.layer_step), whichever
           provider the registry picks for each.
    peers  DeepGEMM get_paged_mqa_logits_metadata + fp8_fp4_paged_mqa_logits (per-token context lengths
           [B, s_q]) -> vLLM's faster decode top-k of torch.ops._C.persistent_topk (what vLLM runs for k 2048
           on CUDA) and top_k_per_row_decode, both timed, the faster in the step -> the page mapping ->
           FlashMLA's sparse_decode_fwd. vLLM's own mapping kernel (a Triton kernel of its FlashMLA
           backend) is not among the prebuilt peers: the peers' step maps with dsa.page_table_transform.
           vLLM computes DeepGEMM's schedule metadata once per forward pass for all layers; it is inside
           the peers' graph here and timed alone too, so it can be taken out. FlashMLA's tile-scheduler
           metadata is made once per batch shape, outside the graph, as vLLM does.

Inputs: the indexer cache, weights, block table and fp8 q of bench_indexer_logits' paged cases (DeepGEMM's
cache layout), the MLA cache of bench_sparse_mla_decode (its pool of quantised N(0, 1) tokens, repeated
to cover the pages of batch 128), bf16 q of N(0, 1). Each side's step is one CUDA graph; every step is
also captured alone on the same inputs, so the row shows where the time goes. Timing: graph replays after
an L2 flush, median, all graphs of a case sampled in turn. Checks before timing: ours against the exact
references on request 0 (scores, top-k set, attention within the GPU tests' tolerances; a failure fails
the case); the peers' scores against the reference on request 0's visible windows, their top-k values
against dsa.topk on the same scores, FlashMLA's output against the float64 oracle (printed and recorded,
not asserted). Peers load from .peer/ at run time when present (the reason is printed when one does
not); nothing here is needed by project code. Whole file: about 1-2 min on the H200 (DeepGEMM's JIT
compile on first use included).

    timeout -s INT 240 python3 -m pytest benchmarks/bench_layer_step.py -m gpu -q -s -p no:cacheprovider \\
        --dsa-results $OUT/layer.json
"""

from __future__ import annotations

import functools
import time

import pytest
import torch
from bench_indexer_logits import _paged_inputs, deep_gemm
from bench_indexer_topk import _VLLM_DIR, vllm_ops
from bench_sparse_mla_decode import BPT, D_QK, D_V, PAGE, POOL_PAGES, TOPK, _flashmla, _pool
from harness import capture_graph, interleaved_medians, record

SCALE = D_QK["v32"] ** -0.5  # the layer's MLA cache is v32
BPT_V32 = BPT["v32"]

pytestmark = pytest.mark.gpu

HEADS, INDEX_HEADS, INDEX_DIM, CONTEXT = 128, 64, 128, 65536
CASES = [(b, s_q) for b in (64, 128) for s_q in (1, 2)]
ITERS = 20
DEV = "cuda"  # where the peers' buffers live (tests run the case's plumbing on the CPU with stand-ins)
RADIX_WORKSPACE = 1 << 20  # bytes: vLLM's RADIX_TOPK_WORKSPACE_SIZE for persistent_topk
PEER_BASELINE = "deepgemm+vllm+flashmla"


def log(*a):
    print(*a, flush=True)


def floor_bytes(batch: int, s_q: int, context: int, topk: int) -> int:
    """Bytes a layer step must move at least: the indexer cache read once, the fp32 scores written and read
    once, the selected MLA cache tokens read once (queries, slots and outputs are under 1% and left out)."""
    rows = batch * s_q
    return batch * context * (INDEX_DIM + 4) + 2 * rows * context * 4 + rows * topk * BPT_V32


def topk_value_mismatches(scores: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> int:
    """Rows where the selected scores (indices `got`, -1 for none) differ as a multiset from those of `want`:
    a check of a top-k that breaks ties its own way."""
    def values(idx):
        v = scores.gather(1, idx.long().clamp(min=0))
        v = torch.where(idx < 0, torch.full_like(v, float("-inf")), v)
        return torch.nan_to_num(v, nan=-3e38).sort(dim=1).values

    return int((values(got) != values(want)).any(dim=1).sum())


def step_lines(ours: dict, peers: dict) -> list:
    """One line a step and its time alone: ours first, then the peers' steps, marked."""
    names = list(ours) + [n for n in peers if n not in ours]
    w = max(len(n) for n in names)
    return [f"{n.ljust(w)}  {ours[n]:9.1f} us" if n in ours else f"{n.ljust(w)}  {peers[n]:9.1f} us (peers)"
            for n in names]


def _vllm_topk():
    """(torch.ops._C with vLLM's decode top-k kernels, None) from .peer/vllm, or (None, why)."""
    return vllm_ops("persistent_topk", "top_k_per_row_decode")


@functools.lru_cache(maxsize=1)
def _mla_cache(pages: int) -> torch.Tensor:
    """uint8 [pages, 64, 1, 656]: bench_sparse_mla_decode's pool, repeated as many times as `pages` needs."""
    pool = _pool()
    if pages <= POOL_PAGES:
        return pool[:pages]
    reps = -(-pages // POOL_PAGES)
    return torch.cat([pool] * reps)[:pages]


def _layer(batch: int, s_q: int):
    """A dsa_ops.demo.DecodeLayer on the benchmark inputs."""
    from dsa_ops.demo import DecodeLayer, decode_rows

    q_index, cache, w, ctx, table = _paged_inputs(batch, s_q, INDEX_HEADS, CONTEXT)
    g = torch.Generator(device="cuda").manual_seed(batch * 10 + s_q)
    q = torch.randn((batch, s_q, HEADS, 576), generator=g, device="cuda").to(torch.bfloat16)
    lengths, rows = decode_rows(ctx, s_q)
    return DecodeLayer(q_index, cache, w, ctx, table, lengths, rows, q, _mla_cache(cache.shape[0]), CONTEXT, TOPK,
                       SCALE)


def _try(label: str, fn):
    """fn() or None, printing why it failed (a peer that breaks is a printed line, not a failed case)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        log(f"  {label}: failed: {type(e).__name__}: {str(e)[:300]}")
        return None


def _cold_replay_us(timer, graph) -> float:
    return timer.median_us(graph.replay, warmup=0, iters=1)


@pytest.mark.parametrize("batch,s_q", CASES, ids=lambda v: str(v))
def test_layer_step(bench, batch, s_q):
    import dsa_ops
    from dsa_ops import demo

    t0 = time.perf_counter()
    log(f"\n  layer step batch {batch}, s_q {s_q}: building inputs")
    x = _layer(batch, s_q)
    rows = batch * s_q

    # Ours: record each op call of one eager step (its inputs are the step-alone inputs), check, capture.
    calls = []

    def rec(name, a, kw):
        calls.append((name, a, kw))
        return getattr(torch.ops.dsa, name)(*a, **kw)

    logits, slots, out, lse = demo.layer_step(x, rec)
    providers = {name: demo.provider_of(name, a, kw) for name, a, kw in calls}
    log(f"  ours: providers {providers} ({time.perf_counter() - t0:.1f} s)")
    lines, failed = demo.check(x, logits, slots, out, lse, [0])
    for line in lines:
        log("  ours: " + line)
    assert not failed, failed
    fns = {"ours": lambda: demo.layer_step(x)}
    for name, a, kw in calls:
        op = getattr(torch.ops.dsa, name)
        fns[name] = lambda f=op, a=a, kw=kw: f(*a, **kw)
    ours_steps = [name for name, _, _ in calls]

    # Peers, each optional.
    checks = {}
    ref = dsa_ops.reference.paged_indexer_logits(x.q_index[:1], x.index_cache, x.weights[:s_q], x.context_lens[:1],
                                                 x.block_table[:1], max_context_len=x.max_context_len)
    vis = torch.isfinite(ref)

    def score_err(scores):
        rmax = torch.where(vis, ref.abs(), 0).amax(dim=1).clamp_min(1e-30)
        return float(f"{(torch.where(vis, (scores[:s_q] - ref).abs(), 0).amax(dim=1) / rmax).max().item():.3g}")

    checks["ours_score_err"] = score_err(logits)
    dg, why = deep_gemm()
    peer_scores = logits
    if dg is None:
        log(f"  deepgemm: skipped: {why}")
    else:
        sms = torch.cuda.get_device_properties(x.q.device).multi_processor_count
        ctx2d = x.row_lengths.view(batch, s_q)  # each query token's own context length

        def dg_logits(meta):
            return dg.fp8_fp4_paged_mqa_logits(x.q_index, None, x.index_cache, x.weights, ctx2d, x.block_table, meta,
                                               x.max_context_len, None)

        meta0 = _try("deepgemm get_paged_mqa_logits_metadata",
                     lambda: dg.get_paged_mqa_logits_metadata(ctx2d, PAGE, sms, None))
        scores = None if meta0 is None else _try("deepgemm fp8_fp4_paged_mqa_logits", lambda: dg_logits(meta0))
        if scores is not None:
            checks["deepgemm_score_err"] = score_err(scores)
            peer_scores = scores
            fns["deepgemm_metadata"] = lambda: dg.get_paged_mqa_logits_metadata(ctx2d, PAGE, sms, None)
            fns["deepgemm_logits"] = lambda: dg_logits(dg.get_paged_mqa_logits_metadata(ctx2d, PAGE, sms, None))

    # vLLM's decode top-k on the peers' scores (ours when DeepGEMM is absent), values checked against dsa.topk.
    vops, why = _vllm_topk()
    topk_fns = {}
    idx_p = torch.full((rows, x.k), -1, dtype=torch.int32, device=DEV)
    if vops is None:
        log(f"  vllm top-k: skipped: {why}")
    else:
        ws = torch.zeros(RADIX_WORKSPACE, dtype=torch.uint8, device=DEV)
        want = torch.ops.dsa.topk(peer_scores, x.k, lengths=x.row_lengths)
        cands = {
            "vllm_persistent_topk": lambda s: vops.persistent_topk(s, x.row_lengths, idx_p, ws, x.k, x.max_context_len),
            "vllm_top_k_per_row_decode": lambda s: vops.top_k_per_row_decode(
                s, s_q, x.context_lens, idx_p, rows, s.stride(0), s.stride(1), x.k),
        }
        for name, f in cands.items():
            if _try(name, lambda f=f: f(peer_scores) or True) is None:
                continue
            bad = topk_value_mismatches(peer_scores, idx_p, want)
            checks[f"{name}_rows_off"] = bad
            log(f"  {name}: {bad} rows whose selected values differ from dsa.topk's")
            topk_fns[name] = f
            fns[name] = lambda f=f: f(peer_scores)

    slots_p = torch.empty((rows, x.k), dtype=torch.int32, device=DEV)

    def peer_map():
        return dsa_ops.page_table_transform(idx_p, x.block_table, row_to_batch=x.row_to_batch, page_size=PAGE,
                                            out=slots_p)

    if topk_fns:
        peer_map()
        fns["page_table_transform"] = peer_map
    fm = _flashmla()
    fm_args = None
    if fm is None:
        log(f"  flashmla: skipped: no loadable FlashMLA library in {_VLLM_DIR}")
    else:
        ind = (slots_p if topk_fns else slots).view(batch, s_q, x.k)
        first = _try("flashmla sparse_decode_fwd", lambda: fm.sparse_decode_fwd(
            x.q, x.mla_cache, ind, None, None, None, None, None, None, None, D_V, x.softmax_scale, None, False))
        if first is not None:
            fm_out, _, fm_meta, fm_nsp = first
            ro, _, _ = demo.attention_oracle(x.q[0], x.mla_cache, ind[0], x.softmax_scale)
            checks["flashmla_max_rel_err"] = float(
                f"{((fm_out[0].double() - ro).abs().max() / ro.abs().max()).item():.3g}")
            fm_args = (ind, fm_meta, fm_nsp)
            fns["flashmla_sparse_decode"] = lambda: fm.sparse_decode_fwd(
                x.q, x.mla_cache, ind, None, None, fm_meta, fm_nsp, None, None, None, D_V, x.softmax_scale, None, False)
    log(f"  checks: {checks}")

    # Every step alone, then the two whole steps (the peers' with their faster top-k) sampled in turn.
    log(f"  capturing {len(fns)} graphs ({time.perf_counter() - t0:.1f} s)")
    graphs = {}
    for name, fn in fns.items():
        if name == "ours" or name in ours_steps:  # ours must capture: a failure fails the case
            graphs[name] = capture_graph(fn)
            continue
        g = _try(f"capture {name}", lambda fn=fn: capture_graph(fn))
        if g is not None:
            graphs[name] = g
    steps = [n for n in graphs if n != "ours"]
    alone = dict(zip(steps, interleaved_medians([lambda g=graphs[n]: _cold_replay_us(bench.timer, g)
                                                 for n in steps], ITERS)))
    best_topk = min((n for n in topk_fns if n in alone), key=alone.get, default=None)
    if "deepgemm_logits" in alone and best_topk is not None and fm_args is not None and topk_fns:
        top = topk_fns[best_topk]
        ind, fm_meta, fm_nsp = fm_args

        def peer_step():
            scores = dg_logits(dg.get_paged_mqa_logits_metadata(ctx2d, PAGE, sms, None))
            top(scores)
            peer_map()
            return fm.sparse_decode_fwd(x.q, x.mla_cache, ind, None, None, fm_meta, fm_nsp, None, None, None, D_V,
                                        x.softmax_scale, None, False)

        g = _try("capture the peers' step", lambda: capture_graph(peer_step))
        if g is not None:
            graphs["peers"] = g
    else:
        log("  peers' whole step: not timed (a peer is missing or failed, see above)")
    pair = [n for n in ("ours", "peers") if n in graphs]
    whole = dict(zip(pair, interleaved_medians([lambda g=graphs[n]: _cold_replay_us(bench.timer, g) for n in pair],
                                               ITERS)))
    peer_us = whole.get("peers")
    ours_us = whole["ours"]

    ours_alone = {n: round(alone[n], 1) for n in ours_steps if n in alone}
    peers_alone = {n: round(alone[n], 1) for n in alone if n not in ours_alone}
    log(f"  layer step batch {batch}, s_q {s_q}: ours {ours_us:.1f} us"
        + (f", peers {peer_us:.1f} us ({peer_us / ours_us:.2f}x ours), peers' top-k {best_topk}" if peer_us else ""))
    for line in step_lines(ours_alone, peers_alone):
        log("    " + line)
    extra = {"timing": "cuda-graph replay, cold L2, graphs of a case sampled in turn", "providers": providers,
             "steps_us": ours_alone, "peer_steps_us": peers_alone, "checks": checks}
    if peer_us:
        extra.update(peer_topk=best_topk, peer_notes="DeepGEMM metadata inside the step and inside deepgemm_logits "
                     "(vLLM: once per forward pass); FlashMLA metadata outside; mapping by dsa.page_table_transform")
    bench.add(record(
        "layer_step", "dsa",
        {"batch": batch, "s_q": s_q, "heads": x.q.shape[2], "index_heads": x.q_index.shape[2],
         "tokens": x.max_context_len, "topk": x.k, "layout": "v32", "page_size": PAGE},
        ours_us, floor_us=bench.floor_us(floor_bytes(batch, s_q, x.max_context_len, x.k)),
        floor_kind="memory (indexer cache, scores written and read, selected MLA tokens, at copy rate)",
        baselines={PEER_BASELINE: peer_us} if peer_us else {}, **extra))
    log(f"  case done in {time.perf_counter() - t0:.1f} s")
