"""dsa_ops.backends.triton: portable GPU kernels in Triton (NVIDIA and AMD), one op per file.

This module only registers providers. Without a working `import triton` the providers are still
listed (so `python -m dsa_ops info` says why they are unavailable), and GATE_KERNELS is empty with
IMPORT_ERROR saying why; importing dsa_ops never fails because of Triton.
"""

from __future__ import annotations

from typing import Optional

import torch

IMPORT_ERROR: Optional[str] = None
try:
    from . import page_table_transform as _page_table_transform
except ImportError as e:  # triton missing or broken
    IMPORT_ERROR = f"triton not importable: {e}"
    _page_table_transform = None

# (name, jit_fn, signature, constexprs) of every kernel the compile gates build for each target.
GATE_KERNELS: list = [] if _page_table_transform is None else list(_page_table_transform.GATE_KERNELS)


def available(device: torch.device) -> Optional[str]:
    if IMPORT_ERROR is not None:
        return IMPORT_ERROR
    if device.type != "cuda":  # ROCm builds of torch also report "cuda"
        return f"Triton kernels run on GPU tensors, got a {device.type} tensor"
    return None


def _unavailable(*args, **kwargs):
    raise RuntimeError(f"dsa_ops triton backend: {IMPORT_ERROR}")


def register() -> None:
    from dsa_ops import registry

    m = _page_table_transform
    registry.register_provider(
        registry.Provider(
            "page_table_transform",
            "triton",
            m.launch if m is not None else _unavailable,
            m.supports if m is not None else (lambda *a: IMPORT_ERROR),
            available,
        )
    )
