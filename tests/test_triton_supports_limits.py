"""The Triton providers decline shapes whose int32 index arithmetic would wrap (meta tensors: no memory).

A token's offset inside a cache page and a top-k tile count are int32 in the kernels' hot loops; the page's
own offset, rows and heads are int64. Shapes past those limits are declined with a reason, so the op raises
a DispatchError naming it instead of reading outside the cache.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

META = torch.device("meta")
FP8 = torch.float8_e4m3fn


def _sa(p, topk=16, hkv=1, d=128):
    from dsa_ops.backends.triton import sparse_attention as m

    q = torch.empty(1, 8 * hkv, d, dtype=torch.bfloat16, device=META)
    kc = torch.empty(1, p, hkv, d, dtype=FP8, device=META)
    i32 = dict(dtype=torch.int32, device=META)
    return m.supports(q, kc, kc, torch.empty(1, topk, **i32), torch.empty(1, 1, **i32), torch.empty(1, **i32),
                      1.0, 1.0, 1.0, None)


def test_sparse_attention_page_and_topk_limits():
    assert _sa(p=2**24 - 1) is None  # the last element at 2^31 - 129: every offset fits
    assert "one page spans 2**31 elements" in _sa(p=2**24)
    assert "one page spans 2**31 elements" in _sa(p=2**21 + 1, hkv=8)
    assert _sa(p=64, topk=2**31 - 1025) is None
    assert "top-k" in _sa(p=64, topk=2**31 - 1024)


@pytest.mark.parametrize("layout,bytes_", [("v32", 656), ("v4", 584)])
def test_cache_page_limits(layout, bytes_):
    from dsa_ops.backends.triton import dequant_k_cache_paged as dq
    from dsa_ops.backends.triton import sparse_mla_decode as mla

    slots = torch.empty(4, dtype=torch.int32, device=META)
    for p, ok in ((2**31 // bytes_, True), (2**31 // bytes_ + 1, False)):
        cache = torch.empty(1, p, 1, bytes_, dtype=torch.uint8, device=META)
        assert (dq.supports(cache, slots, layout) is None) == ok, p
        q = torch.empty(1, 1, 64, 576 if layout == "v32" else 512, dtype=torch.bfloat16, device=META)
        idx = torch.empty(1, 1, 16, dtype=torch.int32, device=META)
        why = mla.supports(q, cache, idx, 0.1, layout)
        assert (why is None) == ok, (p, why)
