"""dsa.topk_page_table_transform: top-k of each window mapped through a page table in one op.

    out[r, j] = page_table[b, ps + i // P] * P + i % P

with i the relative top-k index, b = row_to_batch[r] (or r), ps = page_table_row_starts[r] (or 0); -1
stays -1 and an out-of-range page slot or negative page entry gives -1. `out_raw` receives i.
Ranking as dsa.topk, NaN first with `nan_first`. FlashInfer's top_k_page_table_transform contract.
"""

from __future__ import annotations

import torch

from .. import _route
from .._checks import (
    check_flag,
    check_given_int,
    check_int,
    check_out,
    check_out_alone,
    check_shape,
    check_tensor,
    check_unit_last_stride,
    int32_table_ok,
    optional_int32_rows_ok,
    out_ok,
    pow2_ok,
)
from .._define import OutForm, define_op, given
from ._common import map_through_page_table, window_topk
from .topk import check_nan_first, check_scores_and_windows, scores_and_windows_ok

NAME = "topk_page_table_transform"
_ARGS = (
    "(Tensor scores, Tensor page_table, Tensor lengths, int k, *, Tensor? row_starts=None, "
    "Tensor? page_table_row_starts=None, Tensor? row_to_batch=None, int page_size=64, bool deterministic=False, "
    "bool nan_first=False"
)


def validate(scores, page_table, lengths, k, row_starts, page_table_row_starts, row_to_batch, page_size,
             deterministic, nan_first):
    check_nan_first(NAME, nan_first)
    if (lengths is not None and pow2_ok(page_size) and scores_and_windows_ok(scores, k, lengths, row_starts)
            and int32_table_ok(page_table, scores.device)
            and optional_int32_rows_ok(page_table_row_starts, row_to_batch, scores.shape[0], scores.device)):
        return
    check_scores_and_windows(NAME, scores, k, lengths, row_starts)
    check_tensor(NAME, "lengths", lengths)
    check_tensor(NAME, "page_table", page_table, dtypes=torch.int32, dim=2, device_like=scores)
    check_unit_last_stride(NAME, "page_table", page_table)
    for name, t in (("page_table_row_starts", page_table_row_starts), ("row_to_batch", row_to_batch)):
        check_tensor(NAME, name, t, dtypes=torch.int32, dim=1, device_like=scores, optional=True)
        if t is not None:
            check_shape(NAME, name, t, (scores.shape[0],))
    check_int(NAME, "page_size", page_size, lo=1, pow2=True)


def _both(scores, page_table, lengths, k, row_starts, page_table_row_starts, row_to_batch, page_size, nan_first):
    raw = window_topk(scores, k, lengths, row_starts, nan_first)
    return map_through_page_table(raw, page_table, row_to_batch, page_table_row_starts, page_size), raw


def reference(scores, page_table, lengths, k, row_starts, page_table_row_starts, row_to_batch, page_size,
              deterministic, nan_first=False):
    return _both(scores, page_table, lengths, k, row_starts, page_table_row_starts, row_to_batch, page_size,
                 nan_first)[0]


def fake(scores, page_table, lengths, k, *_):
    return scores.new_empty((scores.shape[0], k), dtype=torch.int32)


def _alloc(scores, page_table, lengths, k, *_):
    return (torch.empty((scores.shape[0], k), dtype=torch.int32, device=scores.device), None)


def _check_outs(*a):
    scores, page_table, lengths, k, row_starts, pt_row_starts, row_to_batch = a[:7]
    out, out_raw = a[-2], a[-1]
    shape, dev = (scores.shape[0], k), scores.device
    if not (out_ok(out, shape, dev) and (out_raw is None or out_ok(out_raw, shape, dev))):
        check_out(NAME, "out", out, (scores.shape[0], k), torch.int32, scores)
        if out_raw is not None:
            check_out(NAME, "out_raw", out_raw, (scores.shape[0], k), torch.int32, scores)
    inputs = (("scores", scores), ("page_table", page_table), ("lengths", lengths), ("row_starts", row_starts),
              ("page_table_row_starts", pt_row_starts), ("row_to_batch", row_to_batch))
    check_out_alone(NAME, "out", out, inputs + (("out_raw", out_raw),))
    if out_raw is not None:
        check_out_alone(NAME, "out_raw", out_raw, inputs)


def _reference_out(*a):
    out, out_raw = a[-2], a[-1]
    mapped, raw = _both(*a[:8], a[9])  # (a[8]: deterministic)
    out.copy_(mapped)
    if out_raw is not None:
        out_raw.copy_(raw)


OP = define_op(
    NAME,
    _ARGS + ") -> Tensor",
    validate=validate,
    reference=reference,
    fake=fake,
    out=OutForm(_ARGS + ", Tensor(a!) out, Tensor(b!)? out_raw=None) -> ()", 2, _alloc, _reference_out,
                _check_outs),
    compiled_cuda=True,
)
_OP, _OUT = torch.ops.dsa.topk_page_table_transform.default, torch.ops.dsa.topk_page_table_transform.out


def topk_page_table_transform(
    scores: torch.Tensor,
    page_table: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    *,
    row_starts: torch.Tensor | None = None,
    page_table_row_starts: torch.Tensor | None = None,
    row_to_batch: torch.Tensor | None = None,
    page_size: int = 64,
    deterministic: bool = False,
    nan_first: bool = False,
    out: torch.Tensor | None = None,
    out_raw: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact top-k of each row's window, mapped to physical KV slots through a page table.

    Args:
        scores: [R, W] float32, bfloat16 or float16, unit last stride.
        page_table: int32 [B, max_pages]; lengths: int32 [R] window lengths.
        k: indices per row. row_starts: int32 [R] window starts (default 0).
        page_table_row_starts: int32 [R] first page-table column per row (default 0).
        row_to_batch: int32 [R] page-table row per score row (default r).
        page_size: a power of two (default 64). deterministic: ascending relative indices.
        nan_first: rank NaN above every number, as torch.topk does (default: below every number).
        out, out_raw: optional int32 [R, k] buffers; `out_raw` receives the relative indices.

    Returns:
        int32 [R, k] physical slots, -1 for missing tokens or unmapped pages.
    """
    check_given_int(NAME, "k", k)  # torch's argument parser would read True or a 0-d tensor as an int
    check_given_int(NAME, "page_size", page_size)
    check_flag(NAME, "deterministic", deterministic)
    args = (scores, page_table, lengths, k)
    kw = given(row_starts=row_starts, page_table_row_starts=page_table_row_starts, row_to_batch=row_to_batch)
    if nan_first is not False:
        check_nan_first(NAME, nan_first)  # torch's argument parser would read None or 0 as False
        kw["nan_first"] = nan_first  # (at its default it is cheaper left out)
    try:
        if out is None and out_raw is None:
            return _OP(*args, **kw, page_size=page_size, deterministic=deterministic)
        if out is None:
            out = torch.empty((scores.shape[0], k), dtype=torch.int32, device=scores.device)
        _OUT(*args, **kw, page_size=page_size, deterministic=deterministic, out=out, out_raw=out_raw)
        return out
    except RuntimeError as e:  # the router's own error behind the CUDA kernel's copy (see _route)
        raise _route.original(e) from None
