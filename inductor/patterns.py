"""The rewrites: patterns on the post-grad graph, the checks that make each one exact, replacements.

Written against the real post-grad graph: ``torch.topk`` is ``getitem(aten.topk(..), 1)``, ``//`` is
``aten.div.Tensor_mode(.., rounding_mode="floor")``, ``%`` is ``aten.remainder.Scalar``, casts are
``prims.convert_element_type``, and ``where(c, -1, x)`` takes a 0-d ``aten.full([], -1)``. Ints that
vary (k, P) are pattern arguments: under ``dynamic=True`` they may be graph inputs (SymInts).

Stages, in order (each a PatternMatcherPass):
  A. page-table arithmetic -> dsa.page_table_transform (pattern 3), or, when the indices come straight
     from torch.topk and ``config.rewrite_torch_topk``, -> dsa.topk_page_table_transform (pattern 2);
  B1. indexer_logits -> dsa.topk -> dsa.page_table_transform  => dsa.indexer_topk(page_table=..);
  B2. indexer_logits -> dsa.topk                                => dsa.indexer_topk;
  B3. dsa.topk -> dsa.page_table_transform                      => dsa.topk_page_table_transform.
So the arithmetic of A, once it is a dsa.page_table_transform, fuses further in B1 or B3.

Equivalence assumed for the page mapping (as DESIGN's contracts): every index the model dereferences
has its page slot inside the table, a page entry >= 0 and a slot id that fits in int32. Outside that
the torch forms raise (gather), wrap (advanced indexing) or overflow, while dsa ops give -1.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Callable, Optional

import torch
from torch._inductor.pattern_matcher import (
    MULTIPLE,
    CallFunction,
    KeywordArg,
    Match,
    PatternMatcherPass,
    register_graph_pattern,
)
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import guard_int, statically_known_true

from . import (
    _pass,  # its `config` is read at compile time
    counters,
)

log = logging.getLogger(__name__)
aten, prims, dsa = torch.ops.aten, torch.ops.prims, torch.ops.dsa
INDEX_DTYPES = (torch.int32, torch.int64)
SCORE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the dsa top-k ops accept

# ---------------------------------------------------------------------------------------------
# Small graph helpers


def _val(x: Any) -> Any:
    """The fake value behind a node (tensor or SymInt), or the constant itself."""
    return x.meta.get("val") if isinstance(x, Node) else x


def _is_call(n: Any, *targets) -> bool:
    return isinstance(n, Node) and n.op == "call_function" and n.target in targets


def _arg(node: Node, i: int, name: str, default: Any) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _int_hint(x: Any) -> Optional[int]:
    """x as a Python int: a constant, or a SymInt judged by its hint (the rewrite then guards it)."""
    v = _val(x)
    if isinstance(v, torch.SymInt):
        v = v.node.hint if v.node.has_hint() else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _static_int(x: Any) -> int:
    """x as a Python int for the replacement; a SymInt gets a guard (recompile if it changes),
    because the dsa ops take k and page_size as static ints."""
    v = _val(x)
    return guard_int(v) if isinstance(v, torch.SymInt) else int(v)


def _pow2(p: Any) -> Optional[int]:
    v = _int_hint(p)
    return v if v is not None and v >= 1 and v & (v - 1) == 0 else None


def _tensor(x: Any, dim: int, dtypes) -> Optional[torch.Tensor]:
    v = _val(x)
    return v if isinstance(v, torch.Tensor) and v.dim() == dim and v.dtype in dtypes else None


def _unit_last_stride(t: torch.Tensor) -> bool:
    return statically_known_true(t.stride(-1) == 1)


def _is_int_cast(n: Any) -> bool:
    return (_is_call(n, prims.convert_element_type.default) and n.args[1] in INDEX_DTYPES
            and isinstance(_val(n.args[0]), torch.Tensor) and _val(n.args[0]).dtype in INDEX_DTYPES)


def _widening(n: Node) -> bool:
    return not (_val(n.args[0]).dtype == torch.int64 and n.args[1] == torch.int32)


def _is_clamp_min0(n: Any) -> bool:
    if _is_call(n, aten.clamp_min.default):
        return n.args[1] == 0
    if _is_call(n, aten.clamp.default):
        return _arg(n, 1, "min", None) == 0 and _arg(n, 2, "max", None) is None
    return False


def _strip(n: Any, *, clamps: bool, seen: set) -> Any:
    """The index tensor under integer casts (and clamp(min=0) when `clamps`), recording the nodes
    passed. Stops at an int64 -> int32 cast: the int32 result is then the index tensor itself."""
    while True:
        if _is_int_cast(n) and _widening(n):
            seen.add(n)
            n = n.args[0]
        elif clamps and _is_clamp_min0(n):
            seen.add(n)
            n = n.args[0]
        else:
            return n


def _is_minus_one(x: Any) -> bool:
    """-1 as where() takes it: a literal or (constant-folded) aten.full(shape, -1)."""
    if isinstance(x, Node):
        return _is_call(x, aten.full.default) and x.args[1] == -1
    return isinstance(x, int) and not isinstance(x, bool) and x == -1


def _same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dim() != b.dim():
        return False
    return all(statically_known_true(x == y) for x, y in zip(a.shape, b.shape, strict=True))


def _torch_topk_chain(idx: Any) -> set:
    """The getitem and int casts between an aten.topk and `idx` (its indices), or an empty set."""
    chain = set()
    while _is_int_cast(idx):
        chain.add(idx)
        idx = idx.args[0]
    if _is_call(idx, operator.getitem) and idx.args[1] == 1 and _is_call(idx.args[0], aten.topk.default):
        return chain | {idx}
    return set()


def _torch_topk_of(idx: Any) -> Optional[Node]:
    chain = _torch_topk_chain(idx)
    return next((n.args[0] for n in chain if n.target is operator.getitem), None)


def _torch_topk_exact(topk: Node) -> bool:
    """torch.topk(scores, k, dim=-1, largest=True, sorted=False), only its indices used, on scores a
    full-window dsa top-k accepts. (NaN is what keeps this behind config.rewrite_torch_topk.)"""
    scores = topk.args[0]
    sv = _tensor(scores, 2, SCORE_DTYPES)
    k = _int_hint(topk.args[1])
    return (sv is not None and _unit_last_stride(sv) and k is not None and k >= 1
            and _arg(topk, 2, "dim", -1) in (-1, 1) and _arg(topk, 3, "largest", True) is True
            and _arg(topk, 4, "sorted", True) is False
            and len(topk.users) == 1 and _is_call(next(iter(topk.users)), operator.getitem))


def _dies_with(root: Node, expr: set, anchor: Node) -> bool:
    """Every use of `root` (transitively) is inside `expr`, so replacing `anchor` frees it."""
    todo, done = [root], set()
    while todo:
        n = todo.pop()
        for u in n.users:
            if u is anchor or u in done:
                continue
            if u not in expr:
                return False
            done.add(u)
            todo.append(u)
    return True


def _count(name: str) -> None:
    counters[name] += 1
    counters[name.split("/")[0]] += 1
    torch._dynamo.utils.counters["dsa_ops"][name] += 1
    log.debug("dsa_ops.inductor rewrite: %s", name)


def _replace(match: Match, fn: Callable, **inputs) -> None:
    """Swap the match for the trace of fn(**inputs): Node inputs become graph inputs, anything else
    (None, ints) is baked in as a constant."""
    names = [k for k, v in inputs.items() if isinstance(v, Node)]
    consts = {k: v for k, v in inputs.items() if not isinstance(v, Node)}

    def traced(*vals):
        return fn(**consts, **dict(zip(names, vals, strict=True)))

    match.replace_by_example(traced, [inputs[k] for k in names])


def _dtype_as(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return out if out.dtype == dtype else out.to(dtype)


# ---------------------------------------------------------------------------------------------
# Stage A: page-table arithmetic (pattern 3, and the torch.topk form of pattern 2)


def _arith(table_form: str, swapped: bool):
    """page_table.gather(1, slot) * P + off % P, or page_table[batch, slot] * P + off % P."""
    if table_form == "gather":
        page = CallFunction(aten.gather.default, KeywordArg("page_table"), KeywordArg("dim"),
                            KeywordArg("slot"))
    else:
        page = CallFunction(aten.index.Tensor, KeywordArg("page_table"),
                            [KeywordArg("batch"), KeywordArg("slot")])
    base = CallFunction(aten.mul.Tensor, page, KeywordArg("P"))
    off = CallFunction(aten.remainder.Scalar, KeywordArg("offset"), KeywordArg("P"))
    return CallFunction(aten.add.Tensor, *((off, base) if swapped else (base, off)))


def _guarded(arith, guard: str):
    """where(idx < 0, -1, arith) or where(idx >= 0, arith, -1)."""
    if guard == "lt":
        cond = CallFunction(aten.lt.Scalar, KeywordArg("guard"), 0)
        return CallFunction(aten.where.self, cond, KeywordArg("fill"), arith)
    cond = CallFunction(aten.ge.Scalar, KeywordArg("guard"), 0)
    return CallFunction(aten.where.self, cond, arith, KeywordArg("fill"))


def _batch_of(batch: Any, rows: Any, seen: set):
    """page_table[batch, ..]'s rows: (True, None) for arange(rows)[:, None], (True, t) for
    t[:, None] with t an integer [rows] tensor (row_to_batch), (False, None) otherwise."""
    if not _is_call(batch, aten.unsqueeze.default) or batch.args[1] not in (1, -1):
        return False, None
    src = batch.args[0]
    seen.add(batch)
    if _is_call(src, prims.iota.default):
        seen.add(src)
        ok = (src.kwargs.get("start", 0) == 0 and src.kwargs.get("step", 1) == 1
              and statically_known_true(_val(src.args[0]) == rows))
        return ok, None
    t = _tensor(src, 1, INDEX_DTYPES)
    return (t is not None and statically_known_true(t.shape[0] == rows)), src


def _plan_mapping(match: Match, table_form: str, guard: Optional[str]) -> Optional[dict]:
    kw = match.kwargs
    anchor = match.output_node()
    out = _tensor(anchor, 2, INDEX_DTYPES)
    P = _pow2(kw["P"])  # the pattern already made the mul's and the remainder's P the same
    pt = _tensor(kw["page_table"], 2, (torch.int32,))
    if out is None or P is None or pt is None or not _unit_last_stride(pt):
        return None
    if table_form == "gather" and kw["dim"] not in (1, -1):
        return None
    expr = set(match.nodes)
    # The page slot: [cast] floor(idx / P), idx possibly cast or clamped at 0.
    div = _strip(kw["slot"], clamps=False, seen=expr)
    if not (_is_call(div, aten.div.Tensor_mode) and div.kwargs.get("rounding_mode") == "floor"
            and len(div.args) == 2 and (div.args[1] is kw["P"] or div.args[1] == kw["P"])):
        return None
    expr.add(div)
    root = _strip(div.args[0], clamps=True, seen=expr)
    if _strip(kw["offset"], clamps=True, seen=expr) is not root:
        return None
    rv = _tensor(root, 2, INDEX_DTYPES)
    if rv is None or not _same_shape(out, rv):  # e.g. a fill that broadcasts the result wider
        return None
    if guard is not None:
        # where(idx < 0, -1, ..) on the index itself (a clamped one is never < 0: no guard then)
        if _strip(kw["guard"], clamps=False, seen=expr) is not root or not _is_minus_one(kw["fill"]):
            return None
        if isinstance(kw["fill"], Node):
            expr.add(kw["fill"])
    row_to_batch = None
    if table_form == "index":
        ok, row_to_batch = _batch_of(kw["batch"], rv.shape[0], expr)
        if not ok:
            return None
    plan = dict(anchor=anchor, root=root, P=kw["P"], page_table=kw["page_table"],
                row_to_batch=row_to_batch, out_dtype=out.dtype)
    topk = _torch_topk_of(root)
    # Pattern 2, torch form: indices are >= 0 (no guard needed), and the topk must die with the
    # expression, else the top-k would run twice.
    if (topk is not None and _pass.config.rewrite_torch_topk and _torch_topk_exact(topk)
            and _dies_with(topk, expr | _torch_topk_chain(root), anchor)):
        return dict(plan, kind="torch_topk", topk=topk)
    if rv.dtype != torch.int32 or guard is None:
        # Pattern 3 is for int32 indices; without the where(idx < 0, -1, ..) guard a negative index
        # maps to a real slot in torch and to -1 in dsa.
        return None
    return dict(plan, kind="indices")


def _rewrite_mapping(match: Match, form: str, table_form: str, guard: Optional[str]) -> None:
    plan = _plan_mapping(match, table_form, guard)
    P, out_dtype = _static_int(plan["P"]), plan["out_dtype"]
    if plan["kind"] == "indices":

        def fn(idx, page_table, row_to_batch=None):
            rtb = None if row_to_batch is None else row_to_batch.to(torch.int32)
            out = dsa.page_table_transform(idx.contiguous(), page_table, row_to_batch=rtb, page_size=P)
            return _dtype_as(out, out_dtype)

        _replace(match, fn, idx=plan["root"], page_table=plan["page_table"],
                 row_to_batch=plan["row_to_batch"])
        _count(f"page_table_transform/{form}")
        return
    topk = plan["topk"]
    k = _static_int(topk.args[1])

    def fn(scores, page_table, row_to_batch=None):
        rows, width = scores.shape
        full_rows = torch.full((rows,), width, dtype=torch.int32, device=scores.device)
        rtb = None if row_to_batch is None else row_to_batch.to(torch.int32)
        out = dsa.topk_page_table_transform(scores, page_table, full_rows, k, row_to_batch=rtb, page_size=P)
        return _dtype_as(out, out_dtype)

    _replace(match, fn, scores=topk.args[0], page_table=plan["page_table"], row_to_batch=plan["row_to_batch"])
    _count(f"topk_page_table_transform/torch.topk+{form}")


# ---------------------------------------------------------------------------------------------
# Stage B: fusing dsa ops (patterns 1 and 2)


def _canonicalize_dsa_calls(graph: torch.fx.Graph) -> None:
    """Give every dsa op call all its arguments explicitly (positional ones as args, keyword-only
    ones as kwargs, defaults filled in), so that one pattern matches however the model spelled the
    call; the pattern matcher would otherwise ignore a keyword it does not list."""
    for n in graph.nodes:
        t = n.target
        if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or t.namespace != "dsa":
            continue
        args, kwargs = [], {}
        for i, a in enumerate(t._schema.arguments):
            if not a.kwarg_only and i < len(n.args):
                v = n.args[i]
            elif a.name in n.kwargs:
                v = n.kwargs[a.name]
            elif a.has_default_value():
                v = a.default_value
            else:
                break  # malformed call: leave it to the op's own checks
            if a.kwarg_only:
                kwargs[a.name] = v
            else:
                args.append(v)
        else:
            n.args, n.kwargs = tuple(args), kwargs


def _logits_topk():
    """dsa.topk(dsa.indexer_logits(q, kv, s, w, ks, ke), k, lengths=ke - ks, row_starts=ks): the window
    of the top-k is exactly the window the logits were computed on, and order is unspecified."""
    logits = CallFunction(dsa.indexer_logits.default, KeywordArg("q"), KeywordArg("kv"),
                          KeywordArg("kv_scale"), KeywordArg("weights"), KeywordArg("ks"), KeywordArg("ke"),
                          clean=KeywordArg("clean"), precise=KeywordArg("precise"))  # one user: no scores
    # tensor may remain; `precise` passes on to indexer_topk, which scores in the same mode
    lengths = CallFunction(aten.sub.Tensor, KeywordArg("ke"), KeywordArg("ks"), _users=MULTIPLE)
    return CallFunction(dsa.topk.default, logits, KeywordArg("k"), lengths=lengths,
                        row_starts=KeywordArg("ks"), deterministic=False)


def _mapped(indices):
    return CallFunction(dsa.page_table_transform.default, indices, KeywordArg("page_table"),
                        row_to_batch=KeywordArg("row_to_batch"),
                        page_table_row_starts=KeywordArg("page_table_row_starts"),
                        page_size=KeywordArg("page_size"))


def _topk_node(match: Match) -> Node:
    out = match.output_node()
    return out.args[0] if out.target is dsa.page_table_transform.default else out


def _plain_lengths(match: Match) -> bool:
    # The pattern matcher ignores keywords a pattern does not list: refuse sub(.., alpha=2). The
    # precision mode must be a constant to pass on to indexer_topk.
    sub = _topk_node(match).kwargs["lengths"]
    return (len(sub.args) == 2 and sub.kwargs.get("alpha", 1) == 1
            and isinstance(match.kwargs["precise"], bool))


def _rewrite_indexer(match: Match, paged: bool) -> None:
    kw = match.kwargs
    page = dict(page_table=kw["page_table"], row_to_batch=kw["row_to_batch"],
                page_table_row_starts=kw["page_table_row_starts"]) if paged else {}
    page_size = kw["page_size"] if paged else 64
    k = _static_int(kw["k"])
    precise = kw["precise"]  # a Python bool (_plain_lengths checked it)

    def fn(q, kv, kv_scale, weights, ks, ke, page_table=None, row_to_batch=None, page_table_row_starts=None):
        return dsa.indexer_topk(q, kv, kv_scale, weights, ks, ke, k, precise=precise, page_table=page_table,
                                page_size=page_size, row_to_batch=row_to_batch,
                                page_table_row_starts=page_table_row_starts)[0]

    _replace(match, fn, q=kw["q"], kv=kw["kv"], kv_scale=kw["kv_scale"], weights=kw["weights"], ks=kw["ks"],
             ke=kw["ke"], **page)
    _count("indexer_topk/logits+topk" + ("+page_table_transform" if paged else ""))


def _topk_window_ok(match: Match) -> bool:
    # topk_page_table_transform needs explicit lengths: lengths=None is the full row only without
    # row_starts (with them, W - row_starts could overflow int32 where dsa.topk computes in int64).
    kw = match.kwargs
    return kw["lengths"] is not None or kw["row_starts"] is None


def _rewrite_topk_mapped(match: Match) -> None:
    kw = match.kwargs
    k, page_size, det = kw["k"], kw["page_size"], kw["deterministic"]

    def fn(scores, page_table, lengths=None, row_starts=None, row_to_batch=None, page_table_row_starts=None):
        if lengths is None:
            lengths = torch.full((scores.shape[0],), scores.shape[1], dtype=torch.int32, device=scores.device)
        # deterministic is forwarded: ascending relative indices map to slots in the same order.
        return dsa.topk_page_table_transform(scores, page_table, lengths, k, row_starts=row_starts,
                                             page_table_row_starts=page_table_row_starts,
                                             row_to_batch=row_to_batch, page_size=page_size,
                                             deterministic=det)

    _replace(match, fn, scores=kw["scores"], page_table=kw["page_table"], lengths=kw["lengths"],
             row_starts=kw["row_starts"], row_to_batch=kw["row_to_batch"],
             page_table_row_starts=kw["page_table_row_starts"])
    _count("topk_page_table_transform/dsa.topk+page_table_transform")


# ---------------------------------------------------------------------------------------------
# Registration (once, on first use) and the pass body

_STAGES: list[PatternMatcherPass] = []


def _safe(check: Callable[[Match], Any]) -> Callable[[Match], bool]:
    """A check that fails on an unexpected graph shape says "no rewrite" rather than breaking compile."""

    def run(match: Match) -> bool:
        try:
            return bool(check(match))
        except Exception:  # noqa: BLE001  (not rewriting is always correct)
            log.debug("dsa_ops.inductor: check %s failed; not rewriting", check.__name__, exc_info=True)
            return False

    return run


def _register_mapping(stage: PatternMatcherPass, table_form: str, swapped: bool,
                      guard: Optional[str]) -> None:
    arith = _arith(table_form, swapped)
    pattern = arith if guard is None else _guarded(arith, guard)
    form = table_form + ("+swapped" if swapped else "") + (f"+where_{guard}" if guard else "")

    def plan_mapping(m):
        return _plan_mapping(m, table_form, guard) is not None

    def handler(m, *_, **__):
        _rewrite_mapping(m, form, table_form, guard)

    register_graph_pattern(pattern, extra_check=_safe(plan_mapping), pass_dict=stage)(handler)


def _register() -> None:
    # Stage A: one pattern per source form of the arithmetic (table access x operand order x guard).
    mapping = PatternMatcherPass(pass_name="dsa_page_table_arith")
    for table_form in ("gather", "index"):
        for swapped in (False, True):
            for guard in ("lt", "ge", None):
                _register_mapping(mapping, table_form, swapped, guard)

    # Stage B: separate passes so that the largest fusion gets the first look at a dsa.topk.
    indexer_paged = PatternMatcherPass(pass_name="dsa_indexer_topk_paged")
    register_graph_pattern(_mapped(_logits_topk()), extra_check=_safe(_plain_lengths),
                           pass_dict=indexer_paged)(lambda m, *_, **__: _rewrite_indexer(m, paged=True))

    indexer = PatternMatcherPass(pass_name="dsa_indexer_topk")
    register_graph_pattern(_logits_topk(), extra_check=_safe(_plain_lengths), pass_dict=indexer)(
        lambda m, *_, **__: _rewrite_indexer(m, paged=False))

    topk_mapped = PatternMatcherPass(pass_name="dsa_topk_page_table")
    topk = CallFunction(dsa.topk.default, KeywordArg("scores"), KeywordArg("k"),
                        lengths=KeywordArg("lengths"), row_starts=KeywordArg("row_starts"),
                        deterministic=KeywordArg("deterministic"))
    register_graph_pattern(_mapped(topk), extra_check=_safe(_topk_window_ok), pass_dict=topk_mapped)(
        lambda m, *_, **__: _rewrite_topk_mapped(m))

    _STAGES[:] = [mapping, indexer_paged, indexer, topk_mapped]


def _erase_dead(graph: torch.fx.Graph, dead_before: set) -> None:
    """Drop the pure nodes our rewrites left unused (the old topk, casts, clamps)."""
    for n in reversed(list(graph.nodes)):
        if n.op == "call_function" and not n.users and n not in dead_before and not n.is_impure():
            graph.erase_node(n)


def rewrite(graph: torch.fx.Graph) -> int:
    """Apply every stage to a post-grad graph; returns the number of rewrites."""
    if not _STAGES:
        _register()
    dead_before = {n for n in graph.nodes if not n.users}
    total = 0
    for i, stage in enumerate(_STAGES):
        if i == 1:
            _canonicalize_dsa_calls(graph)
        n = stage.apply(graph)
        if n:
            # What a rewrite orphaned still counts as a user for the next stage's checks.
            _erase_dead(graph, dead_before)
        total += n
    return total
