"""CUDA C++ provider of dsa.page_table_transform (kernel: include/dsa_cuda/page_table_transform.cuh).

The op's Python layer has validated the arguments; this calls torch.ops.dsa_cuda.page_table_transform_out
(built on the first call) with them in schema order.
"""

from __future__ import annotations

from typing import Optional

OP = "page_table_transform"
_KERNEL = "page_table_transform_out"
_fn = None  # the loaded kernel's C++ entry point, resolved on the first call


def run(indices, page_table, row_to_batch, page_table_row_starts, page_size, out) -> None:
    (_fn or _load(indices.device))(indices, page_table, row_to_batch, page_table_row_starts, page_size, out)


def _load(device):
    global _fn
    from . import op
    from .providers_topk import _entry

    _fn = _entry(op(_KERNEL, device))
    return _fn


def supports(indices, page_table, row_to_batch, page_table_row_starts, page_size, out) -> Optional[str]:
    # Any shape, k, page size and alignment: the kernel has a scalar path and a 64-bit index path.
    return None


def register() -> None:
    from dsa_ops import registry

    from . import available

    registry.register_provider(registry.Provider(OP, "cuda", run, supports, available))
