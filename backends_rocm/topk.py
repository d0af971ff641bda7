"""Native HIP providers of the top-k family: dsa.topk, dsa.topk_page_table_transform,
dsa.topk_ragged_transform (kernel: kernels/topk.hip).

All three call one compiled entry, ``torch.ops.dsa_hip.topk_out`` (csrc/topk.cpp):

    topk_out(scores, k, lengths, row_starts, deterministic, page_table, page_table_row_starts,
             row_to_batch, page_size, offsets, out, out_raw, split, workspace, nan_first=False) -> ()

`page_table` selects the page-table form, `offsets` the ragged form, neither the plain top-k. Every
output row comes back in ascending index order, so `deterministic=True` costs nothing extra.
`nan_first` gives NaN the largest key instead of the smallest (kernels/topk.hip, key_of_bits).
`split` (workgroups per row) comes from topk_heuristics.split_factor; the split path's workspace is
allocated here from the shapes only (torch.empty: no sync, graph safe).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import topk_heuristics

INT32_MAX = 2**31 - 1
MAX_WIDTH = INT32_MAX - 16

_fn = None  # the loaded kernel's C++ entry point (OpOverload._op: one Python frame less per call)
_cus: dict = {}


def _kernel(device):
    global _fn
    if _fn is None:
        from . import op

        o = op("topk_out", device)
        _fn = getattr(o, "_op", o)
    return _fn


def _num_cus(device: torch.device) -> int:
    key = device.index if device.index is not None else torch.cuda.current_device()
    n = _cus.get(key)
    if n is None:
        n = _cus[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return n


def _launch(scores, k, lengths, row_starts, page_table, page_table_row_starts, row_to_batch, page_size,
            offsets, out, out_raw, nan_first) -> None:
    rows, width = scores.shape
    split = topk_heuristics.split_factor(rows, width, _num_cus(scores.device))
    ws = None
    if split > 1:
        words = topk_heuristics.workspace_words(rows, split)
        ws = torch.empty(words, dtype=torch.int32, device=scores.device)
    (_fn or _kernel(scores.device))(scores, k, lengths, row_starts, True, page_table, page_table_row_starts,
                                    row_to_batch, page_size, offsets, out, out_raw, split, ws, nan_first)


def _supports(scores: torch.Tensor, k: int) -> Optional[str]:
    why = _forced_reason()
    if why is not None:
        return why
    rows, width = scores.shape
    if width > MAX_WIDTH:
        return f"rows of {width} keys (the HIP kernel takes at most {MAX_WIDTH})"
    if rows > INT32_MAX:
        return f"{rows} rows (the HIP kernel takes at most {INT32_MAX})"
    if k > INT32_MAX:
        return f"k={k} (the HIP kernel takes at most {INT32_MAX})"
    return None


def _forced_reason():
    from . import forced_reason  # the package imports this module: bind on the first call

    global _forced_reason
    _forced_reason = forced_reason
    return forced_reason()


def topk_fn(scores, k, lengths, row_starts, deterministic, nan_first):
    out = torch.empty((scores.shape[0], k), dtype=torch.int32, device=scores.device)
    _launch(scores, k, lengths, row_starts, None, None, None, 64, None, out, None, nan_first)
    return out


def topk_supports(scores, k, lengths, row_starts, deterministic, nan_first):
    return _supports(scores, k)


def page_fn(scores, page_table, lengths, k, row_starts, page_table_row_starts, row_to_batch, page_size,
            deterministic, nan_first, out, out_raw):
    _launch(scores, k, lengths, row_starts, page_table, page_table_row_starts, row_to_batch, page_size, None,
            out, out_raw, nan_first)


def page_supports(scores, page_table, lengths, k, *_):
    return _supports(scores, k)


def ragged_fn(scores, offsets, lengths, k, row_starts, nan_first):
    out = torch.empty((scores.shape[0], k), dtype=torch.int32, device=scores.device)
    _launch(scores, k, lengths, row_starts, None, None, None, 64, offsets, out, None, nan_first)
    return out


def ragged_supports(scores, offsets, lengths, k, row_starts, nan_first):
    return _supports(scores, k)


def register() -> None:
    from dsa_ops import registry

    from . import available

    P = registry.Provider
    registry.register_provider(P("topk", "hip", topk_fn, topk_supports, available))
    registry.register_provider(P("topk_page_table_transform", "hip", page_fn, page_supports, available))
    registry.register_provider(P("topk_ragged_transform", "hip", ragged_fn, ragged_supports, available))
