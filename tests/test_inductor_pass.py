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
    monkeypatch.setattr(di.config, "rewrite_torch_topk", True)
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


def map_index_casts_inside(idx, pt):  # int64 casts inside the indexing, the offset cast too
    rows = torch.arange(idx.shape[0], device=idx.device)[:, None]
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt[rows, (i // P).long()].long() * P + (i % P).long())


def map_index_long_first(idx, pt):  # the index cast to int64 before the division
    rows = torch.arange(idx.shape[0], device=idx.device).unsqueeze(-1)
    i = idx.long()
    return torch.where(idx < 0, -1, pt[rows, i.clamp(min=0) // P] * P + i.clamp(min=0) % P)


def map_request_rows_gather(idx, pt, rtb):  # page_table[row_to_batch[r]]: the rows first, then gather
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt[rtb.long()].gather(1, (i // P).long()) * P + i % P)


def map_request_rows_index(idx, pt, rtb):  # page_table[row_to_batch][r, slot], int32 row_to_batch
    rows = torch.arange(idx.shape[0], device=idx.device)[:, None]
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt[rtb][rows, (i // P).long()] * P + i % P)


def map_batch_cast_outside(idx, pt, rtb):  # row_to_batch[:, None] cast after the unsqueeze
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt[rtb[:, None].long(), (i // P).long()] * P + i % P)


def map_offset_first(idx, pt, rtb):  # idx % P + page * P
    i = idx.clamp(min=0)
    return torch.where(idx >= 0, i % P + pt[rtb.long()].gather(1, (i // P).long()) * P, -1)


@pytest.mark.parametrize("model", [
    map_index_casts_inside, map_index_long_first, map_request_rows_gather, map_request_rows_index,
    map_batch_cast_outside, map_offset_first,
])
def test_page_table_arithmetic_however_cast_or_indexed(model):
    d = gen()
    args = (d["idx"], d["pt"]) + ((d["rtb"],) if "rtb" in model.__code__.co_varnames[:3] else ())
    out, graph = compile_run(model, *args)
    assert rewrites() == {"page_table_transform": 1}, dict(di.counters)
    assert "dsa.page_table_transform" in graph and "aten.gather" not in graph and "aten.index" not in graph
    if len(args) == 3:
        assert "row_to_batch: %" in graph
    assert_same(out, model(*args), exact=True)


def near_offset_other_page(idx, pt):  # the offset's modulus differs from the product's P
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt.gather(1, (i // P).long()) * P + i % (P // 2))


def near_slot_shifted(idx, pt):  # different arithmetic: the next page
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt.gather(1, (i // P + 1).long().clamp(max=PAGES - 1)) * P + i % P)


def near_slot_other_page(idx, pt):  # the slot's divisor differs from the product's P
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt.gather(1, (i // (P * 2)).long()) * P + i % P)


def near_offset_other_index(idx, pt):  # slot from one index tensor, offset from another
    i = idx.clamp(min=0)
    j = (idx + 1).clamp(min=0)
    return torch.where(idx < 0, -1, pt.gather(1, (i // P).long()) * P + j % P)


def near_request_rows_reversed(idx, pt):  # page_table[rows][b, slot]: rows of a different length
    i = idx.clamp(min=0)
    table = pt[torch.arange(pt.shape[0] - 1, -1, -1, device=pt.device)[: idx.shape[0] - 1]]
    return torch.where(idx[1:] < 0, -1, table.gather(1, (i[1:] // P).long()) * P + i[1:] % P)


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


def near_add_alpha(idx, pt):  # torch.add(page * P, off, alpha=2): not the mapping (alpha is a keyword)
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, torch.add(pt.gather(1, (i // P).long()) * P, i % P, alpha=2))


@pytest.mark.parametrize("model", [
    near_no_guard, near_eq_guard, near_zero_fill, near_page_48, near_two_page_sizes, near_offset_other_page,
    near_slot_shifted, near_slot_other_page, near_offset_other_index, near_request_rows_reversed, near_add_alpha,
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


def nan_rows(scores: torch.Tensor) -> torch.Tensor:
    """NaN in rows 1..3: fewer than k, exactly k, more than k (row 0 and the rest: none)."""
    s = scores.clone()
    s[1, ::37] = float("nan")
    s[2, 5:5 + K] = float("nan")
    s[3, 40:40 + 2 * K] = float("nan")
    return s


def fused_line(graph: str, op: str) -> str:
    lines = [ln for ln in graph.splitlines() if f"dsa.{op}.default" in ln]
    assert len(lines) == 1, lines
    return lines[0]


def test_torch_topk_becomes_the_nan_first_form():
    d = gen()
    scores = nan_rows(d["scores"])
    out, graph = compile_run(torch_topk_mapped, scores, d["pt"], K)
    assert rewrites() == {"topk_page_table_transform": 1} and "aten.topk" not in graph
    assert "nan_first: True" in fused_line(graph, "topk_page_table_transform")
    want = torch_topk_mapped(scores, d["pt"], K)
    # Rows 0-2: no two equal keys compete for the last places, so torch's set is the only one.
    assert out.dtype == want.dtype and torch.equal(as_sets(out[:3]), as_sets(want[:3]))


def torch_topk_identity_mapped(scores, pt):  # pt[r, j] = j: slots are the indices themselves
    idx = torch.topk(scores, K, sorted=False).indices
    return pt.gather(1, idx // P) * P + idx % P


def test_torch_topk_rewrite_picks_what_torch_picks_among_nans():
    """More NaNs than k: torch returns any k of them (on the CPU not the first ones); the nan_first form
    the first k. Both are k NaN positions: compare the picked values, and that the picks are distinct."""
    d = gen()
    scores = nan_rows(d["scores"])
    pt = torch.arange(PAGES * 10, dtype=torch.int32).repeat(ROWS, 1)[:, : (WIDTH + P - 1) // P].contiguous()
    out, _ = compile_run(torch_topk_identity_mapped, scores, pt)
    want = torch_topk_identity_mapped(scores, pt)
    assert rewrites() == {"topk_page_table_transform": 1}
    for r in range(ROWS):
        assert len(set(out[r].tolist())) == K
        got_v, want_v = scores[r, out[r]].sort().values, scores[r, want[r]].sort().values
        assert torch.equal(got_v.isnan(), want_v.isnan())
        assert torch.equal(got_v[~got_v.isnan()], want_v[~want_v.isnan()])
    assert set(out[3].tolist()) == set(range(40, 40 + K))  # ties to the smaller index


def test_torch_topk_rewrite_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(di.config, "rewrite_torch_topk", False)
    d = gen()
    out, graph = compile_run(torch_topk_mapped, d["scores"], d["pt"], K)
    assert rewrites() == {} and "aten.topk" in graph
    assert_same(out, torch_topk_mapped(d["scores"], d["pt"], K))


def test_nan_first_is_torch_topk_order():
    scores = torch.tensor([[0.5, float("nan"), 2.0, 1.0, float("inf")]])
    assert set(torch.topk(scores, 2, sorted=False).indices[0].tolist()) == {1, 4}
    assert set(dsa_ops.topk(scores, 2, nan_first=True)[0].tolist()) == {1, 4}
    assert set(dsa_ops.topk(scores, 2)[0].tolist()) == {2, 4}  # the default ranks NaN last


def test_torch_topk_symbolic_k_recompiles_correctly():
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


def near_torch_topk_add_alpha(scores, pt):
    i = torch.topk(scores, K, sorted=False).indices
    return torch.add(pt.gather(1, i // P) * P, i % P, alpha=2)


@pytest.mark.parametrize("model", [near_values_used, near_sorted, near_smallest, near_indices_reused,
                                   near_torch_topk_add_alpha])
def test_torch_topk_near_misses_are_left_alone(model):
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


def whole_rows(q, kv):
    t, n = q.shape[0], kv.shape[0]
    return torch.zeros(t, dtype=torch.int32), torch.full((t,), n, dtype=torch.int32)


def indexer_torch_topk(q, kv, w):  # as a model writes it: whole rows, torch.topk
    ks, ke = whole_rows(q, kv)
    return torch.topk(dsa_ops.indexer_logits(q, kv, None, w, ks, ke), K, sorted=False).indices


def indexer_torch_topk_paged(q, kv, w, pt, rtb):
    idx = indexer_torch_topk(q, kv, w)
    return pt[rtb.long()].gather(1, idx // P) * P + idx % P


def indexer_torch_topk_paged_index(q, kv, w, pt):
    ks, ke = whole_rows(q, kv)
    idx = torch.topk(dsa_ops.indexer_logits(q, kv, None, w, ks, ke), K, sorted=False).indices.int()
    rows = torch.arange(idx.shape[0])[:, None]
    return torch.where(idx < 0, -1, pt[rows, (idx // P).long()] * P + idx % P)


def indexer_dsa_topk_nan_first_paged(q, kv, w, ks, ke, pt):
    logits = dsa_ops.indexer_logits(q, kv, None, w, ks, ke)
    return map_gather(dsa_ops.topk(logits, K, row_starts=ks, lengths=ke - ks, nan_first=True), pt)


def nan_keys(kv: torch.Tensor) -> torch.Tensor:
    """Three keys NaN: their scores are NaN in every row, ranked first by torch.topk."""
    kv = kv.clone()
    kv[[7, 100, 299]] = float("nan")
    return kv


@pytest.mark.parametrize("model,extra", [
    (indexer_torch_topk, ()), (indexer_torch_topk_paged, ("pt", "rtb")), (indexer_torch_topk_paged_index, ("pt",)),
])
def test_indexer_torch_topk_becomes_indexer_topk(model, extra):
    d = gen()
    # Positive weights: no row is a relu plateau of zeros, whose ties torch breaks in any order.
    args = (d["q"], nan_keys(d["kv"]), d["w"].abs()) + tuple(d[e] for e in extra)
    out, graph = compile_run(model, *args)
    assert rewrites() == {"indexer_topk": 1}, dict(di.counters)
    line = fused_line(graph, "indexer_topk")
    assert "nan_first: True" in line and ("page_table: %" in line) == bool(extra)
    for gone in ("dsa.indexer_logits", "aten.topk", "dsa.topk", "aten.gather", "aten.index"):
        assert gone not in graph
    assert_same(out, model(*args))
    if not extra:  # the NaN keys are picked in every row, as torch picks them
        assert all((out == j).any(dim=1).all() for j in (7, 100, 299))


@pytest.mark.parametrize("model,extra", [
    (indexer_torch_topk, ()), (indexer_torch_topk_paged, ("pt", "rtb")), (indexer_torch_topk_paged_index, ("pt",)),
])
def test_indexer_torch_topk_rewrite_can_be_switched_off(monkeypatch, model, extra):
    monkeypatch.setattr(di.config, "rewrite_torch_topk", False)
    d = gen()
    args = (d["q"], d["kv"], d["w"].abs()) + tuple(d[e] for e in extra)
    out, graph = compile_run(model, *args)
    # torch.topk stays; the int32 guarded mapping after it may still become dsa.page_table_transform.
    assert set(rewrites()) <= {"page_table_transform"}, dict(di.counters)
    assert "aten.topk" in graph and "dsa.indexer_topk" not in graph
    assert_same(out, model(*args))


def test_indexer_dsa_topk_nan_first_keeps_the_flag():
    d = gen()
    args = (d["q"], nan_keys(d["kv"]), d["w"].abs(), d["ks"], d["ke"], d["pt"])
    out, graph = compile_run(indexer_dsa_topk_nan_first_paged, *args)
    assert rewrites().get("indexer_topk") == 1 and "nan_first: True" in fused_line(graph, "indexer_topk")
    assert_same(out, indexer_dsa_topk_nan_first_paged(*args))


def near_torch_topk_windowed(q, kv, w, ks, ke):  # windows: torch.topk may pick -inf positions, dsa gives -1
    return torch.topk(dsa_ops.indexer_logits(q, kv, None, w, ks, ke), K, sorted=False).indices


def near_torch_topk_short_end(q, kv, w):  # ke = N - 1: the last column is -inf, not a key
    t, n = q.shape[0], kv.shape[0]
    ks, ke = torch.zeros(t, dtype=torch.int32), torch.full((t,), n - 1, dtype=torch.int32)
    return torch.topk(dsa_ops.indexer_logits(q, kv, None, w, ks, ke), K, sorted=False).indices


def near_torch_topk_start_one(q, kv, w):  # ks = 1: absolute columns are not relative indices
    t, n = q.shape[0], kv.shape[0]
    ks, ke = torch.ones(t, dtype=torch.int32), torch.full((t,), n, dtype=torch.int32)
    return torch.topk(dsa_ops.indexer_logits(q, kv, None, w, ks, ke), K, sorted=False).indices


@pytest.mark.parametrize("model", [near_torch_topk_windowed, near_torch_topk_short_end, near_torch_topk_start_one])
def test_indexer_torch_topk_other_windows_are_left_alone(model):
    d = gen()
    args = (d["q"], d["kv"], d["w"]) + ((d["ks"], d["ke"]) if model is near_torch_topk_windowed else ())
    out, graph = compile_run(model, *args)
    assert rewrites() == {} and "dsa.indexer_logits" in graph and "aten.topk" in graph
    assert_same(out, model(*args), exact=False)


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
