"""`python -m dsa_ops demo`: one DSA decode layer step on synthetic long-context data.

B requests decode s_q (next_n) query tokens each over contexts of L tokens held in paged caches (pages of
64 tokens at random places in a page pool, one block table for both caches), the way a serving engine
runs a DeepSeek-V3.2 attention layer:

    paged_indexer_logits       fp8 indexer cache, 64 heads x 128, default precision -> fp32 scores [B*s_q, L]
    topk_page_table_transform  exact top-k of each query row's visible window, mapped through the block
                               table to MLA cache slots -> int32 [B*s_q, k]
    sparse_mla_decode          FP8 "v32" MLA cache (656 bytes a token), H heads x 576 (512 values)
                               -> out bf16 [B, s_q, H, 512], lse fp32 [B, H, s_q]

Every step is a torch.ops.dsa call on the best available device (the GPU when there is one, else the CPU
reference); each step's line says which provider served it and how long its second call took. Then the
first and last requests are checked against the exact references: indexer scores within the default
mode's 1e-3 of the row max, the top-k slot sets equal, the attention output within sparse_mla_decode's
GPU-test tolerances. Exit status 1 when a check fails, or when a GPU step ran on the reference although a
GPU kernel for it is registered.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, NamedTuple, Optional

import torch

from . import registry

PAGE = 64
INDEX_HEADS, INDEX_DIM = 64, 128
MLA_DIM, V_DIM, MLA_BYTES = 576, 512, 656  # v32 layout: 512 e4m3 values, 4 fp32 scales, 64 bf16 rope values
SCORE_TOL = 1e-3  # paged_indexer_logits, precise=False: of the row's largest |score|


class DecodeLayer(NamedTuple):
    """The inputs of one decode layer step, in the forms the ops take."""

    q_index: torch.Tensor  # fp8 [B, s_q, 64, 128]
    index_cache: torch.Tensor  # uint8 [pages, 64, 1, 132]: per page 64 x 128 fp8 values, then 64 fp32 scales
    weights: torch.Tensor  # fp32 [B * s_q, 64]
    context_lens: torch.Tensor  # int32 [B]
    block_table: torch.Tensor  # int32 [B, max_blocks], pages of both caches
    row_lengths: torch.Tensor  # int32 [B * s_q]: the visible window of each query row (decode_rows)
    row_to_batch: torch.Tensor  # int32 [B * s_q]
    q: torch.Tensor  # bf16 [B, s_q, H, 576]
    mla_cache: torch.Tensor  # uint8 [pages, 64, 1, 656]
    max_context_len: int
    k: int
    softmax_scale: float


def decode_rows(context_lens: torch.Tensor, next_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(window length, request) of each query row b * next_n + i: it sees positions
    < context_lens[b] - next_n + i + 1 (paged_indexer_logits' visibility), at least 0. int32 [B * next_n] each."""
    b = context_lens.shape[0]
    i = torch.arange(next_n, device=context_lens.device)
    lengths = (context_lens.long()[:, None] - next_n + 1 + i[None, :]).clamp(min=0)
    rows = torch.arange(b, device=context_lens.device, dtype=torch.int32).repeat_interleave(next_n)
    return lengths.reshape(-1).to(torch.int32), rows


def mla_tokens(n: int, g: torch.Generator, device) -> torch.Tensor:
    """uint8 [n, 656] v32 tokens: N(0, 1) values quantised to e4m3 with one amax scale per 128, then the
    scales, then 64 N(0, 1) rope values in bf16."""
    x = torch.randn((n, MLA_DIM), generator=g, device=device)
    grp = x[:, :512].reshape(n, 4, 128)
    scales = grp.abs().amax(-1).clamp_min(1e-4) / 448.0
    codes = (grp / scales[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, 512)
    rope = x[:, 512:].to(torch.bfloat16).view(torch.uint8)
    return torch.cat([codes, scales.view(torch.uint8), rope], dim=1)


def make_layer(batch: int, next_n: int, context: int, heads: int = 128, k: int = 2048, *, device="cpu",
               seed: int = 0, spare_pages: Optional[int] = None) -> DecodeLayer:
    """Random inputs of one decode step: every request `context` tokens on pages drawn at random from a pool
    with `spare_pages` more pages than the requests use (default: batch). The spare pages of the MLA cache
    are 0xFF bytes (e4m3 NaN, NaN scales): a read of a page outside the block table shows as NaN."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    blocks = -(-context // PAGE)
    spare = batch if spare_pages is None else spare_pages
    pages = batch * blocks + spare
    table = torch.randperm(pages, generator=g, device=device)[: batch * blocks].to(torch.int32).view(batch, blocks)
    rows = batch * next_n

    q_index = (torch.randn((batch, next_n, INDEX_HEADS, INDEX_DIM), generator=g, device=device) * 0.5).to(
        torch.float8_e4m3fn)
    vals = torch.randn((pages, PAGE * INDEX_DIM), generator=g, device=device).to(torch.float8_e4m3fn)
    scales = torch.rand((pages, PAGE), generator=g, device=device) + 0.5
    index_cache = torch.cat([vals.view(torch.uint8), scales.view(torch.uint8)], 1).view(pages, PAGE, 1,
                                                                                     INDEX_DIM + 4)
    weights = torch.randn((rows, INDEX_HEADS), generator=g, device=device) / INDEX_HEADS**0.5

    mla = torch.full((pages * PAGE, MLA_BYTES), 0xFF, dtype=torch.uint8, device=device)
    used = (table.long()[:, :, None] * PAGE + torch.arange(PAGE, device=device)).reshape(-1)
    step = 1 << 20
    for t0 in range(0, used.numel(), step):
        part = used[t0:t0 + step]
        mla[part] = mla_tokens(part.numel(), g, device)
    mla_cache = mla.view(pages, PAGE, 1, MLA_BYTES)
    q = torch.randn((batch, next_n, heads, MLA_DIM), generator=g, device=device).to(torch.bfloat16)

    context_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    row_lengths, row_to_batch = decode_rows(context_lens, next_n)
    return DecodeLayer(q_index, index_cache, weights, context_lens, table, row_lengths, row_to_batch, q, mla_cache,
                       context, k, MLA_DIM**-0.5)


def _dsa_call(name: str, args: tuple, kwargs: dict):
    return getattr(torch.ops.dsa, name)(*args, **kwargs)


def layer_step(x: DecodeLayer, call: Callable = _dsa_call):
    """One decode layer step, each op through `call(op name, args, kwargs)` (default: torch.ops.dsa.<op>).

    Returns (scores fp32 [B*s_q, L], slots int32 [B*s_q, k], out bf16 [B, s_q, H, 512], lse fp32 [B, H, s_q])."""
    b, s_q = x.q.shape[:2]
    logits = call("paged_indexer_logits",
                  (x.q_index, x.index_cache, x.weights, x.context_lens, x.block_table),
                  dict(max_context_len=x.max_context_len))
    slots = call("topk_page_table_transform", (logits, x.block_table, x.row_lengths, x.k),
                 dict(row_to_batch=x.row_to_batch, page_size=PAGE))
    out, lse = call("sparse_mla_decode", (x.q, x.mla_cache, slots.view(b, s_q, x.k)),
                    dict(softmax_scale=x.softmax_scale))
    return logits, slots, out, lse


def _timed(device, fn):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, (time.perf_counter() - t0) * 1e3


def _kernel_args(name, args, kwargs):
    from ._define import OPS, _normalize

    d = OPS[name]
    a = _normalize(name, d.arg_names, d.defaults, args, kwargs)
    if d.out is not None:
        a = a + d.out.alloc(*a)
    return a


def provider_of(name: str, args: tuple, kwargs: dict) -> str:
    """The backend that serves torch.ops.dsa.<name>(*args, **kwargs): "reference (CPU)" for CPU tensors, else the
    GPU provider the registry picks (registry.DispatchError when none serves)."""
    if args[0].device.type == "cpu":
        return "reference (CPU)"
    return registry.select(name, _kernel_args(name, args, kwargs)).backend


def _run_step(name, device, args, kwargs):
    """Run torch.ops.dsa.<name>: (output, ms of the second call, who served it, whether that is a fault).

    On a GPU where no provider serves the call, the reference runs instead and the line says why; that is a
    fault when a GPU kernel of the op is registered and available here (it declined this call)."""
    fn = getattr(torch.ops.dsa, name)
    if device.type != "cuda":
        out, ms = _timed(device, lambda: fn(*args, **kwargs))
        return out, ms, "reference (CPU)", False
    try:
        provider = provider_of(name, args, kwargs)
    except registry.DispatchError as e:
        kernels = [b for b, p in registry.providers(name).items()
                   if b != "reference" and registry.availability(p, device) is None]
        reasons = "; ".join(line.strip() for line in str(e).splitlines()[1:] if line.startswith("  "))
        with registry.use_backend("reference"):
            out, ms = _timed(device, lambda: fn(*args, **kwargs))
        if kernels:
            return out, ms, f"reference: the {'/'.join(kernels)} kernel declined this call ({reasons})", True
        return out, ms, f"reference (no GPU kernel for this op here: {reasons})", False
    _, first = _timed(device, lambda: fn(*args, **kwargs))  # includes any one-time build or compile
    out, ms = _timed(device, lambda: fn(*args, **kwargs))
    return out, ms, f"{provider} (first call {first:.0f} ms)", False


def attention_oracle(q, cache, slots, scale):
    """float64 (out [s_q, H, 512], lse [H, s_q], largest |V| per column [s_q, 512]) of one request on its
    dequantised rows; slots < 0 or past the cache are skipped, a row with none gives out 0 and lse +inf."""
    from .ops.dequant_k_cache_paged import dequant_slots

    s_q, h, d = q.shape
    ok = (slots >= 0) & (slots < cache.shape[0] * cache.shape[1])  # [s_q, k]
    kv = dequant_slots(cache, torch.where(ok, slots, -1).reshape(-1).int(), "v32").double().view(s_q, -1, d)
    s = (torch.einsum("qhd,qnd->qhn", q.double(), kv) * scale).masked_fill(~ok[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    has = torch.isfinite(lse)
    p = torch.where(has[..., None], torch.exp(s - torch.where(has, lse, 0)[..., None]), 0)
    out = torch.einsum("qhn,qnd->qhd", p, kv[..., :V_DIM])
    lse = torch.where(has, lse, float("inf"))
    return out, lse.transpose(0, 1), kv[..., :V_DIM].abs().amax(dim=1)


def attention_error(out, lse, ref_out, ref_lse, vmax) -> Optional[str]:
    """None when one request's out (bf16 [s_q, H, 512]) and lse ([H, s_q]) meet sparse_mla_decode's GPU-test
    tolerances against the float64 oracle, else what failed: per element 1e-3 absolute, 2/128 relative or
    the bound of bf16 probabilities (2^-9 of the column's largest |V| plus 2^-9 of the element); 1 - cosine
    below 1e-5 per (token, head) row; lse within 1e-5 relative (of max(|lse|, 1)); nothing NaN."""
    o = out.double()
    if torch.isnan(o).any() or torch.isnan(lse).any():
        return f"NaN in out ({int(torch.isnan(o).sum())}) or lse ({int(torch.isnan(lse).sum())})"
    err = (o - ref_out).abs()
    bound = torch.maximum((ref_out.abs() * (2 / 128)).clamp(min=1e-3), 2.0**-9 * (vmax[:, None, :] + ref_out.abs()))
    if (err > bound).any():
        return f"out: {int((err > bound).sum())} elements off, max abs err {err.max().item():.3g}"
    none = torch.isinf(ref_lse)  # [H, s_q]: rows without a token
    if not torch.equal(torch.isinf(lse) & (lse > 0), none):
        return f"lse +inf at {int((torch.isinf(lse) & (lse > 0)).sum())} rows, the oracle at {int(none.sum())}"
    lerr = ((lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1))[~none]
    if lerr.numel() and not lerr.max() <= 1e-5:
        return f"lse: max relative err {lerr.max().item():.3g}"
    a, r = o.transpose(0, 1)[~none], ref_out.transpose(0, 1)[~none]  # [rows with a token, 512]
    if (o.transpose(0, 1)[none] != 0).any():
        return "a row without a token is not 0"
    nz = r.norm(dim=-1) > 0
    cos = torch.nn.functional.cosine_similarity(a[nz], r[nz], dim=-1)
    if cos.numel() and (1 - cos).max() > 1e-5:
        return f"1 - cosine {(1 - cos).max().item():.3g}"
    return None


def check(x: DecodeLayer, logits, slots, out, lse, requests) -> tuple[list[str], list[str]]:
    """Each step of `requests` against the exact references: (report lines, failures). Scores and top-k
    are checked on every query row of those requests, the attention on the slots the top-k chose."""
    from . import reference

    s_q = x.q.shape[1]
    lines, failed = [], []
    worst_score, topk_ok, attn_err = 0.0, True, None
    for r in requests:
        rows = slice(r * s_q, (r + 1) * s_q)
        ref = reference.paged_indexer_logits(x.q_index[r:r + 1], x.index_cache, x.weights[rows],
                                             x.context_lens[r:r + 1], x.block_table[r:r + 1],
                                             max_context_len=x.max_context_len)
        got = logits[rows]
        vis = torch.isfinite(ref)
        if not torch.equal(vis, torch.isfinite(got)) or torch.isnan(got).any():
            worst_score = float("inf")
        else:
            rmax = torch.where(vis, ref.abs(), 0).amax(dim=1).clamp_min(1e-30)
            err = (torch.where(vis, (got - ref).abs(), 0).amax(dim=1) / rmax).max().item()
            worst_score = max(worst_score, err)
        want = reference.topk_page_table_transform(got, x.block_table, x.row_lengths[rows], x.k,
                                                   row_to_batch=x.row_to_batch[rows], page_size=PAGE)
        topk_ok &= torch.equal(slots[rows].sort(dim=1).values, want.sort(dim=1).values)
        if attn_err is None:
            ro, rl, vmax = attention_oracle(x.q[r], x.mla_cache, slots[rows], x.softmax_scale)
            why = attention_error(out[r], lse[r], ro, rl, vmax)
            attn_err = None if why is None else f"request {r}: {why}"
    n_rows = len(requests) * s_q
    ok = worst_score <= SCORE_TOL
    lines.append(f"indexer scores of {n_rows} rows within {SCORE_TOL:g} of the row max: {ok} "
                 f"(worst {worst_score:.3g} of the row max)")
    lines.append(f"top-k slots of {n_rows} rows equals the reference: {topk_ok}")
    lines.append("attention out and lse of those rows within the sparse_mla_decode tolerances: "
                 + ("True" if attn_err is None else f"False ({attn_err})"))
    failed += [] if ok else ["indexer scores"]
    failed += [] if topk_ok else ["top-k"]
    failed += [] if attn_err is None else ["attention"]
    return lines, failed


def main(argv=()) -> int:
    import dsa_ops  # noqa: F401  (defines the ops and registers the providers)

    ap = argparse.ArgumentParser(prog="python -m dsa_ops demo", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--batch", type=int, default=None, help="requests B (default: 64 on a GPU, 2 on the CPU)")
    ap.add_argument("--context", type=int, default=None,
                    help="tokens L of each request's context (default: 65536 on a GPU, 4096 on the CPU)")
    ap.add_argument("--next-n", type=int, default=1, help="query tokens s_q of each request (default 1)")
    ap.add_argument("--heads", type=int, default=128, choices=(64, 128), help="MLA heads (default 128)")
    ap.add_argument("--k", type=int, default=2048, help="tokens selected per query row (default 2048)")
    ap.add_argument("--rows", type=int, default=None, help="query rows B * s_q (instead of --batch)")
    ap.add_argument("--keys", type=int, default=None, help="the same as --context")
    args = ap.parse_args(list(argv))
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    s_q = args.next_n
    if s_q < 1:
        ap.error(f"--next-n must be at least 1, got {s_q}")
    if args.rows is not None and args.batch is not None:
        ap.error("give --batch or --rows, not both")
    if args.rows is not None and (args.rows < 1 or args.rows % s_q):
        ap.error(f"--rows must be a positive multiple of --next-n {s_q}, got {args.rows}")
    if args.keys is not None and args.context is not None:
        ap.error("give --context or --keys, not both")
    batch = args.rows // s_q if args.rows is not None else args.batch if args.batch is not None else (64 if gpu else 2)
    context = next((v for v in (args.keys, args.context) if v is not None), 65536 if gpu else 4096)
    if batch < 1 or context < 1 or args.k < 1:
        ap.error(f"--batch, --context and --k must be positive, got {batch}, {context}, {args.k}")

    where = torch.cuda.get_device_name(device) if gpu else "CPU (exact reference)"
    print(f"dsa_ops demo on {where}: one DSA decode layer step, {batch} requests x {s_q} query token(s), "
          f"contexts of {context} tokens on random pages of {PAGE}; indexer {INDEX_HEADS} heads x {INDEX_DIM} fp8; "
          f"top-{args.k}; sparse MLA {args.heads} heads x {MLA_DIM}/{V_DIM} over an FP8 v32 cache")
    t0 = time.perf_counter()
    x = make_layer(batch, s_q, context, args.heads, args.k, device=device)
    print(f"inputs built in {time.perf_counter() - t0:.1f} s "
          f"(indexer cache {x.index_cache.numel() / 2**20:.0f} MiB, MLA cache {x.mla_cache.numel() / 2**20:.0f} MiB)")

    steps, faults = [], []
    shapes = {"paged_indexer_logits": "fp32 scores", "topk_page_table_transform": "int32 MLA cache slots",
              "sparse_mla_decode": "bf16 out, fp32 lse"}

    def call(name, a, kw):
        result, ms, who, fault = _run_step(name, device, a, kw)
        shape = [list(t.shape) for t in result] if isinstance(result, tuple) else list(result.shape)
        steps.append((name, ms, who, f"{shapes[name]} {shape}"))
        if fault:
            faults.append(name)
        return result

    logits, slots, out, lse = layer_step(x, call)
    for name, ms, who, what in steps:
        print(f"  {name:26} {ms:9.3f} ms  {what:48} via {who}")
    print(f"  {'layer step':26} {sum(s[1] for s in steps):9.3f} ms  (sum of the steps, each timed alone)")

    requests = sorted({0, batch - 1})
    lines, failed = check(x, logits, slots, out, lse, requests)
    print(f"checked against the exact references on requests {requests}:")
    for line in lines:
        print("  " + line)
    if faults:
        print(f"on the GPU but served by the reference although a GPU kernel exists: {', '.join(faults)}")
    if failed or faults:
        print("FAILED: " + ", ".join(failed + [f"{f} on the reference" for f in faults]))
        return 1
    return 0
