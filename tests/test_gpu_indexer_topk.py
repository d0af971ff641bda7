"""GPU tests of dsa.indexer_topk's Triton provider (pytest -m gpu): the dense route against
topk(indexer_logits) by the real kernels in the same precision mode.

Through torch.ops.dsa.indexer_topk: the same set per row as dsa.topk / dsa.topk_page_table_transform of
dsa.indexer_logits (top-k order is unspecified, so rows are compared as sets), with return_scores the
returned scores bitwise the logits of the returned keys (-inf beside -1). Data: random, clustered (runs of
high keys), periodic, all-equal, mostly-zero; both modes; with and without the page table; windows full,
causal, short, empty and clipped; bf16; 1M keys; 4096 rows (dsa.indexer_logits served by Triton there);
one CUDA-graph capture.
"""

from __future__ import annotations

import pytest
import torch
from dsa_ops.ops._common import INT32_MAX

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (run `pytest -m gpu` on the H200)"),
]

DEV = "cuda"
FP8 = torch.float8_e4m3fn
K = 2048
H, D = 64, 128
KINDS = ["random", "clustered", "periodic_33", "periodic_64", "all_equal", "mostly_zero"]


def inputs(kind, t, n, windows="full", dtype=FP8, seed=0, h=H):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = (torch.randn(t, h, D, device=DEV, generator=g) * 2).to(dtype)
    kv = (torch.randn(n, D, device=DEV, generator=g) * 2).to(dtype)
    s = torch.rand(n, device=DEV, generator=g) + 0.25
    w = torch.randn(t, h, device=DEV, generator=g)
    boost = torch.ones(n, device=DEV)
    if kind == "clustered":
        starts = torch.randint(0, n - 256, (32,), device=DEV, generator=g)
        for st in starts.tolist():
            boost[st:st + 200] = 8.0
        w = w.abs()
    elif kind == "periodic_33":
        boost[::33] = 8.0
        w = w.abs()
    elif kind == "periodic_64":
        boost[7::64] = 8.0
        w = w.abs()
    elif kind == "all_equal":
        kv = kv[:1].expand(n, D).contiguous()
        s = torch.full((n,), 0.5, device=DEV)
        w = w.abs()
    elif kind == "mostly_zero":
        boost = torch.zeros(n, device=DEV)
        boost[torch.randperm(n, device=DEV, generator=g)[: K // 2]] = 1.0
    if dtype == FP8:
        s = s * boost
    else:
        kv = (kv.float() * boost[:, None]).to(dtype)
        s = None
    ks = torch.zeros(t, dtype=torch.int32, device=DEV)
    if windows == "full":
        ke = torch.full((t,), n, dtype=torch.int32, device=DEV)
    else:  # causal, with a few short and empty rows at the top
        ke = (n - t + torch.arange(t, device=DEV) + 1).to(torch.int32)
        ke[:4] = torch.tensor([0, 5, K - 1, K + 3], dtype=torch.int32, device=DEV)
        ks[4] = -17
    pages = -(-n // 64)
    pt = torch.randperm(t * pages * 2, device=DEV, generator=g)[: t * pages].view(t, pages).int()
    return q, kv, s, w, ks, ke, pt


def as_sets(x):
    return torch.sort(torch.where(x < 0, torch.full_like(x, INT32_MAX), x), dim=1).values


def dense(q, kv, s, w, ks, ke, pt, precise):
    """topk(indexer_logits(...)) by the ops (real kernels): the relative indices, the mapped ones (by
    dsa.topk_page_table_transform), the logits."""
    logits = torch.ops.dsa.indexer_logits(q, kv, s, w, ks, ke, precise=precise)
    lengths = (ke.long() - ks.long()).clamp(0, INT32_MAX).int()
    rel = torch.ops.dsa.topk(logits, K, lengths=lengths, row_starts=ks)
    mapped = torch.ops.dsa.topk_page_table_transform(logits, pt, lengths, K, row_starts=ks)
    return rel, mapped, logits


def check_op(q, kv, s, w, ks, ke, pt, precise):
    """dsa.indexer_topk (dense route) against the two ops, unmapped with scores and mapped."""
    rel, mapped, logits = dense(q, kv, s, w, ks, ke, pt, precise)
    idx, sc = torch.ops.dsa.indexer_topk(q, kv, s, w, ks, ke, K, precise=precise, return_scores=True)
    bad = (as_sets(idx) != as_sets(rel)).any(1)
    assert not bad.any(), f"rows {bad.nonzero().flatten()[:8].tolist()} differ from topk(indexer_logits)"
    col = (idx.long() + ks.long()[:, None]).clamp(0, kv.shape[0] - 1)
    want_sc = torch.where(idx >= 0, logits.gather(1, col), torch.full_like(sc, float("-inf")))
    assert torch.equal(sc.view(torch.int32), want_sc.view(torch.int32)), "scores not bitwise the logits"
    out, none = torch.ops.dsa.indexer_topk(q, kv, s, w, ks, ke, K, precise=precise, page_table=pt)
    assert none is None or none.numel() == 0
    bad = (as_sets(out) != as_sets(mapped)).any(1)
    assert not bad.any(), f"rows {bad.nonzero().flatten()[:8].tolist()} differ from the mapped top-k"


@pytest.mark.parametrize("precise", [False, True], ids=["default", "precise"])
@pytest.mark.parametrize("kind", KINDS)
def test_op_equals_the_two_ops(kind, precise):
    check_op(*inputs(kind, 256, 32768, windows="causal" if kind in ("random", "clustered") else "full"), precise)


def test_bf16():
    check_op(*inputs("random", 128, 32768, dtype=torch.bfloat16), False)


def test_short_rows_and_windows():
    """N < k for some windows: -1 padding, scores -inf there."""
    check_op(*inputs("random", 96, 12000, windows="causal"), False)


def test_one_million_keys():
    check_op(*inputs("random", 32, 1 << 20, windows="causal"), False)


@pytest.mark.parametrize("heads", [64, 32])
def test_4096_rows(heads):
    """The benchmark's row count, where dsa.indexer_logits is served by the Triton kernel."""
    check_op(*inputs("random", 4096, 32768, windows="causal", h=heads), False)


def test_captures_in_a_cuda_graph():
    q, kv, s, w, ks, ke, pt = inputs("random", 128, 32768)
    fn = lambda: torch.ops.dsa.indexer_topk(q, kv, s, w, ks, ke, K, page_table=pt)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = fn()
    s.mul_(1.5)  # new inputs, same buffers: the replay must follow them
    w[::3] = w[::3].abs()
    graph.replay()
    torch.cuda.synchronize()
    _, mapped, _ = dense(q, kv, s, w, ks, ke, pt, False)
    assert torch.equal(as_sets(out), as_sets(mapped))
