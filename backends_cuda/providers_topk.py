"""CUDA C++ providers of the top-k family: dsa.topk, dsa.topk_page_table_transform, dsa.topk_ragged_transform.

All three call one compiled entry, ``torch.ops.dsa_cuda.topk_out`` (csrc/topk.cpp, kernels/topk.cu):

    topk_out(scores, k, lengths, row_starts, deterministic, page_table, page_table_row_starts,
             row_to_batch, page_size, offsets, out, out_raw) -> ()

`page_table` selects the page-table form, `offsets` the ragged form, neither the plain top-k.
`deterministic=True` runs the ordered kernel (kernels/topk.cu: ascending rows, bitwise reproducible);
the default runs the filter kernel (kernels/topk_filter.cu: the same set, in any order, faster).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

INT32_MAX = 2**31 - 1
# The kernel indexes a window with int32 and rounds its parts up to 16 keys.
MAX_WIDTH = INT32_MAX - 16


def _supports(scores: torch.Tensor, k: int) -> Optional[str]:
    rows, width = scores.shape
    if width > MAX_WIDTH:
        return f"rows of {width} keys (the CUDA kernel takes at most {MAX_WIDTH})"
    if rows > INT32_MAX:
        return f"{rows} rows (the CUDA kernel takes at most {INT32_MAX})"
    if k > INT32_MAX:
        return f"k={k} (the CUDA kernel takes at most {INT32_MAX})"
    return None


def _entry(overload):
    """What calling `overload` runs (OpOverload.__call__ only forwards to it): one Python frame less per call."""
    return getattr(overload, "_op", overload)


def register_topk(Provider, register_provider, op: Callable[[str, torch.device], object],
                  available: Callable[[torch.device], Optional[str]]) -> None:
    """Register the three providers with backend "cuda".

    op(name, device) returns the library's OpOverload ``torch.ops.dsa_cuda.<name>.default``, building
    or loading the library on first use; available(device) says why the library cannot run on a
    device (None when it can). Both come from the backend package (backends_cuda/__init__.py).
    """
    entry = None  # topk_out's C++ entry point, resolved on the first call

    def kernel(device):
        nonlocal entry
        if entry is None:
            entry = _entry(op("topk_out", device))
        return entry

    def topk_fn(scores, k, lengths, row_starts, deterministic):
        out = torch.empty((scores.shape[0], k), dtype=torch.int32, device=scores.device)
        (entry or kernel(scores.device))(scores, k, lengths, row_starts, deterministic, None, None, None, 64, None,
                                         out, None)
        return out

    def topk_supports(scores, k, lengths, row_starts, deterministic):
        return _supports(scores, k)

    def page_fn(scores, page_table, lengths, k, row_starts, page_table_row_starts, row_to_batch, page_size,
                deterministic, out, out_raw):
        (entry or kernel(scores.device))(scores, k, lengths, row_starts, deterministic, page_table,
                                         page_table_row_starts, row_to_batch, page_size, None, out, out_raw)

    def page_supports(scores, page_table, lengths, k, *_):
        return _supports(scores, k)

    def ragged_fn(scores, offsets, lengths, k, row_starts):
        out = torch.empty((scores.shape[0], k), dtype=torch.int32, device=scores.device)
        (entry or kernel(scores.device))(scores, k, lengths, row_starts, True, None, None, None, 64, offsets, out,
                                         None)
        return out

    def ragged_supports(scores, offsets, lengths, k, row_starts):
        return _supports(scores, k)

    register_provider(Provider("topk", "cuda", topk_fn, topk_supports, available))
    register_provider(Provider("topk_page_table_transform", "cuda", page_fn, page_supports, available))
    register_provider(Provider("topk_ragged_transform", "cuda", ragged_fn, ragged_supports, available))


def register() -> None:
    """The backend package's hook: backends_cuda/__init__.py lists this module in _OP_MODULES."""
    from dsa_ops import registry

    from . import available, op

    register_topk(registry.Provider, registry.register_provider, op, available)
