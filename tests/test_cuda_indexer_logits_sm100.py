"""CPU tests of the SM100 (tcgen05) indexer_logits kernel's host side and compile gate.

The kernel is compiled, not run (no Blackwell GPU): the provider declines it on compute capability 10.x
unless the cuda backend is forced, takes only fp8 operands with precise=False there, and the compile gate
must build it with its body, without spills or stack, for sm_100a and sm_107a. The real compiles are
marked `gates` (they need nvcc 13.5: scripts/install_toolchains.sh).
"""

from __future__ import annotations

import pytest
import torch
from dsa_ops import gates, registry
from dsa_ops.backends.cuda import providers_indexer as pi

SM100_KERNEL = ("_ZN8dsa_cuda13sm100_indexer21indexer_logits_kernelILi64EEEv14CUtensorMap_stS2_"
                "NS_12smxx_indexer10KernelArgsE")
FP8 = torch.float8_e4m3fn


def _args(t=8, n=300, h=64, dtype=FP8):
    q = torch.zeros(t, h, 128, dtype=dtype)
    kv = torch.zeros(n, 128, dtype=dtype)
    s = torch.ones(n) if dtype == FP8 else None
    w = torch.zeros(t, h)
    ks = torch.zeros(t, dtype=torch.int32)
    ke = torch.full((t,), n, dtype=torch.int32)
    return q, kv, s, w, ks, ke


@pytest.mark.parametrize("cap,forced,serves", [
    ((9, 0), None, True),
    ((10, 0), None, False),
    ((10, 0), "triton", False),
    ((10, 0), "cuda", True),
    ((10, 3), "cuda", True),
    ((10, 7), None, False),
    ((12, 0), "cuda", False),
    ((8, 9), "cuda", False),
])
def test_unsupported_arch(cap, forced, serves):
    why = pi.unsupported_arch(cap, forced)
    assert (why is None) == serves, why
    if cap[0] == 10 and not serves:
        assert "compiled, not run" in why and "forced" in why, why
    if cap[0] not in (9, 10):
        assert f"{cap[0]}.{cap[1]}" in why, why


def test_supports_on_a_fake_sm100_device(monkeypatch):
    args = _args()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(pi, "capability", lambda index: (10, 0))
    why = pi.supports(*args, True, False)
    assert why is not None and "compiled, not run" in why, why
    with registry.use_backend("cuda"):
        assert pi.supports(*args, True, False) is None
        why = pi.supports(*args, True, True)  # precise: the SM100 kernel has fp8 MMAs only
        assert why is not None and "precise=False" in why, why
        why = pi.supports(*_args(dtype=torch.bfloat16), True, False)
        assert why is not None and "fp8" in why, why
        q, kv, s, w, ks, ke = args
        overlapping = torch.as_strided(torch.zeros(10000, dtype=FP8), (100, 128), (64, 1))
        why = pi.supports(q, overlapping, s[:100], w, ks, ke, True, False)
        assert why is not None and "128 bytes apart" in why, why
        why = pi.supports(*_args(h=96), True, False)  # the shape limits still apply when forced
        assert why is not None and "96 heads" in why, why
    monkeypatch.setattr(pi, "capability", lambda index: (9, 0))
    assert pi.supports(*args, True, True) is None


def _ptxas(name: str, target: str, regs: int) -> str:
    return (f"ptxas info    : Compiling entry function '{name}' for '{target}'\n"
            f"ptxas info    : Function properties for {name}\n"
            "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
            f"ptxas info    : Used {regs} registers, used 1 barriers\n")


@pytest.mark.parametrize("target", ["sm_100a", gates.SM107])
def test_required_body(target):
    ok = gates.GateResult("indexer_logits.cu", target, "nvcc 13.5",
                          kernels=gates.parse_ptxas(_ptxas(SM100_KERNEL, target, 156)))
    gates.check_required_bodies(ok)
    assert ok.ok

    stub = gates.GateResult("indexer_logits.cu", target, "nvcc 13.5",
                            kernels=gates.parse_ptxas(_ptxas(SM100_KERNEL, target, 4)))
    gates.check_required_bodies(stub)
    assert not stub.ok and "compiled without its body" in stub.kernels[0].problems[0]


@pytest.mark.gates
@pytest.mark.parametrize("target,release", [t for t in gates.CUDA_TARGETS])
def test_indexer_logits_gate(target, release, tmp_path):
    root = gates._package_dir("dsa_ops.backends.cuda")
    r = gates.cuda_job(root / "kernels" / "indexer_logits.cu", root / "include", target, release, tmp_path)
    assert r.ok, (r.error, [(k.name, k.problems) for k in r.kernels])
    if target == "sm_90a":
        return
    bodies = [k for k in r.kernels if k.entry and "13sm100_indexer21indexer_logits_kernel" in k.name]
    assert len(bodies) == 2  # H 64 and H 32
    for k in bodies:
        assert k.registers >= 64 and k.stack == 0 and k.spill_stores == 0 and k.spill_loads == 0, k
