"""dsa.topk: exact top-k of a window of each row.

Ranking: larger score first; equal scores: smaller index first; NaN below every number (above every
number with `nan_first`, torch.topk's order; NaNs tie among themselves); +0.0 equals -0.0. Row r's
window is [row_starts[r], row_starts[r] + lengths[r]) clipped to [0, W); indices are relative to
row_starts[r]. A window of n <= k keys returns 0..n-1 then -1s (with starts inside the row).
"""

from __future__ import annotations

import torch

from .. import _route
from .._checks import (
    SCORE_DTYPES,
    check_flag,
    check_given_int,
    check_int,
    check_shape,
    check_tensor,
    check_unit_last_stride,
    fail,
    optional_int32_rows_ok,
)
from .._define import define_op
from ._common import window_topk

NAME = "topk"
SCHEMA = ("(Tensor scores, int k, *, Tensor? lengths=None, Tensor? row_starts=None, bool deterministic=False, "
          "bool nan_first=False) -> Tensor")


def scores_and_windows_ok(scores, k, lengths, row_starts) -> bool:
    """Fast path of check_scores_and_windows: True only when it would pass (see _checks)."""
    return (type(scores) is torch.Tensor and type(k) is int and k >= 1 and scores.dtype in SCORE_DTYPES
            and scores.dim() == 2 and (scores.stride(-1) == 1 or scores.shape[-1] <= 1)
            and ((lengths is None and row_starts is None)
                 or optional_int32_rows_ok(lengths, row_starts, scores.shape[0], scores.device)))


def check_scores_and_windows(op, scores, k, lengths, row_starts):
    """Shared by every op of the top-k family."""
    if scores_and_windows_ok(scores, k, lengths, row_starts):
        return
    check_tensor(op, "scores", scores, dtypes=SCORE_DTYPES, dim=2)
    check_unit_last_stride(op, "scores", scores)
    check_int(op, "k", k, lo=1)
    for name, t in (("lengths", lengths), ("row_starts", row_starts)):
        check_tensor(op, name, t, dtypes=torch.int32, dim=1, device_like=scores, optional=True)
        if t is not None:
            check_shape(op, name, t, (scores.shape[0],))


def check_nan_first(op, nan_first):
    """`nan_first` picks the key of NaN in the kernels: a bool, never None or a tensor read as one."""
    if nan_first is not False and nan_first is not True:
        fail(op, f"`nan_first` must be a bool, got {type(nan_first).__name__} {nan_first!r}")


def validate(scores, k, lengths, row_starts, deterministic, nan_first):
    check_scores_and_windows(NAME, scores, k, lengths, row_starts)
    check_nan_first(NAME, nan_first)


def reference(scores, k, lengths, row_starts, deterministic, nan_first=False):
    # Ascending indices satisfy both deterministic=True and the unspecified order of False.
    return window_topk(scores, k, lengths, row_starts, nan_first)


def fake(scores, k, lengths, row_starts, deterministic, nan_first):
    return scores.new_empty((scores.shape[0], k), dtype=torch.int32)


OP = define_op(NAME, SCHEMA, validate=validate, reference=reference, fake=fake, compiled_cuda=True)
_OP = torch.ops.dsa.topk.default


def topk(
    scores: torch.Tensor,
    k: int,
    *,
    lengths: torch.Tensor | None = None,
    row_starts: torch.Tensor | None = None,
    deterministic: bool = False,
    nan_first: bool = False,
) -> torch.Tensor:
    """Exact top-k indices of each row's window.

    Args:
        scores: [R, W] float32, bfloat16 or float16; unit last stride, any row stride.
        k: number of indices per row (>= 1).
        lengths: int32 [R], window lengths (default: to the row end); negative means empty.
        row_starts: int32 [R], window starts (default 0); indices are relative to them.
        deterministic: return each row's indices in ascending order (bitwise reproducible).
        nan_first: rank NaN above every number, as torch.topk does (default: below every number).
            NaNs tie among themselves: the smaller index first.

    Returns:
        int32 [R, k]: the true top-k under the ranking (larger first, ties to the smaller index,
        NaN last or first, +0.0 == -0.0), -1 where the window holds fewer than k keys.
    """
    try:
        if (lengths is None and row_starts is None and deterministic is False and nan_first is False
                and type(k) is int):
            return _OP(scores, k)  # the same call: arguments at their defaults are cheaper left out
        # torch's argument parser would read None or 0 as False, and True or a 0-d tensor as an int
        check_given_int(NAME, "k", k)
        check_flag(NAME, "deterministic", deterministic)
        check_nan_first(NAME, nan_first)
        return _OP(scores, k, lengths=lengths, row_starts=row_starts, deterministic=deterministic,
                   nan_first=nan_first)
    except RuntimeError as e:  # the router's own error behind the CUDA kernel's copy (see _route)
        raise _route.original(e) from None
