"""Compile gates: build every kernel for every target we ship and check its resource usage.

    python -m dsa_ops gates [--only cuda|hip|triton] [-j N] [-v]

- CUDA: each torch-free translation unit backends_cuda/kernels/*.cu for sm_90a (nvcc 13.0) and for
  sm_100a and SM107 (nvcc 13.5), with ptxas -v. Fails on any spill, stack frame or local memory.
- HIP: each backends_rocm/kernels/*.hip for gfx950 (clang++-22, device only, wave64), reading the
  AMDGPU metadata of the ISA. Fails on scratch (private segment), any spill (VGPR spills to scratch,
  SGPR spills into VGPR lanes), a dynamic stack, or a call to a device function that is not defined
  (under -nogpulib it would never link).
- Triton: each kernel in dsa_ops.backends.triton.GATE_KERNELS through triton.compile for sm_90,
  sm_100 and gfx950, no GPU needed. Same failure rules.

A missing toolchain is a failure (scripts/install_toolchains.sh installs them), never a skip.
Prints one row per (source file or kernel, target) and exits non-zero if any row failed.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

# The one place SM107 is chosen. nvcc 13.5 has an arch-specific sm_107a (`nvcc --list-gpu-code`
# lists sm_107, and scripts/install_toolchains.sh probe-compiles for sm_107a). With a toolchain that
# lacks it, put the sm_100 family variant here instead ("sm_100f": family-portable features only).
SM107 = "sm_107a"

# (arch, nvcc release that builds it)
CUDA_TARGETS = (("sm_90a", "13.0"), ("sm_100a", "13.5"), (SM107, "13.5"))
HIP_ARCH = "gfx950"
# (label, GPUTarget arguments); Triton 3.6 links gfx950 code objects with its built-in lld, so
# TRITON_HIP_LLD_PATH is not needed (setting it to /usr/bin/ld.lld-22 does no harm).
TRITON_TARGETS = (
    ("sm_90a", ("cuda", 90, 32)),
    ("sm_100a", ("cuda", 100, 32)),
    ("gfx950", ("hip", "gfx950", 64)),
)

NVCC_FLAGS = ["-O3", "-std=c++17", "-c", "-Xptxas", "-v,--warn-on-spills,--warn-on-local-memory-usage"]

# Kernels that must keep their body on a target: an arch-feature guard that is false there compiles the
# kernel to an empty (or trapping) stub of a few registers, which the spill and stack checks pass.
# (source, target, substring of the mangled kernel name, fewest registers a real body has)
REQUIRED_BODIES = (
    ("sparse_mla_decode.cu", "sm_90a", "15sm90_mla_decode24sparse_mla_decode_kernel", 64),
    ("sparse_mla_decode.cu", "sm_90a", "18sm90_mla_decode_ws27sparse_mla_decode_ws_kernel", 64),
    ("sparse_mla_decode.cu", "sm_100a", "16sm100_mla_decode24sparse_mla_decode_kernel", 64),
    ("sparse_mla_decode.cu", SM107, "16sm100_mla_decode24sparse_mla_decode_kernel", 64),
    ("indexer_logits.cu", "sm_90a", "12sm90_indexer25indexer_logits_tma_kernel", 64),
    ("indexer_logits.cu", "sm_100a", "13sm100_indexer21indexer_logits_kernel", 64),
    ("indexer_logits.cu", SM107, "13sm100_indexer21indexer_logits_kernel", 64),
    ("sparse_attention.cu", "sm_90a", "21smxx_sparse_attention27sparse_attention_fp8_kernel", 64),
    ("sparse_attention.cu", "sm_100a", "21smxx_sparse_attention27sparse_attention_fp8_kernel", 64),
    ("sparse_attention.cu", SM107, "21smxx_sparse_attention27sparse_attention_fp8_kernel", 64),
)
HIP_FLAGS = ["-x", "hip", f"--offload-arch={HIP_ARCH}", "--offload-device-only", "-nogpulib", "-O3", "-S",
             "-D__AMDGCN_WAVEFRONT_SIZE=64"]
HINT = "run scripts/install_toolchains.sh"


# --------------------------------------------------------------------------------------------------
# Results


@dataclass
class KernelStats:
    """Resource usage of one compiled kernel (or, for ptxas, one non-inlined device function)."""

    name: str
    entry: bool = True
    registers: Optional[int] = None  # CUDA registers / AMD VGPRs
    sgprs: Optional[int] = None
    shared: Optional[int] = None  # static smem / LDS bytes
    stack: int = 0  # CUDA stack frame bytes
    spill_stores: int = 0  # CUDA bytes / AMD VGPR spill count (.vgpr_spill_count)
    spill_loads: int = 0  # CUDA bytes / AMD SGPR spill count (.sgpr_spill_count: into VGPR lanes)
    scratch: int = 0  # CUDA local memory bytes / AMD private segment bytes
    isa_lines: Optional[int] = None
    problems: list = field(default_factory=list)


@dataclass
class GateResult:
    unit: str  # source file or Triton kernel
    target: str
    tool: str
    kernels: list = field(default_factory=list)
    error: Optional[str] = None  # compile failure or missing toolchain
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not any(k.problems for k in self.kernels)


# --------------------------------------------------------------------------------------------------
# Parsers (pure functions of the compiler's text: unit-tested on canned output)

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_LMEM = re.compile(r"(\d+) bytes lmem")
_LOCAL_WARN = re.compile(r"Local memory used for function '([^']+)'")
_SPILL_WARN = re.compile(r"Registers are spilled to local memory in function '([^']+)'")


def parse_ptxas(text: str) -> list[KernelStats]:
    """Per-function stats from `ptxas -v` output (nvcc -Xptxas -v), with the gate's problems set."""
    stats: dict[str, KernelStats] = {}
    warned: dict[str, set] = {}

    def get(name: str, entry: bool = False) -> KernelStats:
        if name not in stats:
            stats[name] = KernelStats(name, entry=entry)
        stats[name].entry |= entry
        return stats[name]

    entry = props = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            entry = get(m.group(1), entry=True)
        elif m := _PROPS.search(line):
            # A device function that was not inlined has properties but no "Compiling entry" line.
            props = get(m.group(1))
        elif m := _FRAME.search(line):
            if props is not None:
                props.stack, props.spill_stores, props.spill_loads = map(int, m.groups())
        elif m := _USED.search(line):
            if entry is not None:
                entry.registers = int(m.group(1))
                entry.shared = int(s.group(1)) if (s := _SMEM.search(line)) else 0
                entry.scratch = int(lm.group(1)) if (lm := _LMEM.search(line)) else 0
        elif m := _LOCAL_WARN.search(line):
            warned.setdefault(m.group(1), set()).add("local")
            get(m.group(1))
        elif m := _SPILL_WARN.search(line):
            warned.setdefault(m.group(1), set()).add("spill")
            get(m.group(1))
    for k in stats.values():
        w = warned.get(k.name, set())
        if k.spill_stores or k.spill_loads:
            k.problems.append(f"spills: {k.spill_stores} B stores, {k.spill_loads} B loads")
        elif "spill" in w:  # the warning alone still fails the gate, even if the numbers were not parsed
            k.problems.append("ptxas warns: registers spilled to local memory")
        if k.stack or k.scratch:
            k.problems.append(f"local memory: stack frame {k.stack} B, lmem {k.scratch} B")
        elif "local" in w:
            k.problems.append("ptxas warns: local memory used")
    return list(stats.values())


def _metadata_kernels(meta: str) -> list[dict]:
    """The amdhsa.kernels list of an AMDGPU metadata block, one flat dict of scalar keys per kernel.

    A small line parser instead of a YAML dependency: kernel keys sit at one indent; nested lists
    (.args) sit deeper and are skipped.
    """
    kernels: list[dict] = []
    in_list, key_col = False, None
    for line in meta.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # a top-level key: starts or ends the kernel list
            in_list = line.startswith("amdhsa.kernels:")
            continue
        if not in_list:
            continue
        m = re.match(r"^(\s*)(- )?\.([\w.]+):\s*(.*?)\s*$", line)
        if not m:
            continue
        indent, dash, key, value = len(m.group(1)), m.group(2), m.group(3), m.group(4)
        col = indent + (2 if dash else 0)
        if key_col is None:
            key_col = col
        if dash and col == key_col:
            kernels.append({})
        if col == key_col and kernels and value:
            kernels[-1][key] = int(value) if re.fullmatch(r"-?\d+", value) else value
    return kernels


_INSN = re.compile(r"^\s+[a-z_][\w.]*")
_CALLEE = re.compile(r"([\w.$]+)@(?:rel32|gotpcrel32|gotpcrel)@lo")


def parse_amdgpu_asm(text: str) -> list[KernelStats]:
    """Per-kernel stats from AMDGPU assembly (clang -S, or Triton's `amdgcn`), with problems set."""
    m = re.search(r"^\s*\.amdgpu_metadata\s*$(.*?)^\s*\.end_amdgpu_metadata", text, re.S | re.M)
    if not m:
        return []
    defined = set(re.findall(r"^([\w.$]+):", text, re.M))
    out = []
    for kd in _metadata_kernels(m.group(1)):
        name = str(kd.get("name", "?"))
        k = KernelStats(
            name,
            registers=kd.get("vgpr_count"),
            sgprs=kd.get("sgpr_count"),
            shared=kd.get("group_segment_fixed_size"),
            spill_stores=kd.get("vgpr_spill_count", 0),
            spill_loads=kd.get("sgpr_spill_count", 0),
            scratch=kd.get("private_segment_fixed_size", 0),
        )
        body = re.search(rf"^{re.escape(name)}:.*?$(.*?)^\.Lfunc_end", text, re.S | re.M)
        if body:
            lines = body.group(1).splitlines()
            k.isa_lines = sum(1 for ln in lines if _INSN.match(ln) and not ln.lstrip().startswith((";", ".")))
            undefined = sorted({c for c in _CALLEE.findall(body.group(1)) if c not in defined})
            if undefined:
                k.problems.append(
                    "calls undefined device functions (left unresolved by -nogpulib; use compiler "
                    "builtins): " + ", ".join(undefined)
                )
        if k.scratch:
            k.problems.append(f"scratch (private segment) {k.scratch} B")
        if k.spill_stores:
            k.problems.append(f"{k.spill_stores} VGPR spills")
        if k.spill_loads:  # no scratch, but the kernel does not fit its SGPRs: a spill all the same
            k.problems.append(f"{k.spill_loads} SGPR spills (into VGPR lanes)")
        if str(kd.get("uses_dynamic_stack", "false")).lower() == "true":
            k.problems.append("dynamic stack (calls, recursion or variable-size allocas)")
        out.append(k)
    return out


_CUOBJDUMP = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def parse_cuobjdump_resources(text: str) -> list[KernelStats]:
    """Per-kernel stats from `cuobjdump --dump-resource-usage` (used for Triton's cubins)."""
    out = []
    for name, reg, stack, shared, local in _CUOBJDUMP.findall(text):
        k = KernelStats(name, registers=int(reg), shared=int(shared), stack=int(stack), scratch=int(local))
        if k.stack:
            k.problems.append(f"stack frame {k.stack} B")
        if k.scratch:
            k.problems.append(f"local memory {k.scratch} B")
        out.append(k)
    return out


# --------------------------------------------------------------------------------------------------
# Toolchains


class MissingToolchain(Exception):
    pass


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise MissingToolchain(f"package {name} not found")
    return Path(list(spec.submodule_search_locations)[0])


def _toolchains_dir() -> Path:
    if os.environ.get("DSA_TOOLCHAINS"):
        return Path(os.environ["DSA_TOOLCHAINS"])
    repo = Path(__file__).resolve().parent.parent  # editable install: ops_core/ sits in the repo
    if (repo / "scripts" / "install_toolchains.sh").exists():
        return repo / ".toolchains"
    return Path.cwd() / ".toolchains"


@functools.lru_cache(maxsize=None)  # every job asks; `nvcc --version` once per path is enough
def _release(tool: str) -> Optional[str]:
    try:
        text = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None


def find_nvcc(release: str) -> str:
    """An nvcc of exactly `release`: $DSA_NVCC_<13_0>, the system CUDA, or install_toolchains.sh's."""
    env = f"DSA_NVCC_{release.replace('.', '_')}"
    candidates = [os.environ.get(env), f"/usr/local/cuda-{release}/bin/nvcc",
                  str(_toolchains_dir() / f"nvcc-{release}" / "nvidia" / "cu13" / "bin" / "nvcc"),
                  shutil.which("nvcc")]
    seen = []
    for c in candidates:
        if c and os.access(c, os.X_OK):
            got = _release(c)
            if got == release:
                return c
            seen.append(f"{c} is {got}")
    found = f" (found: {'; '.join(seen)})" if seen else ""
    raise MissingToolchain(f"nvcc {release} not found{found}: {HINT}, or set {env}")


def find_any_nvcc(releases: tuple[str, ...] = ("13.5", "13.0")) -> str:
    """The first of `releases` found (find_nvcc): for host-side tests that need CUDA headers or PTX only."""
    errors = []
    for release in releases:
        try:
            return find_nvcc(release)
        except MissingToolchain as e:
            errors.append(str(e))
    raise MissingToolchain("; ".join(errors))


def find_clang() -> str:
    clang = os.environ.get("DSA_CLANG") or shutil.which("clang++-22")
    if not clang:
        raise MissingToolchain(f"clang++-22 not found: {HINT} (apt clang-22 lld-22 libamdhip64-dev)")
    if not os.environ.get("DSA_CLANG") and not Path("/usr/include/hip/hip_runtime.h").exists():
        raise MissingToolchain(f"HIP headers (/usr/include/hip) not found: {HINT} (apt libamdhip64-dev)")
    return clang


# --------------------------------------------------------------------------------------------------
# Jobs: each returns one GateResult and never raises


def _run(cmd: list[str], timeout: int = 600) -> tuple[int, str]:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def cuda_job(src: Path, include: Path, arch: str, release: str, tmp: Path) -> GateResult:
    r = GateResult(src.name, arch, f"nvcc {release}")
    t = time.perf_counter()
    try:
        nvcc = find_nvcc(release)
        virt = arch.replace("sm_", "compute_")
        obj = tmp / f"{src.stem}.{arch}.o"
        gencode = f"-gencode=arch={virt},code={arch}"
        rc, text = _run([nvcc, *NVCC_FLAGS, f"-I{include}", gencode, "-o", str(obj), str(src)])
        if rc != 0:
            r.error = f"nvcc failed (exit {rc}):\n{_tail(text)}"
        else:
            r.kernels = parse_ptxas(text)
            check_required_bodies(r)
    except MissingToolchain as e:
        r.error = str(e)
    except Exception as e:  # a gate that breaks must say so, not vanish
        r.error = f"{type(e).__name__}: {e}"
    r.seconds = time.perf_counter() - t
    return r


def check_required_bodies(r: GateResult) -> None:
    """Fail `r` where a REQUIRED_BODIES kernel of its (unit, target) is missing or compiled to a stub."""
    for unit, target, name, min_regs in REQUIRED_BODIES:
        if (unit, target) != (r.unit, r.target):
            continue
        found = [k for k in r.kernels if k.entry and name in k.name]
        if not found:
            r.error = f"no kernel named *{name}* built for {target}: its body is required there"
        for k in found:
            if (k.registers or 0) < min_regs:
                k.problems.append(f"{k.registers} registers (< {min_regs}): compiled without its body for {target} "
                                  "(an arch-feature guard is false there)")


def hip_job(src: Path, include: Path, tmp: Path) -> GateResult:
    r = GateResult(src.name, HIP_ARCH, "clang++-22")
    t = time.perf_counter()
    try:
        clang = find_clang()
        asm = tmp / f"{src.stem}.{HIP_ARCH}.s"
        rc, text = _run([clang, *HIP_FLAGS, f"-I{include}", "-o", str(asm), str(src)])
        if rc != 0:
            r.error = f"clang++-22 failed (exit {rc}):\n{_tail(text)}"
        else:
            r.kernels = parse_amdgpu_asm(asm.read_text())
    except MissingToolchain as e:
        r.error = str(e)
    except Exception as e:
        r.error = f"{type(e).__name__}: {e}"
    r.seconds = time.perf_counter() - t
    return r


def binding_job(src: Path, includes: list[Path], defines: list[str]) -> GateResult:
    """Syntax-check one stable-ABI binding (backends_*/csrc/*.cpp) with the host compiler against this
    torch's headers, targeting the oldest torch the libraries load under: the GPU machine builds these
    for real, and this keeps a broken binding from reaching it."""
    import torch
    from dsa_ops.backends.cuda._jit import TORCH_TARGET_VERSION_FLAG
    from torch.utils import cpp_extension

    tool = f"g++ (torch {torch.__version__.split('+')[0]} headers)"
    r = GateResult(f"{src.parent.parent.name}/{src.name}", "host", tool)
    t = time.perf_counter()
    try:
        cxx = shutil.which("g++") or shutil.which("c++")
        if cxx is None:
            raise MissingToolchain("no host C++ compiler (g++) on PATH")
        cuda_include = Path(find_nvcc("13.0")).resolve().parent.parent / "include"
        flags = ["-fsyntax-only", "-std=c++17", "-Wall", "-Werror", "-DUSE_CUDA", TORCH_TARGET_VERSION_FLAG, *defines]
        incs = [*includes, *map(Path, cpp_extension.include_paths()), cuda_include]
        rc, text = _run([cxx, *flags, *(f"-I{i}" for i in incs), str(src)])
        if rc != 0:
            r.error = f"g++ failed (exit {rc}):\n{_tail(text)}"
    except MissingToolchain as e:
        r.error = str(e)
    except Exception as e:
        r.error = f"{type(e).__name__}: {e}"
    r.seconds = time.perf_counter() - t
    return r


_triton_lock = threading.Lock()  # triton.compile is not documented as thread-safe: one at a time


def triton_job(name: str, fn, signature: dict, constexprs: dict, label: str, target: tuple, tmp: Path,
               divisible: tuple = (), options: Optional[dict] = None) -> GateResult:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    r = GateResult(name, label, f"triton {triton.__version__}")
    t = time.perf_counter()
    try:
        # Pointers as torch allocates them (16-byte aligned) and the ints the kernel lists as multiples
        # of 16, as Triton specializes them at launch: the vectorisation matches a real launch.
        params = list(signature)
        attrs = {(params.index(a),): [["tt.divisibility", 16]]
                 for a, ty in signature.items() if ty.startswith("*") or a in divisible}
        src = ASTSource(fn, signature=signature, constexprs=constexprs, attrs=attrs)
        with _triton_lock:
            kernel = triton.compile(src, target=GPUTarget(*target), options=options)
        shared = int(getattr(kernel.metadata, "shared", 0) or 0)
        if target[0] == "hip":
            r.kernels = parse_amdgpu_asm(kernel.asm["amdgcn"])
        else:
            r.kernels = _cubin_resources(kernel.asm["cubin"], tmp / f"{name}.{label}.cubin")
        if not r.kernels:
            r.kernels = [KernelStats(kernel.metadata.name)]
        for k in r.kernels:  # dynamic shared memory is in the metadata, not in the binary's static count
            k.shared = max(k.shared or 0, shared)
    except Exception as e:
        r.error = f"triton.compile failed: {type(e).__name__}: {_tail(str(e))}"
    r.seconds = time.perf_counter() - t
    return r


def _cubin_resources(cubin: bytes, path: Path) -> list[KernelStats]:
    """Registers, stack, local memory of a cubin through the cuobjdump that ships with Triton."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        raise MissingToolchain(f"{tool} missing (Triton's bundled CUDA tools): reinstall triton")
    path.write_bytes(cubin)
    rc, text = _run([str(tool), "--dump-resource-usage", str(path)])
    if rc != 0:
        raise RuntimeError(f"cuobjdump failed (exit {rc}): {_tail(text)}")
    return parse_cuobjdump_resources(text)


# --------------------------------------------------------------------------------------------------
# Planning, running, reporting


def plan(only: set[str], tmp: Path, cuda_sources: Optional[Path] = None,
         hip_sources: Optional[Path] = None) -> tuple[list[Callable[[], GateResult]], list[GateResult]]:
    """The compile jobs to run, plus rows already decided (missing toolchains, empty source dirs)."""
    jobs: list[Callable[[], GateResult]] = []
    rows: list[GateResult] = []
    if "cuda" in only:
        root = _package_dir("dsa_ops.backends.cuda")
        inc = root / "include"
        srcs = sorted((cuda_sources or root / "kernels").glob("*.cu"))
        targets = []
        for arch, release in CUDA_TARGETS:
            try:
                find_nvcc(release)
                targets.append((arch, release))
                if not srcs:
                    rows.append(GateResult("(no .cu files)", arch, f"nvcc {release}"))
            except MissingToolchain as e:  # one row per target, not one per file
                rows.append(GateResult("(all .cu)", arch, f"nvcc {release}", error=str(e)))
        for s in srcs:
            for arch, release in targets:
                jobs.append(lambda s=s, a=arch, rel=release, inc=inc: cuda_job(s, inc, a, rel, tmp))
    if "hip" in only:
        root = _package_dir("dsa_ops.backends.rocm")
        inc = root / "include"
        srcs = sorted((hip_sources or root / "kernels").glob("*.hip"))
        try:
            find_clang()
            if not srcs:
                rows.append(GateResult("(no .hip files)", HIP_ARCH, "clang++-22"))
            for s in srcs:
                jobs.append(lambda s=s, inc=inc: hip_job(s, inc, tmp))
        except MissingToolchain as e:
            rows.append(GateResult("(all .hip)", HIP_ARCH, "clang++-22", error=str(e)))
    if "bindings" in only:
        shared = _package_dir("dsa_ops") / "csrc"
        for pkg, defines in (("dsa_ops.backends.cuda", []), ("dsa_ops.backends.rocm", ["-DDSA_HIP_ON_CUDA"])):
            root = _package_dir(pkg)
            for s in sorted((root / "csrc").glob("*.cpp")):
                jobs.append(lambda s=s, inc=[root / "include", shared], d=defines: binding_job(s, inc, d))
    if "triton" in only:
        import dsa_ops.backends.triton as tb

        if tb.IMPORT_ERROR:
            rows.append(GateResult("(all triton)", "-", "triton", error=tb.IMPORT_ERROR))
        else:
            # (name, kernel, signature, constexprs[, divisible ints[, options]]): options are the launcher's
            # num_warps / num_stages, and "targets", the labels it is built for when not all of them.
            for name, fn, sig, constexprs, *rest in tb.GATE_KERNELS:
                div = tuple(rest[0]) if rest else ()
                opts = dict(rest[1]) if len(rest) > 1 else {}
                only_on = opts.pop("targets", None)
                for label, target in TRITON_TARGETS:
                    if only_on is not None and label not in only_on:
                        continue
                    jobs.append(lambda n=name, f=fn, s=sig, c=constexprs, lb=label, tg=target, d=div, o=opts:
                                triton_job(n, f, s, c, lb, tg, tmp, d, o))
    return jobs, rows


def _fmt(v) -> str:
    return "-" if v is None else str(v)


def _spills(ks: list[KernelStats]) -> str:
    """CUDA: spill store/load bytes ("st/ld"); AMD: VGPR and SGPR spill counts ("3v/75s")."""
    st, ld = sum(k.spill_stores for k in ks), sum(k.spill_loads for k in ks)
    return f"{st}v/{ld}s" if any(k.sgprs is not None for k in ks) else f"{st}/{ld}"


def format_row(r: GateResult) -> list[str]:
    ks = r.kernels
    regs = max((k.registers or 0 for k in ks), default=None) if ks else None
    if ks and any(k.sgprs is not None for k in ks):
        regs = f"{regs}v/{max(k.sgprs or 0 for k in ks)}s"
    shared = max((k.shared or 0 for k in ks), default=None) if ks else None
    spills = _spills(ks) if ks else "-"
    scratch = max((max(k.scratch, k.stack) for k in ks), default=None) if ks else None
    isa = sum(k.isa_lines for k in ks if k.isa_lines) if ks and any(k.isa_lines for k in ks) else None
    n = sum(1 for k in ks if k.entry)
    status = "ok" if r.ok else "FAIL"
    if r.error is None and not ks and r.target != "host":  # host rows (bindings) have no kernels
        status = "ok (empty)"
    return [r.unit, r.target, r.tool, _fmt(n if ks else None), _fmt(regs), _fmt(shared), spills,
            _fmt(scratch), _fmt(isa), f"{r.seconds:.1f}", status]


HEADER = ["source / kernel", "target", "tool", "kernels", "regs", "smem/LDS", "spills st/ld|v/s", "stack/scratch",
          "isa", "s", "status"]


def _demangler(results: list[GateResult]) -> Callable[[str], str]:
    """C++ names made readable through binutils' c++filt when it is there (best effort)."""
    names = sorted({k.name for r in results for k in r.kernels if k.name.startswith("_Z")})
    tool = shutil.which("c++filt")
    if not names or not tool:
        return lambda n: n
    try:
        p = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=60)
        lines = p.stdout.splitlines()
        table = dict(zip(names, lines, strict=True)) if len(lines) == len(names) else {}
    except (OSError, subprocess.SubprocessError):
        table = {}
    return lambda n: table.get(n, n)


def render(results: list[GateResult], verbose: bool = False) -> str:
    demangle = _demangler(results)
    table = [HEADER] + [format_row(r) for r in results]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    details = []
    for r in results:
        for k in r.kernels:
            if verbose or k.problems:
                kind = "" if k.entry else " (device function)"
                regs = f"{k.registers}" + (f"v/{k.sgprs}s" if k.sgprs is not None else "")
                details.append(
                    f"  {r.unit} [{r.target}] {demangle(k.name)}{kind}: regs {regs}, "
                    f"smem/LDS {_fmt(k.shared)}, stack {k.stack}, spills {_spills([k])}, "
                    f"scratch {k.scratch}, isa {_fmt(k.isa_lines)}"
                    + "".join(f"\n      FAIL: {p}" for p in k.problems)
                )
        if r.error:
            details.append(f"  {r.unit} [{r.target}] FAIL: " + r.error.replace("\n", "\n      "))
    if details:
        lines += ["", "details:" if verbose else "failures:"] + details
    return "\n".join(lines)


def run(only: set[str], jobs: int = 2, verbose: bool = False, cuda_sources: Optional[Path] = None,
        hip_sources: Optional[Path] = None, out=sys.stdout) -> int:
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dsa-gates-") as d:
        work, rows = plan(only, Path(d), cuda_sources, hip_sources)
        # The compilers are subprocesses (Triton's run serialized under a lock): threads suffice.
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            results = list(pool.map(lambda job: job(), work))
    results = rows + results
    failed = sum(not r.ok for r in results)
    print(render(results, verbose), file=out)
    wall = time.perf_counter() - t
    print(f"\ngates ({', '.join(sorted(only))}): {len(results) - failed} ok, {failed} failed, "
          f"{len(work)} compiles in {wall:.1f} s with {jobs} workers", file=out)
    return 1 if failed else 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dsa_ops gates", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", choices=("cuda", "hip", "triton", "bindings"),
                   help="run only these toolchains (repeatable; default: all)")
    p.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel compiles")
    p.add_argument("-v", "--verbose", action="store_true", help="print every kernel, not only failing ones")
    p.add_argument("--cuda-sources", type=Path, help=".cu files here, not in backends_cuda/kernels")
    p.add_argument("--hip-sources", type=Path, help=".hip files here, not in backends_rocm/kernels")
    a = p.parse_args(argv)
    only = set(a.only or ("cuda", "hip", "triton", "bindings"))
    return run(only, a.jobs, a.verbose, a.cuda_sources, a.hip_sources)


if __name__ == "__main__":
    sys.exit(main())
