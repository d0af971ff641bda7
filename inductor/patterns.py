"""The rewrites: patterns on the post-grad graph, the checks that make each one exact, replacements.

Written against the real post-grad graph: ``torch.topk`` is ``getitem(aten.topk(..), 1)``, ``//`` is
``aten.div.Tensor_mode(.., rounding_mode="floor")``, ``%`` is ``aten.remainder.Scalar``, casts are
``prims.convert_element_type``, ``page_table[row_to_batch]`` is ``aten.index.Tensor(pt, [rtb])``,
``torch.zeros`` / ``torch.full`` are ``aten.full``, and ``where(c, -1, x)`` takes a 0-d
``aten.full([], -1)``. Ints that vary (k, P) are pattern arguments: under ``dynamic=True`` they may be
graph inputs (SymInts).

Stages, in order (each a PatternMatcherPass):
  A. page-table arithmetic -> dsa.page_table_transform (pattern 3), or, when the indices come straight
     from torch.topk, -> dsa.topk_page_table_transform(nan_first=True) (pattern 2), or, when that
     top-k is over dsa.indexer_logits of whole rows, -> dsa.indexer_topk(nan_first=True, page_table=..);
  A2. torch.topk over dsa.indexer_logits of whole rows, no mapping -> dsa.indexer_topk(nan_first=True);
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
from torch.fx.experimental.symbolic_shapes import guard_bool, guard_int, statically_known_true

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
    full-window dsa top-k accepts. Its set is the nan_first=True form's (NaN above every number); of
    equal keys torch returns any, the dsa ops the smaller indices."""
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


def _arith(swapped: bool):
    """page * P + off, in either order; what `page` and `off` are (a table lookup, a remainder by the
    same P, each under any integer casts) is checked by _plan_mapping, so one pattern serves every
    way a model casts or indexes the mapping."""
    base = CallFunction(aten.mul.Tensor, KeywordArg("page"), KeywordArg("P"))
    off = KeywordArg("off")
    return CallFunction(aten.add.Tensor, *((off, base) if swapped else (base, off)))


def _guarded(arith, guard: str):
    """where(idx < 0, -1, arith) or where(idx >= 0, arith, -1)."""
    if guard == "lt":
        cond = CallFunction(aten.lt.Scalar, KeywordArg("guard"), 0)
        return CallFunction(aten.where.self, cond, KeywordArg("fill"), arith)
    cond = CallFunction(aten.ge.Scalar, KeywordArg("guard"), 0)
    return CallFunction(aten.where.self, cond, arith, KeywordArg("fill"))


def _rows_vector(x: Any, rows: Any, seen: set) -> Optional[Node]:
    """x (under integer casts) as an integer [rows] tensor node, else None."""
    t = _strip(x, clamps=False, seen=seen)
    v = _tensor(t, 1, INDEX_DTYPES)
    return t if v is not None and statically_known_true(v.shape[0] == rows) else None


def _batch_of(batch: Any, rows: Any, seen: set):
    """page_table[batch, ..]'s rows: (True, None) for arange(rows)[:, None], (True, t) for
    t[:, None] with t an integer [rows] tensor (row_to_batch), (False, None) otherwise; casts on
    either side of the unsqueeze allowed."""
    batch = _strip(batch, clamps=False, seen=seen)
    if not _is_call(batch, aten.unsqueeze.default) or batch.args[1] not in (1, -1):
        return False, None
    seen.add(batch)
    src = _strip(batch.args[0], clamps=False, seen=seen)
    if _is_call(src, prims.iota.default):
        seen.add(src)
        ok = (src.kwargs.get("start", 0) == 0 and src.kwargs.get("step", 1) == 1
              and statically_known_true(_val(src.args[0]) == rows))
        return ok, None
    t = _rows_vector(src, rows, seen)
    return t is not None, t


def _same_int(a: Any, b: Any) -> bool:
    """The same int in the graph: one node (a SymInt input) or equal constants."""
    if isinstance(a, Node) or isinstance(b, Node):
        return a is b
    return isinstance(a, int) and not isinstance(a, bool) and a == b


def _page_lookup(page: Any, rows: Any, seen: set) -> Optional[dict]:
    """The page-table read of the mapping, under integer casts: page_table.gather(1, slot) or
    page_table[b, slot], where page_table may itself be a request table's rows gathered by a
    row-to-request vector (page_table[row_to_batch], then .gather(1, slot) or [arange[:, None], slot])."""
    page = _strip(page, clamps=False, seen=seen)
    if _is_call(page, aten.gather.default):
        if _arg(page, 1, "dim", None) not in (1, -1) or len(page.args) < 3:
            return None
        table, batch, slot = page.args[0], None, page.args[2]
    elif _is_call(page, aten.index.Tensor) and len(page.args[1]) == 2 and None not in page.args[1]:
        table, (batch, slot) = page.args[0], page.args[1]
    else:
        return None
    seen.add(page)
    row_to_batch = None
    if _is_call(table, aten.index.Tensor) and len(table.args[1]) == 1 and table.args[1][0] is not None:
        # page_table[row_to_batch]: the rows of the score rows' requests, one per score row
        row_to_batch = _rows_vector(table.args[1][0], rows, seen)
        if row_to_batch is None:
            return None
        seen.add(table)
        table = table.args[0]
    if batch is not None:
        ok, rtb = _batch_of(batch, rows, seen)
        if not ok or (rtb is not None and row_to_batch is not None):
            return None
        row_to_batch = rtb if rtb is not None else row_to_batch
    pt = _tensor(table, 2, (torch.int32,))
    if pt is None or not _unit_last_stride(pt):
        return None
    return dict(page_table=table, row_to_batch=row_to_batch, slot=slot)


def _full_window(ks: Any, ke: Any, width: Any) -> bool:
    """ks is all 0 and ke all `width` (aten.full constants): the logits' window is the whole row."""
    if not (_is_call(ks, aten.full.default) and _is_call(ke, aten.full.default)):
        return False
    return _same_int(ks.args[1], 0) and statically_known_true(_val(ke.args[1]) == width)


def _indexer_of_topk(topk: Node, expr: set, anchor: Node) -> Optional[Node]:
    """The dsa.indexer_logits under a torch.topk when its window is provably the whole row (so the
    top-k's absolute columns are indexer_topk's relative indices, and no -inf position can be
    picked) and the logits die with the expression; else None."""
    logits = topk.args[0]
    if not _is_call(logits, dsa.indexer_logits.default) or len(logits.users) != 1:
        return None
    q, kv, _, _, ks, ke = logits.args[:6]
    lv = _tensor(logits, 2, (torch.float32,))
    precise = _arg(logits, 7, "precise", False)
    if lv is None or not isinstance(precise, bool) or not _full_window(ks, ke, lv.shape[1]):
        return None
    return logits


def _torch_topk_k_fits(topk: Node) -> bool:
    """k <= the row width (torch.topk raises otherwise; dsa ops would pad with -1). Known from
    torch.topk's own shape check under dynamic shapes; a hint-judged case is guarded."""
    kv, w = _val(topk.args[1]), _val(topk.args[0]).shape[1]
    if statically_known_true(kv <= w):
        return True
    c = kv <= w
    return bool(guard_bool(c)) if isinstance(c, torch.SymBool) else bool(c)


def _plan_mapping(match: Match, guard: Optional[str]) -> Optional[dict]:
    kw = match.kwargs
    anchor = match.output_node()
    out = _tensor(anchor, 2, INDEX_DTYPES)
    P = _pow2(kw["P"])
    if out is None or P is None:
        return None
    expr = set(match.nodes)
    # The pattern matcher ignores keywords a pattern does not list: refuse add(page * P, off, alpha=2).
    if any(_is_call(n, aten.add.Tensor) and n.kwargs.get("alpha", 1) != 1 for n in expr):
        return None
    # The offset: [casts] idx % P, with the P of the product.
    off = _strip(kw["off"], clamps=False, seen=expr)
    if not (_is_call(off, aten.remainder.Scalar) and _same_int(off.args[1], kw["P"])):
        return None
    expr.add(off)
    rows = out.shape[0]
    look = _page_lookup(kw["page"], rows, expr)
    if look is None:
        return None
    # The page slot: [cast] floor(idx / P), idx possibly cast or clamped at 0.
    div = _strip(look["slot"], clamps=False, seen=expr)
    if not (_is_call(div, aten.div.Tensor_mode) and div.kwargs.get("rounding_mode") == "floor"
            and len(div.args) == 2 and _same_int(div.args[1], kw["P"])):
        return None
    expr.add(div)
    root = _strip(div.args[0], clamps=True, seen=expr)
    if _strip(off.args[0], clamps=True, seen=expr) is not root:
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
    plan = dict(anchor=anchor, root=root, P=kw["P"], page_table=look["page_table"],
                row_to_batch=look["row_to_batch"], out_dtype=out.dtype)
    topk = _torch_topk_of(root)
    # Pattern 2, torch form: indices are >= 0 (no guard needed), and the topk must die with the
    # expression, else the top-k would run twice. nan_first=True is torch.topk's order.
    if (topk is not None and _pass.config.rewrite_torch_topk and _torch_topk_exact(topk)
            and _dies_with(topk, expr | _torch_topk_chain(root), anchor) and _torch_topk_k_fits(topk)):
        logits = _indexer_of_topk(topk, expr, anchor)
        if logits is not None:
            return dict(plan, kind="torch_topk_indexer", topk=topk, logits=logits)
        return dict(plan, kind="torch_topk", topk=topk)
    if rv.dtype != torch.int32 or guard is None:
        # Pattern 3 is for int32 indices; without the where(idx < 0, -1, ..) guard a negative index
        # maps to a real slot in torch and to -1 in dsa.
        return None
    return dict(plan, kind="indices")


def _indexer_topk_fn(logits: Node, k: int, page_size: int) -> tuple[Callable, dict]:
    """The replacement of a whole-row torch.topk over dsa.indexer_logits (nan_first: torch's order),
    and its node inputs (q, kv, kv_scale, weights, ks, ke)."""
    q, kv, kv_scale, weights, ks, ke = logits.args[:6]
    precise = _arg(logits, 7, "precise", False)

    def fn(q, kv, weights, ks, ke, kv_scale=None, page_table=None, row_to_batch=None):
        return dsa.indexer_topk(q, kv, kv_scale, weights, ks, ke, k, precise=precise, page_table=page_table,
                                page_size=page_size, row_to_batch=row_to_batch, nan_first=True)[0]

    inputs = dict(q=q, kv=kv, weights=weights, ks=ks, ke=ke, kv_scale=kv_scale)
    return fn, inputs


def _rewrite_mapping(match: Match, form: str, guard: Optional[str]) -> None:
    plan = _plan_mapping(match, guard)
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
    if plan["kind"] == "torch_topk_indexer":
        inner, inputs = _indexer_topk_fn(plan["logits"], k, P)

        def fn_indexer(page_table, row_to_batch=None, **kw):
            rtb = None if row_to_batch is None else row_to_batch.to(torch.int32)
            return _dtype_as(inner(page_table=page_table, row_to_batch=rtb, **kw), out_dtype)

        _replace(match, fn_indexer, page_table=plan["page_table"], row_to_batch=plan["row_to_batch"], **inputs)
        _count(f"indexer_topk/logits+torch.topk+{form}")
        return

    def fn(scores, page_table, row_to_batch=None):
        rows, width = scores.shape
        full_rows = torch.full((rows,), width, dtype=torch.int32, device=scores.device)
        rtb = None if row_to_batch is None else row_to_batch.to(torch.int32)
        out = dsa.topk_page_table_transform(scores, page_table, full_rows, k, row_to_batch=rtb, page_size=P,
                                            nan_first=True)
        return _dtype_as(out, out_dtype)

    _replace(match, fn, scores=topk.args[0], page_table=plan["page_table"], row_to_batch=plan["row_to_batch"])
    _count(f"topk_page_table_transform/torch.topk+{form}")


def _plan_bare_indexer_topk(match: Match) -> Optional[dict]:
    """torch.topk(dsa.indexer_logits(..) over whole rows, k, sorted=False).indices with no mapping after
    it (stage A took the mapped forms) -> dsa.indexer_topk(nan_first=True), cast to int64."""
    idx = match.output_node()
    topk = idx.args[0]
    if not (_pass.config.rewrite_torch_topk and _is_call(topk, aten.topk.default) and _torch_topk_exact(topk)
            and _torch_topk_k_fits(topk)):
        return None
    logits = _indexer_of_topk(topk, {idx}, idx)
    return None if logits is None else dict(topk=topk, logits=logits)


def _rewrite_bare_indexer_topk(match: Match) -> None:
    plan = _plan_bare_indexer_topk(match)
    inner, inputs = _indexer_topk_fn(plan["logits"], _static_int(plan["topk"].args[1]), 64)

    def fn(**kw):
        return inner(**kw).to(torch.int64)  # torch.topk's index dtype

    _replace(match, fn, **inputs)
    _count("indexer_topk/logits+torch.topk")


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
                        row_starts=KeywordArg("ks"), deterministic=False, nan_first=KeywordArg("nan_first"))


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
            and isinstance(match.kwargs["precise"], bool) and isinstance(match.kwargs["nan_first"], bool))


def _rewrite_indexer(match: Match, paged: bool) -> None:
    kw = match.kwargs
    page = dict(page_table=kw["page_table"], row_to_batch=kw["row_to_batch"],
                page_table_row_starts=kw["page_table_row_starts"]) if paged else {}
    page_size = kw["page_size"] if paged else 64
    k = _static_int(kw["k"])
    precise, nan_first = kw["precise"], kw["nan_first"]  # Python bools (_plain_lengths checked them)

    def fn(q, kv, kv_scale, weights, ks, ke, page_table=None, row_to_batch=None, page_table_row_starts=None):
        return dsa.indexer_topk(q, kv, kv_scale, weights, ks, ke, k, precise=precise, page_table=page_table,
                                page_size=page_size, row_to_batch=row_to_batch,
                                page_table_row_starts=page_table_row_starts, nan_first=nan_first)[0]

    _replace(match, fn, q=kw["q"], kv=kw["kv"], kv_scale=kw["kv_scale"], weights=kw["weights"], ks=kw["ks"],
             ke=kw["ke"], **page)
    _count("indexer_topk/logits+topk" + ("+page_table_transform" if paged else ""))


def _topk_window_ok(match: Match) -> bool:
    # topk_page_table_transform needs explicit lengths: lengths=None is the full row only without
    # row_starts (with them, W - row_starts could overflow int32 where dsa.topk computes in int64).
    kw = match.kwargs
    return (kw["lengths"] is not None or kw["row_starts"] is None) and isinstance(kw["nan_first"], bool)


def _rewrite_topk_mapped(match: Match) -> None:
    kw = match.kwargs
    k, page_size, det, nan_first = kw["k"], kw["page_size"], kw["deterministic"], kw["nan_first"]

    def fn(scores, page_table, lengths=None, row_starts=None, row_to_batch=None, page_table_row_starts=None):
        if lengths is None:
            lengths = torch.full((scores.shape[0],), scores.shape[1], dtype=torch.int32, device=scores.device)
        # deterministic is forwarded: ascending relative indices map to slots in the same order.
        return dsa.topk_page_table_transform(scores, page_table, lengths, k, row_starts=row_starts,
                                             page_table_row_starts=page_table_row_starts,
                                             row_to_batch=row_to_batch, page_size=page_size,
                                             deterministic=det, nan_first=nan_first)

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


def _register_mapping(stage: PatternMatcherPass, swapped: bool, guard: Optional[str]) -> None:
    arith = _arith(swapped)
    pattern = arith if guard is None else _guarded(arith, guard)
    form = "arith" + ("+swapped" if swapped else "") + (f"+where_{guard}" if guard else "")

    def plan_mapping(m):
        return _plan_mapping(m, guard) is not None

    def handler(m, *_, **__):
        _rewrite_mapping(m, form, guard)

    register_graph_pattern(pattern, extra_check=_safe(plan_mapping), pass_dict=stage)(handler)


def _register() -> None:
    # Stage A: one pattern per operand order and guard; the table access and the casts are read by
    # _plan_mapping. Guarded forms first: their where() is part of what gets replaced.
    mapping = PatternMatcherPass(pass_name="dsa_page_table_arith")
    for guard in ("lt", "ge", None):
        for swapped in (False, True):
            _register_mapping(mapping, swapped, guard)
    # A whole-row torch.topk over the indexer's logits with no mapping after it.
    bare = PatternMatcherPass(pass_name="dsa_indexer_torch_topk")
    register_graph_pattern(CallFunction(operator.getitem, KeywordArg("topk"), 1),
                           extra_check=_safe(lambda m: _plan_bare_indexer_topk(m) is not None),
                           pass_dict=bare)(lambda m, *_, **__: _rewrite_bare_indexer_topk(m))

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
                        deterministic=KeywordArg("deterministic"), nan_first=KeywordArg("nan_first"))
    register_graph_pattern(_mapped(topk), extra_check=_safe(_topk_window_ok), pass_dict=topk_mapped)(
        lambda m, *_, **__: _rewrite_topk_mapped(m))

    _STAGES[:] = [mapping, bare, indexer_paged, indexer, topk_mapped]


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
        if i == 2:
            _canonicalize_dsa_calls(graph)
        n = stage.apply(graph)
        if n:
            # What a rewrite orphaned still counts as a user for the next stage's checks.
            _erase_dead(graph, dead_before)
        total += n
    return total
