"""dsa.topk_ragged_transform: top-k of each window, shifted by a per-row offset: `i + offsets[r]`.

-1 stays -1; a shifted index that does not fit in int32 gives -1. Ranking as dsa.topk, NaN first with
`nan_first`.
"""

from __future__ import annotations

import torch

from .. import _route
from .._checks import check_given_int, check_shape, check_tensor, int32_rows_ok
from .._define import define_op
from ._common import INT32_MAX, window_topk
from .topk import check_nan_first, check_scores_and_windows, scores_and_windows_ok

NAME = "topk_ragged_transform"
SCHEMA = ("(Tensor scores, Tensor offsets, Tensor lengths, int k, *, Tensor? row_starts=None, "
          "bool nan_first=False) -> Tensor")


def validate(scores, offsets, lengths, k, row_starts, nan_first):
    check_nan_first(NAME, nan_first)
    if (lengths is not None and scores_and_windows_ok(scores, k, lengths, row_starts)
            and int32_rows_ok(offsets, scores.shape[0], scores.device)):
        return
    check_scores_and_windows(NAME, scores, k, lengths, row_starts)
    check_tensor(NAME, "offsets", offsets, dtypes=torch.int32, dim=1, device_like=scores)
    check_shape(NAME, "offsets", offsets, (scores.shape[0],))
    check_tensor(NAME, "lengths", lengths)


def reference(scores, offsets, lengths, k, row_starts, nan_first=False):
    rel = window_topk(scores, k, lengths, row_starts, nan_first).long()
    shifted = rel + offsets.long()[:, None]
    ok = (rel >= 0) & (shifted >= 0) & (shifted <= INT32_MAX)
    return torch.where(ok, shifted, torch.full_like(shifted, -1)).to(torch.int32)


def fake(scores, offsets, lengths, k, row_starts, nan_first):
    return scores.new_empty((scores.shape[0], k), dtype=torch.int32)


OP = define_op(NAME, SCHEMA, validate=validate, reference=reference, fake=fake, compiled_cuda=True)
_OP = torch.ops.dsa.topk_ragged_transform.default


def topk_ragged_transform(
    scores: torch.Tensor,
    offsets: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    *,
    row_starts: torch.Tensor | None = None,
    nan_first: bool = False,
) -> torch.Tensor:
    """Top-k of each row's window (as :func:`dsa_ops.topk`), returned as ``i + offsets[r]``.

    Args:
        scores: [R, W] float32, bfloat16 or float16, unit last stride.
        offsets: int32 [R], added to each selected relative index (e.g. a request's start in a
            ragged KV buffer).
        lengths: int32 [R] window lengths; row_starts: int32 [R] window starts (default 0).
        nan_first: rank NaN above every number, as torch.topk does (default: below every number).

    Returns:
        int32 [R, k]; -1 where the window holds fewer than k keys (or the sum leaves int32). Order
        inside a row is unspecified, as with ``topk(deterministic=False)`` (the CUDA provider runs
        the filter kernel); for ascending indices, add ``offsets`` to ``topk(..., deterministic=True)``.
    """
    try:
        if row_starts is None and nan_first is False and type(k) is int:
            return _OP(scores, offsets, lengths, k)  # the same call: a default is cheaper left out
        check_given_int(NAME, "k", k)  # torch's argument parser would read True or a 0-d tensor as an int
        check_nan_first(NAME, nan_first)  # and None or 0 as False
        return _OP(scores, offsets, lengths, k, row_starts=row_starts, nan_first=nan_first)
    except RuntimeError as e:  # the router's own error behind the CUDA kernel's copy (see _route)
        raise _route.original(e) from None
