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
    monkeypatch.setattr(di.config, "rewrite_torch_topk", True)  # the scores below hold no NaN
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
