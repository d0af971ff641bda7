"""The Inductor pass (dsa_ops.inductor) on the CPU: each rewrite fires on the forms models write, the
post-grad graph holds the dsa op and no top-k, outputs equal eager; near-misses are left alone.

Every model is compiled with fullgraph=True (no graph breaks) and dynamic=True (ints may become graph
inputs). The FX graph and AOTAutograd caches are off here so that the pass runs on every compile;
tests/test_inductor_install.py covers install, chaining and the warm cache.
"""

from __future__ import annotations

import contextlib

import dsa_ops
import dsa_ops.inductor as di
import pytest
import torch
from dsa_ops.ops._common import INT32_MAX
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

P = 64  # page size, a constant in model code as models write it
K = 16
ROWS, WIDTH, PAGES = 6, 300, 10


@pytest.fixture(autouse=True)
def fresh_compile(monkeypatch):
    # torch's config modules change only through their own patch(): pytest's monkeypatch undoes a
    # setattr on them by deleting the key (it is not in the module's __dict__), which breaks every
    # later reader of the key.
    monkeypatch.setattr(di.config, "enabled", True)
    monkeypatch.setattr(di.config, "rewrite_torch_topk", False)
    assert di.installed() is not None, "import dsa_ops must install the pass"
    with inductor_config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        torch._dynamo.reset()
        di.counters.clear()
        yield
        torch._dynamo.reset()


class _Capture(CustomGraphPass):
    """Runs the installed pass, then keeps the post-grad graph as it reaches lowering."""

    def __init__(self, inner):
        self.inner, self.graphs = inner, []

    def __call__(self, graph):
        if self.inner is not None:
            self.inner(graph)
        self.graphs.append(str(graph))

    def uuid(self):
        return None


def compile_run(fn, *args):
    """(compiled output, post-grad graph text) of fn under torch.compile(fullgraph, dynamic)."""
    cap = _Capture(inductor_config.post_grad_custom_post_pass)
    with inductor_config.patch(post_grad_custom_post_pass=cap):
        out = torch.compile(fn, fullgraph=True, dynamic=True)(*args)
    assert len(cap.graphs) == 1
    return out, cap.graphs[0]


def as_sets(x: torch.Tensor) -> torch.Tensor:
    """Each row sorted with -1 last: equal for outputs holding the same multiset per row."""
    x = x[0] if isinstance(x, tuple) else x
    s, _ = torch.sort(torch.where(x == -1, torch.full_like(x, INT32_MAX, dtype=torch.int64), x.long()), dim=1)
    return s


def assert_same(got, want, exact=False):
    if isinstance(want, tuple):
        for g, w in zip(got, want, strict=True):
            assert_same(g, w, exact)
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want) if exact else torch.equal(as_sets(got), as_sets(want))


def rewrites() -> dict:
    """Our counters, totals by fused op only."""
    return {k: v for k, v in di.counters.items() if "/" not in k}


# ---------------------------------------------------------------------------------------------
# Inputs


def gen(seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, WIDTH, (ROWS, K), generator=g, dtype=torch.int32)
    idx[:, -3:] = -1  # short windows pad with -1
    page_table = torch.randperm(1000, generator=g)[: ROWS * PAGES].view(ROWS, PAGES).int()
    scores = torch.randn(ROWS, WIDTH, generator=g)
    q = torch.randn(ROWS, 2, 32, generator=g).bfloat16()
    kv = torch.randn(WIDTH, 32, generator=g).bfloat16()
    w = torch.randn(ROWS, 2, generator=g)
    ks = torch.randint(0, 100, (ROWS,), generator=g, dtype=torch.int32)
    ke = ks + torch.randint(0, 200, (ROWS,), generator=g, dtype=torch.int32)
    ke[0] = ks[0] + 5  # a window shorter than k
    rtb = torch.randperm(ROWS, generator=g).int()
    return dict(idx=idx, pt=page_table, scores=scores, q=q, kv=kv, w=w, ks=ks, ke=ke, rtb=rtb)


# ---------------------------------------------------------------------------------------------
# Pattern 3: page-table arithmetic on int32 indices -> dsa.page_table_transform


def map_gather(idx, pt):  # clamp inside, where outside: the usual form
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt.gather(1, (i // P).long()) * P + i % P)


def map_gather_unclamped(idx, pt):  # eager gather raises on a negative index: tested without any
    return torch.where(idx < 0, -1, pt.gather(1, (idx // P).long()) * P + idx % P)


def map_index(idx, pt):  # page_table[b, idx // P] with b the row
    rows = torch.arange(idx.shape[0], device=idx.device)[:, None]
    return torch.where(idx < 0, -1, pt[rows, idx // P] * P + idx % P)


def map_index_batch_ge(idx, pt, rtb):  # row_to_batch, int64 arithmetic, where(idx >= 0, .., -1)
    i = idx.long()
    return torch.where(idx >= 0, pt[rtb[:, None], i // P] * P + i % P, -1)


def map_page_input(idx, pt, page: int):  # the page size is a graph input under dynamic=True
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt.gather(1, (i // page).long()) * page + i % page)


@pytest.mark.parametrize("model,extra", [
    (map_gather, ()), (map_gather_unclamped, ()), (map_index, ()), (map_index_batch_ge, ("rtb",)),
    (map_page_input, (P,)),
])
def test_page_table_arithmetic_becomes_page_table_transform(model, extra):
    d = gen()
    idx = d["idx"].clamp(min=0) if model is map_gather_unclamped else d["idx"]
    args = (idx, d["pt"]) + tuple(d[e] if isinstance(e, str) else e for e in extra)
    out, graph = compile_run(model, *args)
    assert rewrites() == {"page_table_transform": 1}
    assert "dsa.page_table_transform" in graph and "aten.gather" not in graph and "aten.index" not in graph
    assert_same(out, model(*args), exact=True)


def near_no_guard(idx, pt):  # no where(idx < 0, -1, ..): -1 maps to page_table[r, 0] * P + 0 in torch
    i = idx.clamp(min=0)
    return pt.gather(1, (i // P).long()) * P + i % P


def near_eq_guard(idx, pt):  # only -1 is "no token": -2 would map to a real slot in torch
    i = idx.clamp(min=0)
    return torch.where(idx == -1, -1, pt.gather(1, (i // P).long()) * P + i % P)


def near_zero_fill(idx, pt):  # a different "no token" value
    i = idx.clamp(min=0)
    return torch.where(idx < 0, 0, pt.gather(1, (i // P).long()) * P + i % P)


def near_page_48(idx, pt):  # not a power of two
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt.gather(1, (i // 48).long()) * 48 + i % 48)


def near_two_page_sizes(idx, pt):  # the slot and the offset disagree on P
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt.gather(1, (i // 64).long()) * 64 + i % 32)


@pytest.mark.parametrize("model", [
    near_no_guard, near_eq_guard, near_zero_fill, near_page_48, near_two_page_sizes,
])
def test_page_table_near_misses_are_left_alone(model):
    d = gen()
    d["idx"][1, 2] = -2
    out, graph = compile_run(model, d["idx"], d["pt"])
    assert rewrites() == {} and "dsa." not in graph
    assert_same(out, model(d["idx"], d["pt"]), exact=True)


def test_int64_indices_are_left_alone():
    d = gen()
    idx = d["idx"].long()  # pattern 3 is for int32 index tensors (dsa ops take int32)
    out, graph = compile_run(map_gather, idx, d["pt"])
    assert rewrites() == {} and "dsa." not in graph
    assert_same(out, map_gather(idx, d["pt"]), exact=True)


def test_symbolic_page_size_is_guarded():
    d = gen()
    f = torch.compile(map_page_input, fullgraph=True, dynamic=True)
    for page in (64, 32, 48):  # 48: the recompile sees a non power of two and does not rewrite
        assert torch.equal(f(d["idx"], d["pt"], page), map_page_input(d["idx"], d["pt"], page))
    assert rewrites() == {"page_table_transform": 2}


# ---------------------------------------------------------------------------------------------
# Pattern 2: top-k then a page mapping -> dsa.topk_page_table_transform


def dsa_topk_mapped(scores, pt):
    return map_index(dsa_ops.topk(scores, K), pt)


def dsa_topk_window_mapped(scores, pt, starts, lengths, rtb):
    idx = dsa_ops.topk(scores, K, lengths=lengths, row_starts=starts, deterministic=True)
    return dsa_ops.page_table_transform(idx, pt, row_to_batch=rtb, page_size=P)


def torch_topk_mapped(scores, pt, k: int):
    idx = torch.topk(scores, k, sorted=False).indices
    return pt.gather(1, idx // P) * P + idx % P


def test_dsa_topk_and_arithmetic_become_topk_page_table_transform():
    d = gen()
    out, graph = compile_run(dsa_topk_mapped, d["scores"], d["pt"])
    assert rewrites() == {"page_table_transform": 1, "topk_page_table_transform": 1}
    assert "dsa.topk_page_table_transform" in graph and "dsa.topk.default" not in graph
    assert "dsa.page_table_transform" not in graph
    assert_same(out, dsa_topk_mapped(d["scores"], d["pt"]))


def test_windowed_deterministic_topk_and_op_keep_order():
    d = gen()
    args = (d["scores"], d["pt"], d["ks"], d["ke"] - d["ks"], d["rtb"])
    out, graph = compile_run(dsa_topk_window_mapped, *args)
    assert rewrites() == {"topk_page_table_transform": 1} and "dsa.topk.default" not in graph
    assert_same(out, dsa_topk_window_mapped(*args), exact=True)  # deterministic: order too


def test_torch_topk_is_rewritten_only_when_promised_nan_free(monkeypatch):
    d = gen()
    out, graph = compile_run(torch_topk_mapped, d["scores"], d["pt"], K)
    assert rewrites() == {} and "aten.topk" in graph  # default: NaN makes it unprovable
    assert_same(out, torch_topk_mapped(d["scores"], d["pt"], K))

    monkeypatch.setattr(di.config, "rewrite_torch_topk", True)
    torch._dynamo.reset()
    out, graph = compile_run(torch_topk_mapped, d["scores"], d["pt"], K)
    assert rewrites() == {"topk_page_table_transform": 1}
    assert "dsa.topk_page_table_transform" in graph and "topk.default" not in graph
    assert_same(out, torch_topk_mapped(d["scores"], d["pt"], K))  # int64, like the torch form


def test_why_torch_topk_needs_the_promise():
    # torch.topk ranks NaN above every number, dsa below: the same call, different sets.
    scores = torch.tensor([[0.5, float("nan"), 2.0, 1.0]])
    assert set(torch.topk(scores, 2, sorted=False).indices[0].tolist()) == {1, 2}
    assert set(dsa_ops.topk(scores, 2)[0].tolist()) == {2, 3}


def test_torch_topk_symbolic_k_recompiles_correctly(monkeypatch):
    monkeypatch.setattr(di.config, "rewrite_torch_topk", True)
    d = gen()
    f = torch.compile(torch_topk_mapped, fullgraph=True, dynamic=True)
    for k in (K, 8):  # the dsa ops take a static k: the rewrite guards it
        assert_same(f(d["scores"], d["pt"], k), torch_topk_mapped(d["scores"], d["pt"], k))
    assert rewrites() == {"topk_page_table_transform": 2}


def near_values_used(scores, pt):
    v, i = torch.topk(scores, K, sorted=False)
    return pt.gather(1, i // P) * P + i % P, v


def near_sorted(scores, pt):  # sorted=True: the order of the result is defined, ours is not
    i = torch.topk(scores, K).indices
    return pt.gather(1, i // P) * P + i % P


def near_smallest(scores, pt):
    i = torch.topk(scores, K, largest=False, sorted=False).indices
    return pt.gather(1, i // P) * P + i % P


def near_indices_reused(scores, pt):  # the raw indices live on: fusing would run the top-k twice
    i = torch.topk(scores, K, sorted=False).indices
    return pt.gather(1, i // P) * P + i % P, i


@pytest.mark.parametrize("model", [near_values_used, near_sorted, near_smallest, near_indices_reused])
def test_torch_topk_near_misses_are_left_alone(model, monkeypatch):
    monkeypatch.setattr(di.config, "rewrite_torch_topk", True)
    d = gen()
    out, graph = compile_run(model, d["scores"], d["pt"])
    assert rewrites() == {} and "dsa." not in graph
    assert_same(out, model(d["scores"], d["pt"]), exact=(model is near_sorted))


# ---------------------------------------------------------------------------------------------
# Pattern 1: the indexer -> dsa.indexer_topk


def indexer(q, kv, w, ks, ke):
    return dsa_ops.topk(dsa_ops.indexer_logits(q, kv, None, w, ks, ke), K, row_starts=ks, lengths=ke - ks)


def indexer_paged(q, kv, w, ks, ke, pt):
    return map_gather(indexer(q, kv, w, ks, ke), pt)


def indexer_paged_op(q, kv, w, ks, ke, pt):
    return dsa_ops.page_table_transform(indexer(q, kv, w, ks, ke), pt)


@pytest.mark.parametrize("model", [indexer, indexer_paged, indexer_paged_op])
def test_indexer_becomes_indexer_topk(model):
    d = gen()
    args = (d["q"], d["kv"], d["w"], d["ks"], d["ke"]) + ((d["pt"],) if model is not indexer else ())
    out, graph = compile_run(model, *args)
    assert rewrites().get("indexer_topk") == 1 and "topk_page_table_transform" not in rewrites()
    assert "dsa.indexer_topk" in graph
    for gone in ("dsa.indexer_logits", "dsa.topk.default", "aten.topk", "dsa.page_table_transform"):
        assert gone not in graph
    if model is not indexer:
        assert "page_table: %" in graph  # the mapping moved into the op
    assert_same(out, model(*args))


def indexer_fp8_default(q, kv, s, w, ks, ke):
    return dsa_ops.topk(dsa_ops.indexer_logits(q, kv, s, w, ks, ke), K, row_starts=ks, lengths=ke - ks)


def indexer_fp8_precise(q, kv, s, w, ks, ke):
    return dsa_ops.topk(dsa_ops.indexer_logits(q, kv, s, w, ks, ke, precise=True), K, row_starts=ks,
                        lengths=ke - ks)


def indexer_fp8_precise_paged(q, kv, s, w, ks, ke, pt):
    return dsa_ops.page_table_transform(indexer_fp8_precise(q, kv, s, w, ks, ke), pt)


@pytest.mark.parametrize("model,precise", [(indexer_fp8_default, False), (indexer_fp8_precise, True),
                                           (indexer_fp8_precise_paged, True)])
def test_indexer_topk_scores_in_the_logits_mode(model, precise):
    """The fused op gets the logits' `precise` (fp8 MMAs by default, exact fp16 MMAs when True)."""
    d = gen()
    q, kv = d["q"].float().to(torch.float8_e4m3fn), d["kv"].float().to(torch.float8_e4m3fn)
    s = torch.rand(kv.shape[0], generator=torch.Generator().manual_seed(1)) + 0.5
    args = (q, kv, s, d["w"], d["ks"], d["ke"]) + ((d["pt"],) if model is indexer_fp8_precise_paged else ())
    out, graph = compile_run(model, *args)
    assert rewrites().get("indexer_topk") == 1 and "dsa.indexer_logits" not in graph
    fused = [ln for ln in graph.splitlines() if "dsa.indexer_topk" in ln]
    # the post-grad graph lists only keywords that differ from the schema default (False)
    assert len(fused) == 1 and ("precise: True" in fused[0]) == precise, fused
    assert_same(out, model(*args))


def test_uuid_covers_the_precise_argument():
    assert any("bool precise=False" in s for s in di._pass._op_schemas() if s.startswith("dsa::indexer_logits"))
    assert any("bool precise=False" in s for s in di._pass._op_schemas() if s.startswith("dsa::indexer_topk"))


def near_logits_reused(q, kv, w, ks, ke):  # the scores tensor is an output too
    logits = dsa_ops.indexer_logits(q, kv, None, w, ks, ke)
    return dsa_ops.topk(logits, K, row_starts=ks, lengths=ke - ks), logits


def near_other_window(q, kv, w, ks, ke):  # top-k over the whole row, not the logits' window
    return dsa_ops.topk(dsa_ops.indexer_logits(q, kv, None, w, ks, ke), K)


def near_deterministic(q, kv, w, ks, ke):  # indexer_topk has no ordering flag
    logits = dsa_ops.indexer_logits(q, kv, None, w, ks, ke)
    return dsa_ops.topk(logits, K, row_starts=ks, lengths=ke - ks, deterministic=True)


@pytest.mark.parametrize("model", [near_logits_reused, near_other_window, near_deterministic])
def test_indexer_near_misses_are_left_alone(model):
    d = gen()
    args = (d["q"], d["kv"], d["w"], d["ks"], d["ke"])
    out, graph = compile_run(model, *args)
    assert rewrites() == {} and "dsa.indexer_logits" in graph and "dsa.indexer_topk" not in graph
    assert_same(out, model(*args), exact=True)


# ---------------------------------------------------------------------------------------------
# Switching it off


def test_disabled_by_config_flag_changes_the_cache_key(monkeypatch):
    p = di.installed()
    on = p.uuid()
    monkeypatch.setattr(di.config, "enabled", False)
    assert p.uuid() != on and p.uuid() is not None
    d = gen()
    out, graph = compile_run(map_gather, d["idx"], d["pt"])
    assert rewrites() == {} and "dsa." not in graph
    assert_same(out, map_gather(d["idx"], d["pt"]), exact=True)


def test_uninstall_and_install_again():
    before = inductor_config.post_grad_custom_post_pass
    try:
        assert di.uninstall() and di.installed() is None and not di.uninstall()
        d = gen()
        _, graph = compile_run(map_gather, d["idx"], d["pt"])
        assert rewrites() == {} and "dsa." not in graph
    finally:
        p = di.install()
    assert di.install() is p and di.installed() is p
    assert inductor_config.post_grad_custom_post_pass is p and p.previous is getattr(before, "previous", None)


@contextlib.contextmanager
def _slot(value):
    old = inductor_config.post_grad_custom_post_pass
    inductor_config.post_grad_custom_post_pass = value
    try:
        yield
    finally:
        inductor_config.post_grad_custom_post_pass = old


def test_uuid_folds_in_the_chained_pass():
    class Mine(CustomGraphPass):
        def __init__(self, tag):
            self.tag = tag

        def __call__(self, graph):
            pass

        def uuid(self):
            return self.tag

    a, b = di.DsaFusionPass(Mine("v1")), di.DsaFusionPass(Mine("v2"))
    assert a.uuid() != b.uuid() and a.uuid() == di.DsaFusionPass(Mine("v1")).uuid()
    assert di.DsaFusionPass(lambda g: None).uuid() is None  # a plain callable cannot be keyed
    with _slot([Mine("x")]):  # a list in the slot (newer torch) is wrapped, not replaced
        p = di.install()
        assert di.installed() is p and isinstance(p.previous, list) and di.install() is p
        assert di.uninstall() and isinstance(inductor_config.post_grad_custom_post_pass, list)
