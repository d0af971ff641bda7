"""CUDA C++ provider of dsa.page_table_transform (kernel: include/dsa_cuda/page_table_transform.cuh).

The op's Python layer has validated the arguments; this calls torch.ops.dsa_cuda.page_table_transform_out
(built on the first call) with them in schema order.
"""

from __future__ import annotations

from typing import Optional

OP = "page_table_transform"
_KERNEL = "page_table_transform_out"
_fn = None  # the loaded OpOverload, resolved on the first call


def run(indices, page_table, row_to_batch, page_table_row_starts, page_size, out) -> None:
    global _fn
    fn = _fn
    if fn is None:
        from . import op

        fn = _fn = op(_KERNEL, indices.device)
    fn(indices, page_table, row_to_batch, page_table_row_starts, page_size, out)


def supports(indices, page_table, row_to_batch, page_table_row_starts, page_size, out) -> Optional[str]:
    # Any shape, k, page size and alignment: the kernel has a scalar path and a 64-bit index path.
    return None


def register() -> None:
    from dsa_ops import registry

    from . import available

    registry.register_provider(registry.Provider(OP, "cuda", run, supports, available))
