"""GPU tests of dsa.indexer_topk's Triton provider (pytest -m gpu): the fused path and the dense route
against topk(indexer_logits(...)) run by the real kernels in the same precision mode.

exact=True: the same set per row as the dense ops (the fused scores are bitwise indexer_logits', so no
tolerance), and with return_scores the returned scores bitwise the logits of the returned keys. Data:
random, clustered (runs of high keys), periodic (high keys at the sample stride: resonance; and at 64),
all-equal, mostly-zero; with and without the page table; windows full, causal and short; slabs forced
to overflow and gates forced to pass fewer than k keys (the rescan finishes those rows); 1M keys.
exact=False: each row a subset of the true top-k when the gate is forced too high, and the recall
printed for the plain data. The dense route is bitwise the two ops. One CUDA-graph capture.
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
KINDS = ["random", "clustered", "periodic_stride", "periodic_64", "all_equal", "mostly_zero"]


def sample_stride(n: int) -> int:
    """The fused path's sample stride over a hull of n keys (odd)."""
    from dsa_ops.backends.triton import indexer_topk as it

    s = max(1, -(-n // it.SAMPLE))
    return s + 1 - s % 2


def inputs(kind, t, n, windows="full", dtype=FP8, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = (torch.randn(t, H, D, device=DEV, generator=g) * 2).to(dtype)
    kv = (torch.randn(n, D, device=DEV, generator=g) * 2).to(dtype)
    s = torch.rand(n, device=DEV, generator=g) + 0.25
    w = torch.randn(t, H, device=DEV, generator=g)
    boost = torch.ones(n, device=DEV)
    if kind == "clustered":
        starts = torch.randint(0, n - 256, (32,), device=DEV, generator=g)
        for st in starts.tolist():
            boost[st:st + 200] = 8.0
        w = w.abs()
    elif kind == "periodic_stride":
        boost[::sample_stride(n)] = 8.0
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
    """topk(indexer_logits(...)) by the ops (real kernels), the relative indices, the mapped ones, logits."""
    logits = torch.ops.dsa.indexer_logits(q, kv, s, w, ks, ke, precise=precise)
    lengths = (ke.long() - ks.long()).clamp(0, INT32_MAX).int()
    rel = torch.ops.dsa.topk(logits, K, lengths=lengths, row_starts=ks)
    mapped = torch.ops.dsa.page_table_transform(rel, pt) if pt is not None else None
    return rel, mapped, logits


def check_fused(q, kv, s, w, ks, ke, pt, precise, paged, exact=True):
    from dsa_ops.backends.triton import indexer_topk as it

    t = q.shape[0]
    counts = torch.empty(t, dtype=torch.int32, device=DEV)
    out, sc = it.launch_fused(q, kv, s, w, ks, ke, K, exact, precise, pt if paged else None, 64, None, None,
                              True, counts=counts)
    rel, mapped, logits = dense(q, kv, s, w, ks, ke, pt, precise)
    want = mapped if paged else rel
    bad = (as_sets(out) != as_sets(want)).any(1)
    assert not bad.any(), (f"rows {bad.nonzero().flatten()[:8].tolist()} differ from topk(indexer_logits); "
                           f"their counts {counts[bad][:8].tolist()}")
    if not paged:
        col = (out.long() + ks.long()[:, None]).clamp(0, kv.shape[0] - 1)
        wsc = torch.where(out >= 0, logits.gather(1, col), torch.full_like(sc, float("-inf")))
        assert torch.equal(sc.view(torch.int32), wsc.view(torch.int32)), "scores not bitwise the logits"
    return counts


@pytest.mark.parametrize("precise", [False, True], ids=["default", "precise"])
@pytest.mark.parametrize("kind", KINDS)
def test_fused_equals_dense_ops(kind, precise):
    args = inputs(kind, 256, 32768, windows="causal" if kind in ("random", "clustered") else "full")
    check_fused(*args, precise, paged=False)
    check_fused(*args, precise, paged=True)


def test_fused_bf16():
    check_fused(*inputs("random", 128, 32768, dtype=torch.bfloat16), False, paged=True)


@pytest.mark.parametrize("kind", ["random", "all_equal"])
def test_slab_overflow_rescanned(kind, monkeypatch):
    from dsa_ops.backends.triton import indexer_topk as it

    monkeypatch.setattr(it, "CAPACITY_OVERRIDE", K)
    counts = check_fused(*inputs(kind, 64, 32768), False, paged=True)
    assert (counts > K).sum() > 32, counts.tolist()  # most rows overflowed


def test_underfilled_gate_rescanned(monkeypatch):
    from dsa_ops.backends.triton import indexer_topk as it

    monkeypatch.setattr(it, "PASS_FACTOR", 0.25)
    counts = check_fused(*inputs("random", 64, 32768), True, paged=False)
    assert (counts < K).sum() > 32, counts.tolist()


def test_inexact_underfilled_is_a_subset(monkeypatch):
    from dsa_ops.backends.triton import indexer_topk as it

    q, kv, s, w, ks, ke, pt = inputs("random", 64, 32768)
    monkeypatch.setattr(it, "PASS_FACTOR", 0.25)
    out, _ = it.launch_fused(q, kv, s, w, ks, ke, K, False, False)
    rel, _, _ = dense(q, kv, s, w, ks, ke, pt, False)
    for r in range(out.shape[0]):
        got = set(out[r][out[r] >= 0].tolist())
        assert got <= set(rel[r].tolist()), r
    assert (out < 0).any()


@pytest.mark.parametrize("kind", ["random", "clustered", "mostly_zero"])
def test_inexact_recall(kind):
    """exact=False on plain data: the recall (printed) and no row short of k unless its count was."""
    from dsa_ops.backends.triton import indexer_topk as it

    q, kv, s, w, ks, ke, pt = inputs(kind, 256, 32768)
    counts = torch.empty(256, dtype=torch.int32, device=DEV)
    out, _ = it.launch_fused(q, kv, s, w, ks, ke, K, False, False, counts=counts)
    rel, _, _ = dense(q, kv, s, w, ks, ke, pt, False)
    hit = sum(len(set(out[r].tolist()) & set(rel[r].tolist())) for r in range(256))
    print(f"exact=False recall {kind}: {hit / (256 * K):.6f}, counts min {counts.min().item()} "
          f"median {counts.median().item()} max {counts.max().item()}")
    certified = (counts >= K) & (counts <= it.capacity_for(K))
    assert torch.equal(as_sets(out[certified]), as_sets(rel[certified]))


def test_one_million_keys():
    check_fused(*inputs("random", 32, 1 << 20, windows="causal"), False, paged=True)


@pytest.mark.parametrize("return_scores", [False, True])
def test_op_dispatches_and_dense_route_is_the_two_ops(return_scores):
    """Through torch.ops.dsa.indexer_topk: a short call (N < 8 k) takes the dense route, bitwise the ops."""
    from dsa_ops.backends.triton import indexer_topk as it

    q, kv, s, w, ks, ke, pt = inputs("random", 96, 12000, windows="causal")
    assert it.route(q, kv, s, w, ks, ke, K) == "dense"
    idx, sc = torch.ops.dsa.indexer_topk(q, kv, s, w, ks, ke, K, page_table=pt, return_scores=return_scores)
    logits = torch.ops.dsa.indexer_logits(q, kv, s, w, ks, ke)
    lengths = (ke.long() - ks.long()).clamp(0, INT32_MAX).int()
    want = torch.ops.dsa.topk_page_table_transform(logits, pt, lengths, K, row_starts=ks)
    assert torch.equal(as_sets(idx), as_sets(want))
    q, kv, s, w, ks, ke, pt = inputs("clustered", 96, 32768)
    assert it.route(q, kv, s, w, ks, ke, K) == "fused"
    idx, _ = torch.ops.dsa.indexer_topk(q, kv, s, w, ks, ke, K, return_scores=return_scores)
    rel, _, _ = dense(q, kv, s, w, ks, ke, pt, False)
    assert torch.equal(as_sets(idx), as_sets(rel))


def test_fused_captures_in_a_cuda_graph():
    from dsa_ops.backends.triton import indexer_topk as it

    q, kv, s, w, ks, ke, pt = inputs("random", 128, 32768)
    fn = lambda: it.launch_fused(q, kv, s, w, ks, ke, K, True, False, pt, 64, None, None, False)  # noqa: E731
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
    _, mapped, _ = dense(q, kv, s, w, ks, ke, pt, False)
    assert torch.equal(as_sets(out), as_sets(mapped))
