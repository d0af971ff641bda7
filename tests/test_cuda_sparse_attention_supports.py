"""CPU tests of the CUDA sparse_attention provider's host side and the op's shape rule: which shapes the
provider declines and why, its split counts, and which backend the automatic choice names first.

The kernel runs only on the H200 (tests/test_gpu_sparse_attention_cuda.py); these decisions are plain shape
and stride arithmetic, checked here on CPU tensors so CI sees them.
"""

from __future__ import annotations

import pytest
import torch
from dsa_ops import registry
from dsa_ops.backends.cuda import providers_sparse_attention as psa

FP8 = torch.float8_e4m3fn


def _args(rows=4, hq=24, hkv=2, d=128, dv=128, dtype=FP8, q_offset=0):
    qf = torch.zeros(rows * hq * d + q_offset, dtype=torch.bfloat16)
    q = qf[q_offset:].view(rows, hq, d)
    kc = torch.zeros((10, 64, hkv, d), dtype=dtype)
    vc = torch.zeros((10, 64, hkv, dv), dtype=dtype)
    idx = torch.zeros((rows, 2048), dtype=torch.int32)
    bt = torch.zeros((3, 1024), dtype=torch.int32)
    return q, kc, vc, idx, bt


def test_accepts_the_serving_shapes():
    for hq, hkv in ((24, 2), (16, 1), (64, 8), (8, 8)):
        assert psa.unsupported_shape(*_args(hq=hq, hkv=hkv)) is None


@pytest.mark.parametrize("kw,why", [
    ({"dtype": torch.bfloat16}, "fp8"),
    ({"d": 64, "dv": 64}, "head dims 64"),
    ({"hq": 64, "hkv": 2}, "32 a KV head"),
    ({"q_offset": 4}, "q's data"),
])
def test_declines_with_a_reason(kw, why):
    reason = psa.unsupported_shape(*_args(**kw))
    assert reason is not None
    if why == "32 a KV head":
        assert "64 query heads over 2 KV heads" in reason
    else:
        assert why in reason


def test_cache_strides_must_allow_16_byte_copies():
    q, kc, vc, idx, bt = _args()
    odd = torch.zeros((10, 64, 2, 136), dtype=FP8)[..., :128]  # rows 136 bytes apart: not 16-byte multiples
    assert "k_cache" in psa.unsupported_shape(q, odd, vc, idx, bt)


def test_split_counts():
    """One CTA an SM or more: the single pass; fewer: splits up to 8, each at least a step a warp."""
    assert psa.split_count(64, 2, 2048) == 1
    assert psa.split_count(4096, 2, 2048) == 1
    assert psa.split_count(32, 2, 2048) == 2
    assert psa.split_count(16, 2, 2048) == 4
    assert psa.split_count(1, 2, 2048) == 8
    assert psa.split_count(1, 2, 100) == 1  # 7 steps: fewer than one a warp in a second split
    assert psa.split_count(1, 2, 0) == 1


@pytest.mark.parametrize("kw", [dict(warps=8), dict(warps=2), dict(splits=0), dict(whole=-1)])
def test_launch_refuses_forced_values_it_cannot_take(kw):
    """Forced `splits`, `whole` and `warps` are checked before the kernel library is looked up (CPU here)."""
    q, kc, vc, idx, bt = _args(rows=2)
    t2r = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="`warps` 0, 4 or 16"):
        psa.launch(q, kc, vc, idx, bt, t2r, 1.0, 1.0, 1.0, torch.empty_like(q), **kw)


def test_arch_rule():
    assert psa.unsupported_arch((9, 0), None) is None
    assert "compiled" in psa.unsupported_arch((10, 0), None)
    assert psa.unsupported_arch((10, 0), "cuda") is None
    assert psa.unsupported_arch((8, 0), None) is not None


@pytest.mark.parametrize("capturing", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_preference_names_triton_for_the_fewest_rows_in_a_warmed_capture(monkeypatch, capturing, compiled):
    """Triton's split-K path goes first only inside a CUDA-graph capture, for rows x KV heads < 64, and only once
    its kernels are compiled (no JIT inside a capture); eager calls keep the order (CUDA: less host time)."""
    import importlib

    op_module = importlib.import_module("dsa_ops.ops.sparse_attention")
    monkeypatch.setattr(op_module, "_capturing", lambda: capturing)
    monkeypatch.setattr(op_module, "_triton_split_compiled", lambda *a: compiled)
    for rows, fits in ((1, True), (31, True), (32, False)):
        q, kc, vc, idx, bt = _args(rows=rows)
        t2r = torch.zeros(rows, dtype=torch.int32)
        want = "triton" if fits and capturing and compiled else None
        assert registry.preferred_backend("sparse_attention", (q, kc, vc, idx, bt, t2r, 1.0, 1.0, 1.0)) == want


def test_split_plan(monkeypatch):
    """The split tail only for a tail of at most TAIL_MAX_SHARE of a wave of slots (4 CTAs an SM) past one full
    wave, for shapes the persistent grid would take; its workspace holds the split items only. One split from
    WIDE_MIN_ITEMS items to one an SM."""
    monkeypatch.setattr(psa, "TAIL_SPLITS", 4)
    monkeypatch.setattr(psa, "TAIL_MAX_SHARE", 0.25)
    assert psa.split_plan(300, 2, 2048, 132) == (4, 528)  # 72 items past the wave
    assert psa.split_plan(330, 2, 2048, 132) == (4, 528)  # 132: a quarter
    assert psa.split_plan(331, 2, 2048, 132) == (1, 0)
    assert psa.split_plan(264, 2, 2048, 132) == (1, 0)  # exactly one wave
    assert psa.split_plan(300, 2, 300, 132) == (1, 0)  # 19 steps: one CTA a unit already
    assert psa.split_plan(16, 2, 2048, 132) == (4, 0)  # the few-rows split path
    assert psa.split_plan(32, 2, 2048, 132) == (1, 0)  # 64 items to one an SM: one split (16-warp CTAs)
    assert psa.split_plan(66, 2, 2048, 132) == (1, 0)
    assert psa.split_plan(40, 2, 2048, 78) == (2, 0)  # 80 items past 78 SMs: the 4-warp split rule
    monkeypatch.setattr(psa, "TAIL_SPLITS", None)
    assert psa.split_plan(300, 2, 2048, 132) == (1, 0)
    assert psa.workspace_floats(300, 2, 4, 528) == 72 * 4 * 16 * 130
    assert psa.workspace_floats(300, 2, 4, 10**6) == 0
    assert psa.workspace_floats(300, 2, 1, 0) == 0
