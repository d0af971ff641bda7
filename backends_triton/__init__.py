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
    from . import dequant_k_cache_paged as _dequant_k_cache_paged
    from . import indexer_logits as _indexer_logits
    from . import indexer_topk as _indexer_topk
    from . import page_table_transform as _page_table_transform
    from . import paged_indexer_logits as _paged_indexer_logits
    from . import sparse_attention as _sparse_attention
    from . import sparse_mla_decode as _sparse_mla_decode
except ImportError as e:  # triton missing or broken
    IMPORT_ERROR = f"triton not importable: {e}"
    _page_table_transform = _indexer_logits = _paged_indexer_logits = None
    _sparse_attention = None
    _sparse_mla_decode = None
    _dequant_k_cache_paged = None
    _indexer_topk = None

# op name -> its kernel module (each has launch, supports and GATE_KERNELS)
_MODULES = {
    "page_table_transform": _page_table_transform,
    "indexer_logits": _indexer_logits,
    "paged_indexer_logits": _paged_indexer_logits,
    "sparse_attention": _sparse_attention,
    "sparse_mla_decode": _sparse_mla_decode,
    "dequant_k_cache_paged": _dequant_k_cache_paged,
    "indexer_topk": _indexer_topk,
}

# (name, jit_fn, signature, constexprs[, divisible ints]) of every kernel the compile gates build.
GATE_KERNELS: list = [] if IMPORT_ERROR else [g for m in _MODULES.values() for g in m.GATE_KERNELS]


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

    for op, m in _MODULES.items():
        registry.register_provider(
            registry.Provider(
                op,
                "triton",
                m.launch if m is not None else _unavailable,
                m.supports if m is not None else (lambda *a: IMPORT_ERROR),
                available,
            )
        )
