"""dsa.indexer_topk's Triton provider on the CPU: registered, and its dense route declines (naming the
missing step) where a forced backend has no provider for one of its two ops. The route's arithmetic is
the two ops' own; the GPU tests (tests/test_gpu_indexer_topk.py) run it on real kernels."""

from __future__ import annotations

import torch


def test_provider_registered():
    from dsa_ops import registry

    assert "triton" in registry.providers("indexer_topk")


def test_no_kernel_of_its_own():
    from dsa_ops.backends.triton import indexer_topk as it

    assert it.GATE_KERNELS == []
    assert not hasattr(it, "launch_fused")


def test_dense_route_declines_without_providers():
    from dsa_ops.backends.triton import indexer_topk as it

    q = torch.empty(4, 64, 128, dtype=torch.float8_e4m3fn, device="meta")
    kv = torch.empty(4096, 128, dtype=torch.float8_e4m3fn, device="meta")
    s = torch.empty(4096, device="meta")
    w = torch.empty(4, 64, device="meta")
    ks = torch.empty(4, dtype=torch.int32, device="meta")
    why = it.supports(q, kv, s, w, ks, ks, 2048, True, False, None, 64, None, None, False)
    assert why is not None and why.startswith("dense route: dsa.indexer_logits has no provider"), why
