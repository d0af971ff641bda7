"""CPU tests of the SM100 (tcgen05) sparse_mla_decode kernel's host side and compile gate.

The kernel is compiled, not run (no Blackwell GPU): the provider declines it on compute capability 10.x
unless the cuda backend is forced, and the compile gate must build it with its body, without spills or
stack, for sm_100a and sm_107a. The real compiles are marked `gates` (they need nvcc 13.5:
scripts/install_toolchains.sh).
"""

from __future__ import annotations

import pytest
import torch
from dsa_ops import gates, registry
from dsa_ops.backends.cuda import providers_sparse_mla_decode as pm

SM100_KERNEL = "_ZN8dsa_cuda16sm100_mla_decode24sparse_mla_decode_kernelILb0ELb0EEEvNS_15smxx_mla_decode10KernelArgsE"


def _args(b=2, s_q=1, h=64, topk=128, nb=4, page=64):
    q = torch.zeros(b, s_q, h, 576, dtype=torch.bfloat16)
    cache = torch.zeros(nb, page, 1, 656, dtype=torch.uint8)
    idx = torch.zeros(b, s_q, topk, dtype=torch.int32)
    return q, cache, idx


@pytest.mark.parametrize("cap,forced,serves", [
    ((9, 0), None, True),
    ((9, 0), "triton", True),  # the registry never asks a provider of another forced backend
    ((10, 0), None, False),
    ((10, 0), "triton", False),
    ((10, 0), "cuda", True),
    ((10, 3), "cuda", True),
    ((10, 7), None, False),
    ((10, 7), "cuda", True),
    ((12, 0), "cuda", False),
    ((8, 9), "cuda", False),
])
def test_unsupported_arch(cap, forced, serves):
    why = pm.unsupported_arch(cap, forced)
    assert (why is None) == serves, why
    if cap[0] == 10 and not serves:
        assert "compiled, not run" in why and "forced" in why, why
    if cap[0] not in (9, 10):
        assert f"{cap[0]}.{cap[1]}" in why, why


def test_supports_on_a_fake_sm100_device(monkeypatch):
    q, cache, idx = _args()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(pm, "capability", lambda index: (10, 0))
    why = pm.supports(q, cache, idx, 0.1)
    assert why is not None and "compiled, not run" in why, why
    with registry.use_backend("cuda"):
        assert pm.supports(q, cache, idx, 0.1) is None
        bad = pm.supports(*_args(h=96)[:1], cache, idx, 0.1)  # the shape limits still apply when forced
        assert bad is not None and "96 heads" in bad, bad
    monkeypatch.setattr(pm, "capability", lambda index: (9, 0))
    assert pm.supports(q, cache, idx, 0.1) is None


def _ptxas(name: str, target: str, regs: int) -> str:
    return (f"ptxas info    : Compiling entry function '{name}' for '{target}'\n"
            f"ptxas info    : Function properties for {name}\n"
            "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
            f"ptxas info    : Used {regs} registers, used 4 barriers\n")


@pytest.mark.parametrize("target", ["sm_100a", gates.SM107])
def test_required_body(target):
    ok = gates.GateResult("sparse_mla_decode.cu", target, "nvcc 13.5",
                          kernels=gates.parse_ptxas(_ptxas(SM100_KERNEL, target, 152)))
    gates.check_required_bodies(ok)
    assert ok.ok

    stub = gates.GateResult("sparse_mla_decode.cu", target, "nvcc 13.5",
                            kernels=gates.parse_ptxas(_ptxas(SM100_KERNEL, target, 4)))
    gates.check_required_bodies(stub)
    assert not stub.ok and "compiled without its body" in stub.kernels[0].problems[0]

    missing = gates.GateResult("sparse_mla_decode.cu", target, "nvcc 13.5",
                               kernels=gates.parse_ptxas(_ptxas("_Z5otherv", target, 152)))
    gates.check_required_bodies(missing)
    assert not missing.ok and "required" in missing.error

    other = gates.GateResult("topk.cu", target, "nvcc 13.5", kernels=gates.parse_ptxas(_ptxas("_Z1kv", target, 4)))
    gates.check_required_bodies(other)
    assert other.ok


@pytest.mark.gates
@pytest.mark.parametrize("target,release", [t for t in gates.CUDA_TARGETS])
def test_sparse_mla_decode_gate(target, release, tmp_path):
    root = gates._package_dir("dsa_ops.backends.cuda")
    r = gates.cuda_job(root / "kernels" / "sparse_mla_decode.cu", root / "include", target, release, tmp_path)
    assert r.ok, (r.error, [(k.name, k.problems) for k in r.kernels])
    decode = [k for k in r.kernels if k.entry and "sparse_mla_decode_kernel" in k.name]
    arch = "sm90" if target == "sm_90a" else "sm100"
    bodies = [k for k in decode if f"{arch}_mla_decode" in k.name]
    assert len(bodies) == 4  # v32 / v4 x single pass / split
    for k in bodies:
        assert k.registers >= 64 and k.stack == 0 and k.spill_stores == 0 and k.spill_loads == 0, k


def test_variant_rule():
    """The SM90 three-role kernel with the lean producer (variant 3) at every shape; the SM100 family: 0. Split
    counts: the CTAs within half a wave, or within one wave when half leaves a split more than FEW_TILES tiles; at
    least MIN_SPLIT_TOKENS positions a split."""
    assert pm.variant_for((9, 0)) == 3
    assert pm.variant_for((10, 0)) == 0
    assert pm.split_count(1, 1, 64, 2048) == 16
    assert pm.split_count(4, 1, 64, 2048) == 16  # 64 CTAs of 2 tiles
    assert pm.split_count(4, 1, 128, 2048) == 8  # 64 CTAs of 4 tiles, not 128 of 2
    assert pm.split_count(8, 1, 128, 2048) == 8  # 128 CTAs of 4 tiles, not 64 of 8
    assert pm.split_count(32, 1, 64, 2048) == 4
    assert pm.split_count(128, 1, 64, 2048) == 1
    assert pm.split_count(1, 1, 64, 100) == 1
