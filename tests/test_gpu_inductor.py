"""The Inductor pass on the GPU: one compiled model per rewrite, run by the device providers, against
eager (the unfused ops). Order inside a row is unspecified, so rows are compared as sets.
Run on the H200: `pytest -m gpu tests/test_gpu_inductor.py`.
"""

from __future__ import annotations

import dsa_ops
import dsa_ops.inductor as di
import pytest
import torch
from dsa_ops.ops._common import INT32_MAX

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = "cuda"
P, K = 64, 2048
ROWS, WIDTH = 48, 12000


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    # torch's config modules change only through their own patch() (monkeypatch's undo deletes the key).
    monkeypatch.setattr(di.config, "enabled", True)
    monkeypatch.setattr(di.config, "rewrite_torch_topk", True)  # the default: the nan_first=True form
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        torch._dynamo.reset()
        di.counters.clear()
        yield
        torch._dynamo.reset()


def as_sets(x: torch.Tensor) -> torch.Tensor:
    s, _ = torch.sort(torch.where(x == -1, torch.full_like(x, INT32_MAX, dtype=torch.int64), x.long()), dim=1)
    return s


def page_map(idx, pt):
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt.gather(1, (i // P).long()) * P + i % P)


def indexer_paged(q, kv, s, w, ks, ke, pt):
    logits = dsa_ops.indexer_logits(q, kv, s, w, ks, ke)
    return page_map(dsa_ops.topk(logits, K, row_starts=ks, lengths=ke - ks), pt)


def torch_topk_paged(scores, pt):
    idx = torch.topk(scores, K, sorted=False).indices
    return pt.gather(1, idx // P) * P + idx % P


def dsa_topk_paged(scores, lengths, pt):
    return page_map(dsa_ops.topk(scores, K, lengths=lengths), pt)


def inputs():
    g = torch.Generator(device=DEV).manual_seed(0)
    pages = (WIDTH + P - 1) // P
    pt = torch.randperm(ROWS * pages * 2, device=DEV, generator=g)[: ROWS * pages].view(ROWS, pages).int()
    ks = torch.randint(0, 2000, (ROWS,), device=DEV, generator=g, dtype=torch.int32)
    ke = (ks + torch.randint(1000, WIDTH - 2000, (ROWS,), device=DEV, generator=g, dtype=torch.int32))
    ke[0] = ks[0] + 100  # a window shorter than k
    q = torch.randn(ROWS, 64, 128, device=DEV, generator=g).to(torch.float8_e4m3fn)
    kv = torch.randn(WIDTH, 128, device=DEV, generator=g).to(torch.float8_e4m3fn)
    s = torch.rand(WIDTH, device=DEV, generator=g) + 0.5
    w = torch.randn(ROWS, 64, device=DEV, generator=g)
    scores = torch.randn(ROWS, WIDTH, device=DEV, generator=g)
    lengths = torch.randint(0, WIDTH, (ROWS,), device=DEV, generator=g, dtype=torch.int32)
    return dict(indexer=(q, kv, s, w, ks, ke, pt), torch_topk=(scores, pt), dsa_topk=(scores, lengths, pt))


@pytest.mark.parametrize("name,model,fused", [
    ("indexer", indexer_paged, "indexer_topk"),
    ("torch_topk", torch_topk_paged, "topk_page_table_transform"),
    ("dsa_topk", dsa_topk_paged, "topk_page_table_transform"),
])
def test_compiled_rewrite_matches_eager_on_gpu(name, model, fused):
    args = inputs()[name]
    # The rewritten graph runs the device providers (the indexer case: dsa.indexer_topk's Triton provider).
    got = torch.compile(model, fullgraph=True, dynamic=True)(*args)
    want = model(*args)
    assert di.counters[fused] == 1, dict(di.counters)
    assert got.dtype == want.dtype and got.shape == want.shape and got.is_cuda
    bad = (as_sets(got) != as_sets(want)).any(dim=1)
    assert not bad.any(), f"{name}: rows {bad.nonzero().flatten()[:8].tolist()} differ (as sets)"


# ---------------------------------------------------------------------------------------------
# torch.topk into the nan_first=True form, on rows with NaN; the indexer's whole rows; other mapping forms


def torch_topk_request_rows(scores, pt, rtb):  # page_table[row_to_batch] rows, then gather
    idx = torch.topk(scores, K, sorted=False).indices
    return pt[rtb.long()].gather(1, idx // P) * P + idx % P


def indexer_torch_topk_paged(q, kv, s, w, pt, rtb):  # whole rows, torch.topk, row-to-request gather
    t, n = q.shape[0], kv.shape[0]
    ks = torch.zeros(t, dtype=torch.int32, device=q.device)
    ke = torch.full((t,), n, dtype=torch.int32, device=q.device)
    idx = torch.topk(dsa_ops.indexer_logits(q, kv, s, w, ks, ke), K, sorted=False).indices.int()
    rows = torch.arange(t, device=q.device)[:, None]
    return torch.where(idx < 0, -1, pt[rtb][rows, (idx // P).long()] * P + idx % P)


def nan_inputs():
    """Rows with no NaN, 100, exactly K and 3000 NaNs (then none again); an identity table (slot ==
    index) so that picks can be compared by value where NaNs tie; fp8 keys 7, 500 and 9000 NaN."""
    g = torch.Generator(device=DEV).manual_seed(1)
    scores = torch.randn(ROWS, WIDTH, device=DEV, generator=g)
    for r, n in ((1, 100), (2, K), (3, 3000)):
        scores[r, torch.randperm(WIDTH, device=DEV, generator=g)[:n]] = float("nan")
    pages = (WIDTH + P - 1) // P
    ident = torch.arange(pages, device=DEV, dtype=torch.int32).repeat(ROWS, 1)
    rtb = torch.randperm(ROWS, device=DEV, generator=g).int()
    d = inputs()
    q, kv, s, w = d["indexer"][:4]
    kv = kv.float()
    kv[[7, 500, 9000]] = float("nan")
    kv = kv.to(torch.float8_e4m3fn)
    return scores, ident, rtb, (q, kv, s, w.abs(), d["indexer"][6], rtb)


def test_torch_topk_nan_rows_on_gpu():
    scores, ident, rtb, _ = nan_inputs()
    got = torch.compile(torch_topk_request_rows, fullgraph=True, dynamic=True)(scores, ident, rtb)
    want = torch_topk_request_rows(scores, ident, rtb)
    assert di.counters["topk_page_table_transform"] == 1, dict(di.counters)
    assert got.dtype == want.dtype and got.shape == want.shape
    gv, wv = scores.gather(1, got).sort(1).values, scores.gather(1, want).sort(1).values  # slots == indices
    assert torch.equal(gv.isnan(), wv.isnan()) and torch.equal(gv.nan_to_num(), wv.nan_to_num())
    assert all(len(set(row)) == K for row in got.tolist())


def test_indexer_torch_topk_whole_rows_on_gpu():
    *_, args = nan_inputs()
    got = torch.compile(indexer_torch_topk_paged, fullgraph=True, dynamic=True)(*args)
    want = indexer_torch_topk_paged(*args)
    assert di.counters["indexer_topk"] == 1, dict(di.counters)
    assert got.dtype == want.dtype and got.shape == want.shape and got.is_cuda
    bad = (as_sets(got) != as_sets(want)).any(dim=1)
    assert not bad.any(), f"rows {bad.nonzero().flatten()[:8].tolist()} differ (as sets)"
