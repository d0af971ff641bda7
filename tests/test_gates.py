"""Compile gates: the parsers on canned compiler output (everywhere), and the real gates (marked `gates`).

The real gates need nvcc 13.0, nvcc 13.5 (scripts/install_toolchains.sh), clang++-22 and Triton;
a missing toolchain fails them, by design.
"""

from __future__ import annotations

import io
import textwrap

import pytest
from dsa_ops import gates

# nvcc 13.0 -Xptxas -v,--warn-on-spills,--warn-on-local-memory-usage, sm_90a: one kernel spills.
PTXAS_SPILL = """\
ptxas warning : Local memory used for function '_Z8pressurePKfPf', size of stack frame: 856 bytes
ptxas warning : Registers are spilled to local memory in function '_Z8pressurePKfPf', \
948 bytes spill stores, 1320 bytes spill loads
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z8pressurePKfPf' for 'sm_90a'
ptxas info    : Function properties for _Z8pressurePKfPf
    856 bytes stack frame, 948 bytes spill stores, 1320 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 856 bytes cumulative stack size
ptxas info    : Compile time = 81.657 ms
ptxas info    : Compiling entry function '_Z4goodPKiPii' for 'sm_90a'
ptxas info    : Function properties for _Z4goodPKiPii
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 3.037 ms
"""

# A clean TU, older ptxas wording (smem and cmem on the Used line), plus a non-inlined device function.
PTXAS_CLEAN = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z3topPi' for 'sm_100a'
ptxas info    : Function properties for _Z3topPi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 232448 bytes smem, 384 bytes cmem[0]
"""

# Only the warning, no properties block (ptxas wording changes): still a failure.
PTXAS_WARN_ONLY = """\
ptxas warning : Registers are spilled to local memory in function '_Z1kv', \
8 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function '_Z1kv' for 'sm_107a'
ptxas info    : Used 255 registers, used 0 barriers
"""

AMDGPU_ASM = textwrap.dedent(
    """\
    \t.amdgcn_target "amdgcn-amd-amdhsa--gfx950"
    \t.text
    \t.globl\tclean
    clean:                                  ; @clean
    ; %bb.0:
    \ts_load_dwordx2 s[0:1], s[0:1], 0x0
    \tv_mov_b32_e32 v0, 0
    \tglobal_store_dword v0, v0, s[0:1]
    .LBB0_1:
    \ts_endpgm
    .Lfunc_end0:
    \t.size\tclean, .Lfunc_end0-clean
    \t.globl\tscratchy
    scratchy:
    \ts_getpc_b64 s[4:5]
    \ts_add_u32 s4, s4, __ockl_get_local_id@rel32@lo+4
    \ts_addc_u32 s5, s5, __ockl_get_local_id@rel32@hi+12
    \ts_swappc_b64 s[30:31], s[4:5]
    \tscratch_store_dword off, v1, s0
    \ts_endpgm
    .Lfunc_end1:
    \t.amdgpu_metadata
    ---
    amdhsa.kernels:
      - .agpr_count:     0
        .args:
          - .address_space:  global
            .name:           out
            .offset:         0
            .size:           8
            .value_kind:     global_buffer
        .group_segment_fixed_size: 4096
        .name:           clean
        .private_segment_fixed_size: 0
        .sgpr_count:     12
        .sgpr_spill_count: 0
        .uses_dynamic_stack: false
        .vgpr_count:     4
        .vgpr_spill_count: 0
        .wavefront_size: 64
      - .agpr_count:     0
        .args:
          - .offset:         0
            .size:           8
            .value_kind:     global_buffer
        .group_segment_fixed_size: 0
        .name:           scratchy
        .private_segment_fixed_size: 272
        .sgpr_count:     46
        .sgpr_spill_count: 0
        .uses_dynamic_stack: true
        .vgpr_count:     42
        .vgpr_spill_count: 3
    amdhsa.target:   amdgcn-amd-amdhsa--gfx950
    amdhsa.version:
      - 1
      - 2
    ...
    \t.end_amdgpu_metadata
    """
)

CUOBJDUMP = """
Resource usage:
 Common:
  GLOBAL:0
 Function page_table_transform_kernel:
  REG:48 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:960 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function spilly:
  REG:255 STACK:16 SHARED:0 LOCAL:16 CONSTANT[0]:960 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def _by_name(stats):
    return {k.name: k for k in stats}


def test_ptxas_spill_fails_the_gate():
    ks = _by_name(gates.parse_ptxas(PTXAS_SPILL))
    bad, good = ks["_Z8pressurePKfPf"], ks["_Z4goodPKiPii"]
    assert (bad.registers, bad.stack, bad.spill_stores, bad.spill_loads) == (32, 856, 948, 1320)
    assert bad.problems and any("spill" in p for p in bad.problems)
    assert (good.registers, good.shared, good.problems) == (10, 1024, [])
    r = gates.GateResult("a.cu", "sm_90a", "nvcc 13.0", kernels=list(ks.values()))
    assert not r.ok
    assert "FAIL" in gates.render([r])


def test_ptxas_clean():
    ks = _by_name(gates.parse_ptxas(PTXAS_CLEAN))
    assert ks["_Z3topPi"].entry and (ks["_Z3topPi"].registers, ks["_Z3topPi"].shared) == (168, 232448)
    assert not ks["_Z6helperi"].entry
    r = gates.GateResult("b.cu", "sm_100a", "nvcc 13.5", kernels=list(ks.values()))
    assert r.ok, [k.problems for k in r.kernels]
    assert gates.format_row(r)[3] == "1"  # one entry kernel; the device function is not counted


def test_ptxas_warning_alone_fails():
    (k,) = gates.parse_ptxas(PTXAS_WARN_ONLY)
    assert k.registers == 255 and k.problems


def test_amdgpu_metadata():
    ks = _by_name(gates.parse_amdgpu_asm(AMDGPU_ASM))
    assert set(ks) == {"clean", "scratchy"}
    c, s = ks["clean"], ks["scratchy"]
    assert (c.registers, c.sgprs, c.shared, c.scratch, c.isa_lines, c.problems) == (4, 12, 4096, 0, 4, [])
    assert (s.registers, s.sgprs, s.scratch, s.spill_stores) == (42, 46, 272, 3)
    text = " | ".join(s.problems)
    assert "scratch" in text and "VGPR spills" in text and "dynamic stack" in text
    assert "__ockl_get_local_id" in text  # unresolved under -nogpulib
    assert not gates.GateResult("x.hip", "gfx950", "clang", kernels=[c, s]).ok


# clang++-22 -S for gfx950: no scratch, but the kernel's scalars overflowed the SGPRs (spilled into
# VGPR lanes with v_writelane/v_readlane).
AMDGPU_SGPR_SPILL = textwrap.dedent(
    """
    \t.amdgpu_metadata
    ---
    amdhsa.kernels:
      - .agpr_count:     0
        .args:
          - .offset:         0
            .size:           224
            .value_kind:     by_value
        .group_segment_fixed_size: 41104
        .name:           sgpr_spilly
        .private_segment_fixed_size: 0
        .sgpr_count:     106
        .sgpr_spill_count: 75
        .uses_dynamic_stack: false
        .vgpr_count:     82
        .vgpr_spill_count: 0
        .wavefront_size: 64
    amdhsa.target:   amdgcn-amd-amdhsa--gfx950
    ...
    \t.end_amdgpu_metadata
    """
)


def test_amdgpu_sgpr_spill_fails_the_gate():
    (k,) = gates.parse_amdgpu_asm(AMDGPU_SGPR_SPILL)
    assert (k.registers, k.sgprs, k.scratch, k.spill_stores, k.spill_loads) == (82, 106, 0, 0, 75)
    assert k.problems == ["75 SGPR spills (into VGPR lanes)"]
    r = gates.GateResult("x.hip", "gfx950", "clang++-22", kernels=[k])
    assert not r.ok
    row = gates.format_row(r)
    assert row[6] == "0v/75s" and row[-1] == "FAIL"
    assert "SGPR spills" in gates.render([r])


def test_cuobjdump_resources():
    ks = _by_name(gates.parse_cuobjdump_resources(CUOBJDUMP))
    good = ks["page_table_transform_kernel"]
    assert good.registers == 48 and not good.problems
    assert ks["spilly"].problems


def test_missing_toolchain_is_a_failure(monkeypatch, tmp_path):
    def missing(release):
        raise gates.MissingToolchain(f"nvcc {release} not found: {gates.HINT}")

    monkeypatch.setattr(gates, "find_nvcc", missing)
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    out = io.StringIO()
    assert gates.run({"cuda"}, cuda_sources=tmp_path, out=out) == 1
    assert "install_toolchains.sh" in out.getvalue()


# ------------------------------------------------------------------------------------------------
# The real gates (slow; need the toolchains)

SPILLING_CU = """
__global__ void __launch_bounds__(1024, 2) pressure(const float* a, float* b) {
  float v[96];
#pragma unroll
  for (int j = 0; j < 96; ++j) v[j] = a[j * 1024 + threadIdx.x];
  float acc = 0;
#pragma unroll
  for (int j = 0; j < 96; ++j) acc += v[j] * v[(j * 7) % 96];
#pragma unroll
  for (int j = 0; j < 96; ++j) b[j * 1024 + threadIdx.x] = v[j] * acc;
}
"""

CLEAN_CU = """
__global__ void add_one(const int* __restrict__ a, int* __restrict__ b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) b[i] = a[i] + 1;
}
"""

SCRATCH_HIP = """
#include <hip/hip_runtime.h>
__global__ void scratchy(const float* a, float* b, int idx) {
  float v[64];
  unsigned t = __builtin_amdgcn_workitem_id_x();
  for (int j = 0; j < 64; ++j) v[j] = a[j * 33 + t];
  b[t] = v[idx & 63] + v[(idx * 3) & 63];  // dynamic indexing: the array lives in scratch
}
"""

CLEAN_HIP = """
#include <hip/hip_runtime.h>
__global__ void add_one(const int* __restrict__ a, int* __restrict__ b, int n) {
  int i = __builtin_amdgcn_workgroup_id_x() * 256 + __builtin_amdgcn_workitem_id_x();
  if (i < n) b[i] = a[i] + 1;
}
"""


@pytest.mark.gates
@pytest.mark.parametrize("only", ["cuda", "hip", "triton", "bindings"])
def test_gates_pass(only, capsys):
    rc = gates.main(["--only", only])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0, out


@pytest.mark.gates
def test_cuda_gate_catches_a_spill(tmp_path):
    (tmp_path / "spills.cu").write_text(SPILLING_CU)
    (tmp_path / "clean.cu").write_text(CLEAN_CU)
    out = io.StringIO()
    assert gates.run({"cuda"}, cuda_sources=tmp_path, out=out) == 1, out.getvalue()
    rows = [ln.split() for ln in out.getvalue().splitlines()]
    status = {(r[0], r[1]): r[-1] for r in rows if r and r[0] in ("spills.cu", "clean.cu")}
    for arch, _ in gates.CUDA_TARGETS:
        assert status[("spills.cu", arch)] == "FAIL", out.getvalue()
        assert status[("clean.cu", arch)] == "ok", out.getvalue()


@pytest.mark.gates
def test_hip_gate_catches_scratch(tmp_path):
    (tmp_path / "scratch.hip").write_text(SCRATCH_HIP)
    (tmp_path / "clean.hip").write_text(CLEAN_HIP)
    out = io.StringIO()
    assert gates.run({"hip"}, hip_sources=tmp_path, out=out) == 1, out.getvalue()
    text = out.getvalue()
    assert "scratch (private segment)" in text
    rows = {ln.split()[0]: ln.split()[-1] for ln in text.splitlines() if ln.endswith(("ok", "FAIL"))}
    assert rows["scratch.hip"] == "FAIL" and rows["clean.hip"] == "ok", text
