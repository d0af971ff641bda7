"""The post-grad custom pass object, its cache identity, and installing it into Inductor's config.

Inductor has one slot for a late post-grad pass (``torch._inductor.config.post_grad_custom_post_pass``).
We never take that slot from whoever had it: our pass wraps the previous occupant, runs it first, then
our rewrites, and folds its uuid into ours so the FX graph cache keys stay honest.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Optional

import torch
from torch._inductor import config as inductor_config
from torch._inductor import custom_graph_pass as _cgp

# Newer torch passes `is_inference` to passes of this type; subclassing it lets us hand it on to a
# chained pass that wants it. Older torch only has the plain base.
_InferenceAware = getattr(_cgp, "CustomInferenceAwareGraphPass", None)
_Base = _InferenceAware or _cgp.CustomGraphPass

_HERE = os.path.dirname(os.path.abspath(__file__))
# The files whose text decides what the pass does: any edit gives a new uuid (a new cache key).
_SOURCES = ("__init__.py", "_pass.py", "patterns.py")
_MARK = "_dsa_ops_fusion_pass"  # survives importlib.reload, unlike isinstance


class Config:
    """Switches read at compile time; both are part of the pass's uuid (the FX graph cache key).

    enabled: run our rewrites (a chained pass still runs when False).
    rewrite_torch_topk: rewrite ``torch.topk(scores, k, sorted=False).indices`` + page mapping (and
        over the indexer's logits of whole rows) into the dsa ops' ``nan_first=True`` form, which is
        torch.topk's order, NaN above every number: the same set, ties to the smaller index (torch
        leaves which of equal keys it returns unspecified). On by default; False keeps torch.topk.
    """

    enabled: bool = True
    rewrite_torch_topk: bool = True

    def snapshot(self) -> tuple:
        return (bool(self.enabled), bool(self.rewrite_torch_topk))


config = Config()


# The dsa ops the rewrites match or emit: a cached graph calls them, so their schemas are part of
# what the cached code assumes.
_OPS = ("indexer_logits", "topk", "page_table_transform", "indexer_topk", "topk_page_table_transform")


def _op_schemas() -> tuple:
    return tuple(str(getattr(torch.ops.dsa, name).default._schema) if hasattr(torch.ops.dsa, name) else name
                 for name in _OPS)


def _source_hash() -> str:
    h = hashlib.sha256()
    for name in _SOURCES:
        with open(os.path.join(_HERE, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()


_UNKNOWN = object()


def _uuid_of(p: Any) -> Any:
    """A picklable identity for a (possibly chained) pass, or _UNKNOWN when it has none."""
    if p is None:
        return "none"
    if isinstance(p, (list, tuple)):
        parts = tuple(_uuid_of(x) for x in p)
        return _UNKNOWN if any(x is _UNKNOWN for x in parts) else parts
    if isinstance(p, _cgp.CustomGraphPass):
        u = p.uuid()
        return _UNKNOWN if not u else u
    return _UNKNOWN  # a plain callable: Inductor cannot key its cache on it, so neither can we


def _run(p: Any, graph: torch.fx.Graph, is_inference: Optional[bool]) -> None:
    if p is None:
        return
    if isinstance(p, (list, tuple)):
        for x in p:
            _run(x, graph, is_inference)
    elif _InferenceAware is not None and isinstance(p, _InferenceAware):
        p(graph, is_inference=bool(is_inference))
    else:
        p(graph)


class DsaFusionPass(_Base):
    """Runs the previously installed post-grad pass (if any), then the dsa_ops rewrites."""

    def __init__(self, previous: Any = None):
        self.previous = previous
        setattr(self, _MARK, True)

    def __call__(self, graph: torch.fx.Graph, is_inference: Optional[bool] = None) -> None:
        _run(self.previous, graph, is_inference)
        if config.enabled:
            from . import patterns  # lazy: the pattern matcher costs ~2 s to import

            patterns.rewrite(graph)

    def uuid(self) -> Optional[Any]:
        prev = _uuid_of(self.previous)
        if prev is _UNKNOWN:
            return None  # Inductor then bypasses the FX graph cache, as it would for the bare pass
        return ("dsa_ops.inductor", _source_hash(), _op_schemas(), config.snapshot(), prev)

    def __repr__(self) -> str:
        return f"DsaFusionPass(previous={self.previous!r})"


def _is_ours(p: Any) -> bool:
    return getattr(p, _MARK, False) is True


def installed() -> Optional[DsaFusionPass]:
    """Our pass where it sits in Inductor's slot (directly or in a list there), else None."""
    cur = inductor_config.post_grad_custom_post_pass
    if _is_ours(cur):
        return cur
    if isinstance(cur, (list, tuple)):
        return next((p for p in cur if _is_ours(p)), None)
    return None


def install() -> DsaFusionPass:
    """Install the pass (idempotent): wraps whatever pass is set, never replaces it."""
    p = installed()
    if p is None:
        p = DsaFusionPass(previous=inductor_config.post_grad_custom_post_pass)
        inductor_config.post_grad_custom_post_pass = p
    return p


def uninstall() -> bool:
    """Take our pass out of Inductor's slot, putting back the pass it wrapped.

    Returns False when it is not there (never installed, or wrapped by someone else's pass: then
    use ``config.enabled = False``, which turns the rewrites off wherever the pass sits).
    """
    cur = inductor_config.post_grad_custom_post_pass
    if _is_ours(cur):
        inductor_config.post_grad_custom_post_pass = cur.previous
        return True
    if isinstance(cur, (list, tuple)) and any(_is_ours(p) for p in cur):
        kept = []
        for p in cur:
            prev = p.previous if _is_ours(p) else p
            kept.extend(prev if isinstance(prev, (list, tuple)) else [prev] if prev is not None else [])
        inductor_config.post_grad_custom_post_pass = type(cur)(kept) if kept else None
        return True
    return False
