"""CUDA C++ providers of the top-k family: dsa.topk, dsa.topk_page_table_transform, dsa.topk_ragged_transform.

All three call one compiled entry, ``torch.ops.dsa_cuda.topk_out`` (csrc/topk.cpp, kernels/topk.cu):

    topk_out(scores, k, lengths, row_starts, deterministic, page_table, page_table_row_starts,
             row_to_batch, page_size, offsets, out, out_raw, nan_first=False) -> ()

`page_table` selects the page-table form, `offsets` the ragged form, neither the plain top-k.
`deterministic=True` runs the ordered kernel (kernels/topk.cu: ascending rows, bitwise reproducible);
the default runs the filter kernel (kernels/topk_filter.cu: the same set, in any order, faster). The
ragged form, which has no order flag, runs the filter kernel. `nan_first` gives NaN the largest key
(common_radix_select.cuh, float_key) in both kernels.

Once the library is loaded, its C++ kernels for the dsa ops' CUDA key (csrc/topk_route.cpp) serve the
calls these providers would, without Python: :func:`start_route` keeps them in step with the registry.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

# The dsa ops whose CUDA key the library's C++ kernels serve (csrc/topk_route.cpp).
ROUTED_OPS = ("topk", "topk_page_table_transform", "topk_ragged_transform")
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
                  available: Callable[[torch.device], Optional[str]]) -> dict:
    """Register the three providers with backend "cuda"; return them by op.

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

    def topk_fn(scores, k, lengths, row_starts, deterministic, nan_first):
        out = torch.empty((scores.shape[0], k), dtype=torch.int32, device=scores.device)
        (entry or kernel(scores.device))(scores, k, lengths, row_starts, deterministic, None, None, None, 64, None,
                                         out, None, nan_first)
        return out

    def topk_supports(scores, k, lengths, row_starts, deterministic, nan_first):
        return _supports(scores, k)

    def page_fn(scores, page_table, lengths, k, row_starts, page_table_row_starts, row_to_batch, page_size,
                deterministic, nan_first, out, out_raw):
        (entry or kernel(scores.device))(scores, k, lengths, row_starts, deterministic, page_table,
                                         page_table_row_starts, row_to_batch, page_size, None, out, out_raw,
                                         nan_first)

    def page_supports(scores, page_table, lengths, k, *_):
        return _supports(scores, k)

    def ragged_fn(scores, offsets, lengths, k, row_starts, nan_first):
        # No order flag in this form, so no order promised: the filter kernel, as topk's default (the
        # ordered kernel took 4x its time at 4096x32768, H200).
        out = torch.empty((scores.shape[0], k), dtype=torch.int32, device=scores.device)
        (entry or kernel(scores.device))(scores, k, lengths, row_starts, False, None, None, None, 64, offsets, out,
                                         None, nan_first)
        return out

    def ragged_supports(scores, offsets, lengths, k, row_starts, nan_first):
        return _supports(scores, k)

    mine = {
        "topk": Provider("topk", "cuda", topk_fn, topk_supports, available),
        "topk_page_table_transform": Provider("topk_page_table_transform", "cuda", page_fn, page_supports, available),
        "topk_ragged_transform": Provider("topk_ragged_transform", "cuda", ragged_fn, ragged_supports, available),
    }
    for p in mine.values():
        register_provider(p)
    return mine


_registered: dict = {}  # op -> the provider register() added: what the C++ kernels stand in for


def route_devices(available: Callable[[torch.device], Optional[str]], device_count: int) -> int:
    """Bit mask of the CUDA devices the providers can run on (bit d: cuda:d), as the C++ kernels take it."""
    return sum(1 << d for d in range(min(device_count, 64)) if available(torch.device("cuda", d)) is None)


def start_route(registry, set_devices: Callable[[int], None], devices: int) -> None:
    """Let the loaded C++ kernels serve `devices` whenever the registry would pick these providers: no
    other backend forced and these very providers registered. Otherwise they serve no device, so each
    call goes to the Python router, which decides as it always did."""

    def sync():
        mine = all(registry.providers(op).get("cuda") is p for op, p in _registered.items())
        set_devices(devices if mine and registry.forced_backend() in (None, "cuda") else 0)

    registry.on_change(sync)


def take_route(registry, ns, available: Callable[[torch.device], Optional[str]]) -> int:
    """After the library's load: start_route on the devices `available` accepts (torch.ops.dsa_cuda `ns`); the
    mask."""
    devices = route_devices(available, torch.cuda.device_count())
    start_route(registry, ns.topk_route_set.default, devices)
    return devices


def register() -> None:
    """The backend package's hook: backends_cuda/__init__.py lists this module in _OP_MODULES."""
    from dsa_ops import registry

    from . import available, op

    _registered.update(register_topk(registry.Provider, registry.register_provider, op, available))
