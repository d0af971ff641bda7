"""dsa.page_table_transform: request-relative token indices -> physical KV slots.

    out[r, j] = page_table[b, ps + i // P] * P + i % P     (i = indices[r, j])

with b = row_to_batch[r] (or r) and ps = page_table_row_starts[r] (or 0). -1 stays -1, and so does
any index whose batch row, page slot or page entry is out of range (negative page entries included):
nothing outside the table is read. `out` may be `indices` itself (in place).
"""

from __future__ import annotations

import torch

from .._checks import (
    check_given_int,
    check_int,
    check_out,
    check_out_alone,
    check_shape,
    check_tensor,
    check_unit_last_stride,
    fail,
    int32_table_ok,
    optional_int32_rows_ok,
    out_ok,
    pow2_ok,
)
from .._define import OutForm, define_op, given
from ._common import map_through_page_table

NAME = "page_table_transform"
_ARGS = (
    "(Tensor indices, Tensor page_table, *, Tensor? row_to_batch=None, "
    "Tensor? page_table_row_starts=None, int page_size=64"
)


def validate(indices, page_table, row_to_batch, page_table_row_starts, page_size):
    if (type(indices) is torch.Tensor and indices.dtype is torch.int32 and indices.dim() == 2
            and indices.is_contiguous() and pow2_ok(page_size) and int32_table_ok(page_table, indices.device)
            and optional_int32_rows_ok(row_to_batch, page_table_row_starts, indices.shape[0], indices.device)):
        return
    check_tensor(NAME, "indices", indices, dtypes=torch.int32, dim=2)
    if not indices.is_contiguous():
        fail(NAME, f"`indices` must be contiguous (one flat grid over its elements), got strides {indices.stride()}")
    check_tensor(NAME, "page_table", page_table, dtypes=torch.int32, dim=2, device_like=indices)
    check_unit_last_stride(NAME, "page_table", page_table)
    rows = indices.shape[0]
    for name, t in (("row_to_batch", row_to_batch), ("page_table_row_starts", page_table_row_starts)):
        check_tensor(NAME, name, t, dtypes=torch.int32, dim=1, device_like=indices, optional=True)
        if t is not None:
            check_shape(NAME, name, t, (rows,))
    check_int(NAME, "page_size", page_size, lo=1, pow2=True)


def reference(indices, page_table, row_to_batch, page_table_row_starts, page_size):
    return map_through_page_table(indices, page_table, row_to_batch, page_table_row_starts, page_size)


def fake(indices, page_table, row_to_batch, page_table_row_starts, page_size):
    return indices.new_empty(indices.shape)


def _alloc(indices, *_):
    return (torch.empty_like(indices, memory_format=torch.contiguous_format),)


def _check_outs(indices, page_table, row_to_batch, page_table_row_starts, page_size, out):
    if not (out_ok(out, indices.shape, indices.device) and out.is_contiguous()):
        check_out(NAME, "out", out, tuple(indices.shape), torch.int32, indices)
        if not out.is_contiguous():
            fail(NAME, f"`out` must be contiguous, got strides {out.stride()}")
    check_out_alone(NAME, "out", out, (("page_table", page_table), ("row_to_batch", row_to_batch),
                                       ("page_table_row_starts", page_table_row_starts)),
                    same_ok=(("indices", indices),))


def _reference_out(indices, page_table, row_to_batch, page_table_row_starts, page_size, out):
    out.copy_(reference(indices, page_table, row_to_batch, page_table_row_starts, page_size))


OP = define_op(
    NAME,
    _ARGS + ") -> Tensor",
    validate=validate,
    reference=reference,
    fake=fake,
    out=OutForm(_ARGS + ", Tensor(a!) out) -> ()", 1, _alloc, _reference_out, _check_outs),
)
_OP, _OUT = torch.ops.dsa.page_table_transform.default, torch.ops.dsa.page_table_transform.out


def page_table_transform(
    indices: torch.Tensor,
    page_table: torch.Tensor,
    *,
    row_to_batch: torch.Tensor | None = None,
    page_table_row_starts: torch.Tensor | None = None,
    page_size: int = 64,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Map request-relative token indices to physical KV-cache slots through a page table.

    Args:
        indices: int32 [R, k], contiguous; -1 means "no token".
        page_table: int32 [B, max_pages], unit last stride, any row stride.
        row_to_batch: int32 [R], the page-table row of each index row (default: row r).
        page_table_row_starts: int32 [R], first page-table column of each row (default 0).
        page_size: tokens per page, a power of two (default 64).
        out: optional int32 [R, k] contiguous buffer; may be `indices` itself.

    Returns:
        int32 [R, k]: ``page_table[b, ps + i // P] * P + i % P``, and -1 wherever the index is
        negative or its batch row, page slot or page entry is out of range.
    """
    if type(page_size) is not int:
        check_given_int(NAME, "page_size", page_size)  # torch's parser would read True or a 0-d tensor as an int
    kw = given(row_to_batch=row_to_batch, page_table_row_starts=page_table_row_starts)
    if out is None:
        return _OP(indices, page_table, **kw, page_size=page_size)
    _OUT(indices, page_table, **kw, page_size=page_size, out=out)
    return out
