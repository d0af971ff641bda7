"""indexer_topk on the GPU: the dense route, dsa.indexer_logits then dsa.topk / topk_page_table_transform.

The result is the set ``topk(indexer_logits(..., precise), k, row_starts=ks, lengths=ke - ks)`` (ranking:
larger first, ties to the smaller key, NaN last or first by `nan_first`), page-mapped when a page table is
given: each step through torch.ops.dsa, so each is served by its own provider and the result is the two
ops' by construction. The [T, N] scores live only inside the call. The route is exact whatever `exact` asks.

A fused Triton path (sampled threshold, filter with slab emission, exact select and rescan) is slower than
this route on every benchmark shape (H200: 20270 against 12625 us at 4096 x 131072, H 64);
docs/design_indexer.md, "Fused indexer_topk in Triton", has the figures and what bounds it.
"""

from __future__ import annotations

from typing import Optional

import torch


def _window_lengths(ks, ke):
    """ke - ks without int32 overflow, clamped to [0, 2**31 - 1] (a negative length is 0). topk's int32 lengths
    cannot say 2**31: a window of more keys ends at ks + 2**31 - 1, which drops one key only, the one whose
    relative index would be 2**31 - 1 (ks = -(2**31 - 1) + c for a column c inside the row)."""
    return (ke.long() - ks.long()).clamp_(0, 2**31 - 1).to(torch.int32)


def launch_dense(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table=None, page_size=64,
                 row_to_batch=None, page_table_row_starts=None, return_scores=False, nan_first=False):
    """The dense route: dsa.indexer_logits, then dsa.topk (or dsa.topk_page_table_transform), each through
    its own provider; the selected scores by a gather. The same result as calling those ops."""
    logits = torch.ops.dsa.indexer_logits(q, kv, kv_scale, weights, ks, ke, clean=True, precise=precise)
    lengths = _window_lengths(ks, ke)
    extra = {"nan_first": True} if nan_first else {}
    t, n = logits.shape
    if page_table is not None and not return_scores:
        out = torch.ops.dsa.topk_page_table_transform(
            logits, page_table, lengths, k, row_starts=ks, page_table_row_starts=page_table_row_starts,
            row_to_batch=row_to_batch, page_size=page_size, **extra)
        return out, logits.new_empty((t, 0))
    rel = torch.ops.dsa.topk(logits, k, lengths=lengths, row_starts=ks, **extra)
    if return_scores:
        col = (rel.long() + ks.long()[:, None]).clamp_(0, max(n - 1, 0))
        picked = logits.gather(1, col) if n else torch.zeros_like(rel, dtype=torch.float32)
        scores = torch.where(rel >= 0, picked, torch.full_like(picked, float("-inf")))
    else:
        scores = logits.new_empty((t, 0))
    if page_table is not None:
        rel = torch.ops.dsa.page_table_transform(rel, page_table, row_to_batch=row_to_batch,
                                                 page_table_row_starts=page_table_row_starts, page_size=page_size)
    return rel, scores


def launch(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table, page_size, row_to_batch,
           page_table_row_starts, return_scores, nan_first=False):
    """Provider fn of dsa.indexer_topk (schema order): the dense route."""
    return launch_dense(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table, page_size, row_to_batch,
                        page_table_row_starts, return_scores, nan_first)


def _schema_args(op: str, **given) -> tuple:
    """Positional arguments of dsa.<op> in schema order: `given` by name, defaults for the rest."""
    schema = getattr(torch.ops.dsa, op).default._schema
    return tuple(given[a.name] if a.name in given else a.default_value for a in schema.arguments)


def _missing_provider(device, steps) -> Optional[str]:
    """Why one of the (op, arguments) steps has no provider on `device` (None when each has one)."""
    from dsa_ops import registry

    for op, args in steps:
        try:
            registry.select_on(op, device, args)
        except registry.DispatchError as e:
            return f"dsa.{op} has no provider for this call: {str(e).splitlines()[1].strip()}"
    return None


def supports(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table, page_size, row_to_batch,
             page_table_row_starts, return_scores, nan_first=False) -> Optional[str]:
    """None when this provider serves the call: the dense route needs providers of dsa.indexer_logits and
    dsa.topk (checked on the shapes, through the registry, so a forced backend without a top-k kernel
    declines here)."""
    t, n = q.shape[0], kv.shape[0]
    scores = torch.empty((t, n), dtype=torch.float32, device="meta")
    steps = [("indexer_logits", _schema_args("indexer_logits", q=q, kv=kv, kv_scale=kv_scale, weights=weights,
                                             ks=ks, ke=ke, clean=True, precise=precise)),
             ("topk", _schema_args("topk", scores=scores, k=k, lengths=ks, row_starts=ks))]
    why = _missing_provider(q.device, steps)
    return None if why is None else f"dense route: {why}"


# No Triton kernel of its own: the compile gates build indexer_logits' and the top-k family's.
GATE_KERNELS: list = []
