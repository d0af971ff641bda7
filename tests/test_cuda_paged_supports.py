"""CPU tests of the CUDA paged_indexer_logits provider's host side: which shapes it declines, and why.

The kernel itself runs only on the H200 (tests/test_gpu_indexer_logits.py); what it refuses is decided
by plain shape and stride arithmetic, checked here on CPU tensors so CI sees it.
"""

from __future__ import annotations

import pytest
import torch
from dsa_ops import registry
from dsa_ops.backends.cuda import providers_paged_indexer as ppi

FP8 = torch.float8_e4m3fn


def _args(b=2, next_n=1, h=64, d=128, nb=8, pad=0, q_offset=0):
    q_flat = torch.zeros(b * next_n * h * d + q_offset, dtype=torch.uint8)
    q = q_flat[q_offset:].view(FP8).view(b, next_n, h, d)
    raw = torch.zeros(nb, 64 * (d + 4) + pad, dtype=torch.uint8)
    cache = raw[:, : 64 * (d + 4)].view(nb, 64, 1, d + 4) if pad else raw.view(nb, 64, 1, d + 4)
    return q, cache


def test_accepts_the_decode_shapes():
    for h in (32, 64):
        for next_n in (1, 2, 3, 4):
            q, cache = _args(next_n=next_n, h=h)
            assert ppi.unsupported_shape(q, cache, 65536) is None
    q, cache = _args(pad=64)  # padded pages: a block stride of 8512 bytes is 16-byte aligned
    assert ppi.unsupported_shape(q, cache, 1000) is None


@pytest.mark.parametrize("kw,limit,why", [
    ({"h": 16}, 100, "16 heads"),
    ({"h": 128}, 100, "128 heads"),
    ({"d": 64}, 100, "head dim 64"),
    ({}, 2**31 - 200, "max_context_len"),
    ({}, 2**31 - 383, "max_context_len"),  # the -inf fill's 384-thread stride would wrap int32
    ({"next_n": 1025}, 100, "next_n 1025"),
    ({"q_offset": 8}, 100, "q's data"),
    ({"pad": 4}, 100, "block stride (8452 bytes)"),
])
def test_declines_with_a_reason(kw, limit, why):
    q, cache = _args(**kw)
    reason = ppi.unsupported_shape(q, cache, limit)
    assert reason is not None and why in reason, reason


def test_registered_before_triton():
    import dsa_ops  # noqa: F401  (registers every backend)

    table = registry.providers("paged_indexer_logits")
    assert table["cuda"].supports is ppi.supports and table["cuda"].fn is ppi.run
    assert "triton" in table
    assert registry.AUTO_ORDER.index("cuda") < registry.AUTO_ORDER.index("triton")


def test_producer_warpgroup_config():
    """Config digit 4 (3 math warpgroups fed by a producer warpgroup; the default there) is offered at MMA
    N = 128 only, and in variants() there."""
    assert ppi.make_config(ppi.PRODUCER_WG, ppi.BULK, ppi.BALANCED) == 224
    for h, next_n, offered in ((64, 1, False), (64, 2, True), (64, 3, True), (32, 1, False), (32, 2, False),
                               (32, 3, True), (32, 4, True)):
        assert ppi.producer_warpgroup_offered(h, next_n) is offered
        assert (224 in ppi.variants(next_n, h)) is offered
        assert all(c % 10 != 4 for c in ppi.variants(next_n, h)) is not offered
    assert ppi.variants(2, 64) == [112, 114, 122, 124, 134, 135, 212, 214, 222, 224, 234, 235]
    assert ppi.variants(2, 64, precise=True) == [112, 114, 122, 124, 212, 214, 222, 224]
    with pytest.raises(ValueError, match="math_warpgroups"):
        ppi.make_config(6)


def test_four_warpgroups_config():
    """Config digit 5 (4 math warpgroups fed by a producer warpgroup) is offered at MMA N <= 64 with the
    A-in-registers loaders (at N = 128 with loader TMA only, test_tma_loader_config), and in variants() there."""
    assert ppi.make_config(ppi.FOUR_WGS, ppi.BULK, ppi.BALANCED) == 225
    for h, next_n, offered in ((64, 1, True), (64, 2, False), (32, 1, True), (32, 2, True), (32, 3, False)):
        assert ppi.four_warpgroups_offered(h, next_n) is offered
        assert (225 in ppi.variants(next_n, h)) is offered
        assert any(c % 10 == 5 and c // 10 % 10 != ppi.TMA for c in ppi.variants(next_n, h)) is offered
    assert ppi.variants(1, 64) == [112, 113, 115, 122, 123, 125, 212, 213, 215, 222, 223, 225]


def test_tma_loader_config():
    """Loader TMA (pages as A from shared memory) is offered with a producer warpgroup (3 or 4 math
    warpgroups) at MMA N = 128 in the fp8 mode only."""
    assert ppi.make_config(ppi.FOUR_WGS, ppi.TMA, ppi.BALANCED) == 235
    for h, next_n, offered in ((64, 1, False), (64, 2, True), (32, 2, False), (32, 4, True)):
        assert ppi.tma_offered(h, next_n, False) is offered
        assert not ppi.tma_offered(h, next_n, True)
        tma = [c for c in ppi.variants(next_n, h) if c // 10 % 10 == ppi.TMA]
        assert tma == ([134, 135, 234, 235] if offered else [])
        assert not [c for c in ppi.variants(next_n, h, precise=True) if c // 10 % 10 == ppi.TMA]


def test_default_config_names():
    """default_config mirrors the launcher's resolve (the GPU test test_cuda_paged_default_config checks them
    bitwise); natural_order resolves a config's default loader the same way."""
    assert ppi.default_config(64, 1, False) == ppi.default_config(64, 1, True) == 225
    assert ppi.default_config(32, 2, False) == 225
    assert ppi.default_config(64, 2, False) == ppi.default_config(32, 4, False) == 235
    assert ppi.default_config(64, 2, True) == ppi.default_config(32, 3, True) == 224
    assert ppi.natural_order(0, 64, 2, False) and ppi.natural_order(204, 64, 2, False)
    assert not any(ppi.natural_order(c, 64, 2, False) for c in (224, 2, 3, 202, 212))
    assert not ppi.natural_order(0, 64, 2, True) and not ppi.natural_order(0, 64, 1, False)
    assert not ppi.natural_order(5, 64, 1, False) and ppi.natural_order(5, 64, 2, False)
