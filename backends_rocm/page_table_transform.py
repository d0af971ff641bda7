"""Native HIP provider of dsa.page_table_transform (kernel: kernels/page_table_transform.hip).

The op's Python layer has validated the arguments; this calls torch.ops.dsa_hip.page_table_transform_out
(built on the first call) with them in schema order.
"""

from __future__ import annotations

from typing import Optional

OP = "page_table_transform"
_KERNEL = "page_table_transform_out"
_fn = None  # the loaded kernel's C++ entry point (OpOverload._op: one Python frame less per call)


def run(indices, page_table, row_to_batch, page_table_row_starts, page_size, out) -> None:
    global _fn
    fn = _fn
    if fn is None:
        from . import op

        o = op(_KERNEL, indices.device)
        fn = _fn = getattr(o, "_op", o)
    fn(indices, page_table, row_to_batch, page_table_row_starts, page_size, out)


def supports(indices, page_table, row_to_batch, page_table_row_starts, page_size, out) -> Optional[str]:
    # Any shape, k, page size and alignment; on NVIDIA only when forced.
    from . import forced_reason

    return forced_reason()


def register() -> None:
    from dsa_ops import registry

    from . import available

    registry.register_provider(registry.Provider(OP, "hip", run, supports, available))
