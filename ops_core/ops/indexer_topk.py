"""dsa.indexer_topk: the fused DSA indexer: scores and exact top-k without a [T, N] scores tensor.

Equal to ``topk(indexer_logits(..., precise=precise), k, row_starts=ks, lengths=ke - ks)``, then mapped
through the page table when one is given; kernels score in the same mode as dsa.indexer_logits,
bitwise. `exact=False` allows the lossy fast mode in kernels; the reference is always exact. With
`return_scores`, the second output holds the selected scores (-inf at -1 slots); otherwise it is an
empty [T, 0] tensor (the Python API returns None). `nan_first` ranks NaN scores above every number, as
dsa.topk's (torch.topk's order).
"""

from __future__ import annotations

import torch

from .._checks import check_flag, check_given_int, check_int, check_shape, check_tensor, check_unit_last_stride
from .._define import define_op
from ._common import map_through_page_table, window_topk
from .indexer_logits import check_indexer_inputs, check_precise
from .indexer_logits import reference as logits_reference
from .topk import check_nan_first

NAME = "indexer_topk"
SCHEMA = ("(Tensor q, Tensor kv, Tensor? kv_scale, Tensor weights, Tensor ks, Tensor ke, int k, *, "
          "bool exact=True, bool precise=False, Tensor? page_table=None, int page_size=64, Tensor? row_to_batch=None, "
          "Tensor? page_table_row_starts=None, bool return_scores=False, bool nan_first=False) -> (Tensor, Tensor)")


def validate(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table, page_size, row_to_batch,
             page_table_row_starts, return_scores, nan_first):
    check_indexer_inputs(NAME, q, kv, kv_scale, weights, ks, ke)
    check_int(NAME, "k", k, lo=1)
    check_precise(NAME, precise)
    check_nan_first(NAME, nan_first)
    check_tensor(NAME, "page_table", page_table, dtypes=torch.int32, dim=2, device_like=q, optional=True)
    if page_table is not None:
        check_unit_last_stride(NAME, "page_table", page_table)
    check_int(NAME, "page_size", page_size, lo=1, pow2=True)
    for name, t in (("row_to_batch", row_to_batch), ("page_table_row_starts", page_table_row_starts)):
        check_tensor(NAME, name, t, dtypes=torch.int32, dim=1, device_like=q, optional=True)
        if t is not None:
            check_shape(NAME, name, t, (q.shape[0],))


def reference(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table, page_size, row_to_batch,
              page_table_row_starts, return_scores, nan_first):
    logits = logits_reference(q, kv, kv_scale, weights, ks, ke, True, precise)
    rel = window_topk(logits, k, lengths=ke.long() - ks.long(), row_starts=ks, nan_first=nan_first)
    t = q.shape[0]
    if return_scores:
        col = (rel.long() + ks.long()[:, None]).clamp(0, max(kv.shape[0] - 1, 0))
        picked = logits.gather(1, col) if kv.shape[0] else torch.empty_like(rel, dtype=torch.float32)
        scores = torch.where(rel >= 0, picked, torch.full_like(picked, float("-inf")))
    else:
        scores = logits.new_empty((t, 0))
    if page_table is not None:
        rel = map_through_page_table(rel, page_table, row_to_batch, page_table_row_starts, page_size)
    return rel, scores


def fake(q, kv, kv_scale, weights, ks, ke, k, exact, precise, page_table, page_size, row_to_batch,
         page_table_row_starts, return_scores, nan_first):
    t = q.shape[0]
    return (q.new_empty((t, k), dtype=torch.int32),
            q.new_empty((t, k if return_scores else 0), dtype=torch.float32))


OP = define_op(NAME, SCHEMA, validate=validate, reference=reference, fake=fake)


def indexer_topk(q, kv, kv_scale, weights, ks, ke, k: int, *, exact: bool = True, precise: bool = False,
                 page_table=None, page_size: int = 64, row_to_batch=None, page_table_row_starts=None,
                 return_scores: bool = False, nan_first: bool = False):
    """Fused DSA indexer: exact top-k of ``indexer_logits`` per row window, never writing [T, N] scores.

    Args: as :func:`dsa_ops.indexer_logits` (q, kv, kv_scale, weights, ks, ke), plus
        k: keys per row. exact: guarantee the exact top-k (False: kernels may truncate, counted).
        precise: the scoring precision, as in :func:`dsa_ops.indexer_logits` (False, the default: FP8
            tensor-core MMAs, scores within 1e-3 of the row's largest |score|; True: exact fp16 MMAs,
            within 1e-5 of the row norm). The selection is exact for the scores of that mode.
        page_table, page_size, row_to_batch, page_table_row_starts: optional page mapping as in
            :func:`dsa_ops.page_table_transform`.
        return_scores: also return the selected scores.
        nan_first: rank NaN scores above every number, as torch.topk does (default: below every number).

    Returns:
        (int32 [T, k] indices relative to ks (or physical slots with a page table), float32 [T, k]
        scores or None).
    """
    check_precise(NAME, precise)  # torch's argument parser would read None or 0.0 as False
    check_nan_first(NAME, nan_first)
    for name, flag in (("exact", exact), ("return_scores", return_scores)):
        check_flag(NAME, name, flag)
    check_given_int(NAME, "k", k)
    check_given_int(NAME, "page_size", page_size)
    idx, scores = torch.ops.dsa.indexer_topk(
        q, kv, kv_scale, weights, ks, ke, k, exact=exact, precise=precise, page_table=page_table, page_size=page_size,
        row_to_batch=row_to_batch, page_table_row_starts=page_table_row_starts, return_scores=return_scores,
        nan_first=nan_first)
    return idx, (scores if return_scores else None)
