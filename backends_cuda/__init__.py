"""dsa_ops.backends.cuda: CUDA C++ kernels for NVIDIA Hopper (sm_90a) and newer, one op per file.

Layout (see README.md): include/dsa_cuda/ torch-free kernel headers, kernels/ torch-free launchers
(what the compile gates build), csrc/ thin stable-ABI bindings registering ``torch.ops.dsa_cuda.*``,
and one Python module per op that registers its provider. Every kernels/*.cu and csrc/*.cpp goes into
one library per GPU arch, built on first use (see ``_jit``) or loaded prebuilt:

    python -c "from dsa_ops.backends import cuda; print(cuda.build())"   # build now, print the .so
    DSA_OPS_CUDA_LIB=/path/dsa_ops_cuda_sm90a.so python ...               # use a prebuilt one
    cp <that .so> backends_cuda/prebuilt/                                 # or ship it beside the code

Importing this module compiles nothing and does not touch the GPU.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
from pathlib import Path
from typing import Optional

import torch

from ._jit import (
    TORCH_TARGET_VERSION_FLAG,
    BuildSpec,
    Library,
    binding_headers,
    cuda_arch_name,
    find_cuda_home,
    nvcc_gencode,
)

HERE = Path(__file__).resolve().parent
log = logging.getLogger("dsa_ops")


@contextlib.contextmanager
def _take_over_cuda_key():
    """Around the library's load: its C++ kernels (csrc/*_route.cpp) become the CUDA-key kernels of the top-k
    family's dsa ops, dsa.sparse_mla_decode, dsa.sparse_attention and dsa.paged_indexer_logits in place of the
    Python routers (dsa_ops._route), and follow the registry."""
    from dsa_ops import _route, registry

    from . import providers_paged_indexer, providers_sparse_attention, providers_sparse_mla_decode, providers_topk

    groups = ((providers_topk.ROUTED_OPS, providers_topk),
              ((providers_sparse_mla_decode.OP,), providers_sparse_mla_decode),
              ((providers_sparse_attention.OP,), providers_sparse_attention),
              ((providers_paged_indexer.OP,), providers_paged_indexer))
    with _route.handed_over([op for ops, _ in groups for op in ops]):
        yield
    ns = torch.ops.dsa_cuda
    for ops, module in groups:
        if any(_route.python_routed(o) for o in ops):
            log.info("dsa_ops: %s registers no CUDA kernel for dsa.%s: the Python router serves it", LIB.path, ops[0])
            continue
        _route.set_error_sink(ns.topk_route_error.default)  # every route's (csrc/route_common.h)
        devices = module.take_route(registry, ns, available)
        log.info("dsa_ops: C++ kernels serve the CUDA key of %s (device mask %#x)", ", ".join(ops), devices)


LIB = Library("cuda", "dsa_cuda", HERE, env_var="DSA_OPS_CUDA_LIB", handover=_take_over_cuda_key)

# One module per op; each has register().
_OP_MODULES = ("page_table_transform", "providers_topk", "providers_indexer", "providers_paged_indexer",
               "providers_sparse_mla_decode", "providers_sparse_attention")


def lib_name(arch: str) -> str:
    return f"dsa_ops_cuda_{arch.replace('sm_', 'sm')}"


def build_spec(arch: str) -> BuildSpec:
    """Sources and flags of the library for `arch` (e.g. "sm_90a")."""
    cuda_flags = [
        "-O3",
        nvcc_gencode(arch),
        "-Xptxas=--warn-on-spills,--warn-on-local-memory-usage",
        TORCH_TARGET_VERSION_FLAG,
    ]
    return BuildSpec(
        name=lib_name(arch),
        what=f"CUDA kernels for {arch}",
        sources=sorted(HERE.glob("kernels/*.cu")) + sorted(HERE.glob("csrc/*.cpp")),
        depends=(sorted(p for p in (HERE / "include").rglob("*") if p.is_file()) + sorted(HERE.glob("csrc/*.h"))
                 + binding_headers()[1]),
        include_dirs=[HERE / "include", binding_headers()[0]],
        # USE_CUDA: declares torch's current-CUDA-stream shim in the bindings.
        cflags=["-O3", "-DUSE_CUDA", TORCH_TARGET_VERSION_FLAG],
        cuda_cflags=cuda_flags,
        # A toolchain that links libstdc++ statically (the H200 image's) would export its symbols, and the
        # process's own libstdc++ then interposes half of them: the ostream that formats a binding's
        # STD_TORCH_CHECK message breaks (garbled on the CPU, a segfault on the H200). Keep them local.
        ldflags=["-Wl,--exclude-libs,ALL"],
    )


@functools.lru_cache(maxsize=None)
def capability(index: int) -> tuple[int, int]:
    """Compute capability of CUDA device `index`, cached (providers ask on every call)."""
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=None)
def sm_count(index: Optional[int]) -> int:
    """SMs of CUDA device `index` (None: the current one; 132 on the H200), cached."""
    return torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device()
                                            ).multi_processor_count


def route_following_registry(registry, available, op: str, provider, unsupported_arch, set_devices) -> int:
    """Keep a C++ CUDA-key kernel of `op` (csrc/*_route.cpp) serving the devices `provider` would, whenever the
    registry would pick it: this very provider registered and no other backend forced. Device d is served when
    `available` accepts it and `unsupported_arch(capability, forced)` is None; otherwise no device, so every call
    goes to the Python router. `set_devices(mask)` is the kernel's control op. Returns the mask now."""

    def served() -> int:
        forced = registry.forced_backend()
        return sum(1 << d for d in range(min(torch.cuda.device_count(), 64))
                   if available(torch.device("cuda", d)) is None and unsupported_arch(capability(d), forced) is None)

    def sync():
        ok = registry.providers(op).get("cuda") is provider and registry.forced_backend() in (None, "cuda")
        set_devices(served() if ok else 0)

    registry.on_change(sync)
    return served()


def sm90_or_forced_sm100(cap: tuple[int, int], forced: Optional[str], kernel: str) -> Optional[str]:
    """Why `kernel` (a wgmma kernel for SM90, run on the H200, and a tcgen05 one for the SM100 family, compiled,
    not run) does not serve a device of compute capability `cap` (None when it does), with the backend `forced`
    (registry.forced_backend()): the SM100 kernel serves only when the cuda backend is forced."""
    major, minor = cap
    if major == 9:
        return None
    if major == 10:
        if forced == "cuda":
            return None
        return (f"compute capability {major}.{minor}: the {kernel} kernel for the SM100 family (tcgen05) is "
                "compiled, not run; it serves only when the cuda backend is forced")
    return (f"compute capability {major}.{minor}: the {kernel} kernels are for SM90 (wgmma) and the SM100 "
            "family (tcgen05, compiled, not run)")


def sm90_only(t: torch.Tensor, kernel: str) -> Optional[str]:
    """None on an SM90 device; else why `kernel` (wgmma, SM90-only) does not run on t's device."""
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    major, minor = capability(index)
    if major != 9:
        return f"compute capability {major}.{minor}: the {kernel} kernel is SM90-only (wgmma); no SM100 variant yet"
    return None


def aligned16(t: torch.Tensor, strides) -> bool:
    """Whether t's data and the given strides (in t's elements) allow 16-byte copies."""
    e = t.element_size()
    return t.data_ptr() % 16 == 0 and all((s * e) % 16 == 0 for s in strides)


def _device_arch(device: Optional[torch.device] = None) -> str:
    index = torch.cuda.current_device() if device is None or device.index is None else device.index
    return cuda_arch_name(torch.cuda.get_device_capability(index))


def _toolchain_missing() -> Optional[str]:
    from torch.utils import cpp_extension

    if find_cuda_home() is None:
        return ("no CUDA toolkit found for the first-use build (set CUDA_HOME to the nvcc install) and no "
                "prebuilt library (DSA_OPS_CUDA_LIB or backends_cuda/prebuilt/)")
    if not cpp_extension.is_ninja_available():
        return "ninja is not installed (pip install ninja): it builds the CUDA kernels on first use"
    return None


def available(device: torch.device) -> Optional[str]:
    if device.type != "cuda":
        return f"CUDA kernels run on CUDA tensors, got a {device.type} tensor"
    if torch.version.hip is not None:
        return "ROCm build of torch: the CUDA C++ kernels need an NVIDIA GPU (native HIP is the hip backend)"
    if not torch.cuda.is_available():
        return "torch.cuda is not available"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return (f"compute capability {major}.{minor} < 9.0: the CUDA C++ kernels target sm_90a and newer "
                "(the triton backend serves older GPUs)")
    arch = _device_arch(device)
    return LIB.why_not(arch, lib_name(arch), _toolchain_missing)


def load(device: Optional[torch.device] = None) -> str:
    """Load (building on first use) the library for `device`'s arch; return its path."""
    arch = _device_arch(device)
    return LIB.load(build_spec(arch), arch)


def op(name: str, device: Optional[torch.device] = None):
    """torch.ops.dsa_cuda.<name>.default, loading the library first if needed."""
    if LIB.path is None:
        load(device)
    return LIB.op(name)


def build(verbose: bool = True, build_root: Optional[os.PathLike] = None, arch: Optional[str] = None) -> str:
    """Compile the library now (or reuse the cache), load it, and return the .so's path.

    Ignores DSA_OPS_CUDA_LIB and prebuilt/ (it is how those files are made). `arch` defaults to the
    current device's (e.g. "sm_90a"); `build_root` overrides the cache root.
    """
    arch = arch or _device_arch()
    return LIB.load(build_spec(arch), arch, force_build=True, build_root=build_root, verbose=verbose)


def register() -> None:
    for m in _OP_MODULES:
        importlib.import_module(f"{__name__}.{m}").register()
