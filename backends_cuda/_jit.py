"""Build-on-first-use and loading of the compiled kernel libraries (CUDA C++, and native HIP).

Each backend's sources compile into one shared library per GPU arch, which registers its ops under
its own namespace (``torch.ops.dsa_cuda``, ``torch.ops.dsa_hip``) through torch's stable ABI and is
loaded with ``torch.ops.load_library``. Where it comes from, first match wins:

1. the file named by the backend's env var (``DSA_OPS_CUDA_LIB`` / ``DSA_OPS_HIP_LIB``);
2. ``<backend package>/prebuilt/<name>.so``, e.g. ``backends_cuda/prebuilt/dsa_ops_cuda_sm90a.so``;
3. a JIT build with ninja through ``torch.utils.cpp_extension`` into
   ``~/.cache/dsa_ops/<torch version>-<hash of sources and flags>/`` (the root is
   ``$TORCH_EXTENSIONS_DIR/dsa_ops`` when torch's variable is set, or ``build_root`` when a caller
   passes one). A cached build is reused by later processes; editing any source or header changes
   the hash, so a stale library is never picked up.

Nothing here runs at import: the first call of an op (or ``build()``) triggers it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Optional

import torch

log = logging.getLogger("dsa_ops")

# Oldest torch whose stable ABI the libraries target: the GPU machine runs 2.11, and a library built
# against 2.11 headers loads under every later torch up to 2.14.
TORCH_TARGET_VERSION_FLAG = "-DTORCH_TARGET_VERSION=0x020b000000000000"


def binding_headers() -> tuple[Path, list]:
    """The folder of the helpers every backend's bindings share (dsa_ops/csrc) and its files."""
    import dsa_ops

    d = Path(dsa_ops.__file__).resolve().parent / "csrc"
    return d, sorted(p for p in d.glob("*.h"))


def announce(msg: str) -> None:
    """A line the user should see (a first-use compile takes tens of seconds)."""
    log.warning(msg)
    # With no handler configured, logging's last-resort handler already wrote it to stderr.
    if log.hasHandlers():
        print(msg, file=sys.stderr, flush=True)


def cache_root(build_root: Optional[os.PathLike] = None) -> Path:
    if build_root is not None:
        return Path(build_root)
    torch_dir = os.environ.get("TORCH_EXTENSIONS_DIR")
    if torch_dir:
        return Path(torch_dir) / "dsa_ops"
    return Path.home() / ".cache" / "dsa_ops"


def find_cuda_home() -> Optional[str]:
    """The CUDA toolkit torch's cpp_extension builds with. Where torch found none (CUDA_HOME unset, no
    nvcc on PATH, no /usr/local/cuda link), take the newest /usr/local/cuda-X.Y that has nvcc and
    point cpp_extension at it."""
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        def version(nvcc: Path) -> tuple:
            return tuple(int(x) for x in nvcc.parent.parent.name[5:].split(".") if x.isdigit())

        found = sorted(Path("/usr/local").glob("cuda-*/bin/nvcc"), key=version)
        if found:
            home = str(found[-1].parent.parent)
            cpp_extension.CUDA_HOME = home
            os.environ.setdefault("CUDA_HOME", home)
            log.info("dsa_ops: using the CUDA toolkit at %s", home)
    return cpp_extension.CUDA_HOME


def cuda_arch_name(capability: tuple[int, int]) -> str:
    """sm_90a for (9, 0), sm_100a for (10, 0): arch-specific targets from Hopper on, plain below."""
    major, minor = capability
    return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"


def nvcc_gencode(arch: str) -> str:
    """-gencode for one cubin of `arch` (sm_90a -> compute_90a / sm_90a)."""
    return f"-gencode=arch=compute_{arch[3:]},code={arch}"


@dataclass
class BuildSpec:
    """Everything that determines one library binary."""

    name: str  # file name without .so; also the prebuilt's name, e.g. dsa_ops_cuda_sm90a
    what: str  # for the log line, e.g. "CUDA kernels for sm_90a"
    sources: list  # compiled files
    depends: list  # hashed too (headers, .hip files a generated wrapper includes)
    include_dirs: list
    cflags: list
    cuda_cflags: list
    ldflags: list = field(default_factory=list)
    # Writes generated sources into the build directory and returns their paths (the HIP compat build
    # on NVIDIA wraps each .hip in a .cu so nvcc compiles it). Their inputs must be in `depends`.
    generate: Optional[Callable[[Path], list]] = None

    def digest(self) -> str:
        h = hashlib.sha256()
        h.update(torch.__version__.encode())
        for flags in (self.cflags, self.cuda_cflags, self.ldflags):
            h.update(repr(flags).encode())
        for f in sorted({Path(p) for p in list(self.sources) + list(self.depends)}):
            h.update(f.name.encode())
            h.update(f.read_bytes())
        return h.hexdigest()[:16]


class Library:
    """One backend's compiled library: finds, builds and loads it once per process."""

    def __init__(self, backend: str, namespace: str, package_dir: Path, env_var: str,
                 handover: Optional[Callable[[], ContextManager]] = None):
        self.backend = backend
        self.namespace = namespace  # torch.ops.<namespace> holds the library's ops
        self.package_dir = Path(package_dir)
        self.env_var = env_var
        self.path: Optional[str] = None  # the loaded file
        self.arch: Optional[str] = None  # what it was loaded for
        self.from_prebuilt = False
        # A context manager around the load (and the attributes' update), for libraries that register
        # kernels for ops Python registered first (backends_cuda: the top-k family's CUDA key).
        self.handover = handover
        self._lock = threading.Lock()

    def prebuilt(self, name: str) -> Optional[Path]:
        env = os.environ.get(self.env_var)
        if env:
            return Path(env)
        p = self.package_dir / "prebuilt" / f"{name}.so"
        return p if p.is_file() else None

    def why_not(self, arch: str, name: str, toolchain_missing: Callable[[], Optional[str]]) -> Optional[str]:
        """None when the library for `arch` is loaded or can be loaded or built here, else why not."""
        if self.path is not None:
            if self.arch != arch:
                return f"{self.backend} library already loaded for {self.arch}; this device needs {arch}"
            return None
        pre = self.prebuilt(name)
        if pre is not None:
            return None if pre.is_file() else f"{self.env_var}={pre} does not exist"
        return toolchain_missing()

    def load(self, spec: BuildSpec, arch: str, *, force_build: bool = False, build_root=None,
             verbose: bool = False) -> str:
        """Load the library for `arch` (building it if needed) and return its path."""
        with self._lock:
            if self.path is not None:
                if self.arch != arch:
                    raise RuntimeError(
                        f"dsa_ops: the {self.backend} library for {self.arch} is loaded in this process; "
                        f"one for {arch} cannot be loaded next to it (both register the same ops)")
                if force_build and self.from_prebuilt:
                    raise RuntimeError(
                        f"dsa_ops: a prebuilt {self.backend} library ({self.path}) is already loaded in this "
                        f"process; build in a fresh process without {self.env_var} or prebuilt/ files")
                return self.path
            with self.handover() if self.handover is not None else contextlib.nullcontext():
                pre = None if force_build else self.prebuilt(spec.name)
                if pre is not None:
                    if not pre.is_file():
                        raise FileNotFoundError(f"dsa_ops: {self.env_var}={pre} does not exist")
                    torch.ops.load_library(str(pre))
                    path, self.from_prebuilt = str(pre), True
                else:
                    path = self._build(spec, build_root, verbose)
                self.path, self.arch = path, arch
            return path

    @staticmethod
    def build_dir(spec: BuildSpec, build_root=None) -> Path:
        """Where `spec` is built (ninja file, objects, the .so): one folder per torch version and source digest."""
        return cache_root(build_root) / f"{torch.__version__}-{spec.digest()}"

    def _build(self, spec: BuildSpec, build_root, verbose: bool) -> str:
        build_dir = self.build_dir(spec, build_root)
        so = build_dir / f"{spec.name}.so"
        # Built by an earlier process. While another process holds torch's build lock (build_dir/lock) the
        # file may be half-linked (8 pytest workers reaching a first use together hit one): wait on the lock
        # in cpp_extension.load below instead, which then loads it without rebuilding.
        if so.is_file() and not (build_dir / "lock").exists():
            try:
                torch.ops.load_library(str(so))
                return str(so)
            except OSError:
                log.warning("dsa_ops: %s did not load; rebuilding it in place", so)
        from torch.utils import cpp_extension

        if torch.version.hip is None:
            find_cuda_home()
        build_dir.mkdir(parents=True, exist_ok=True)
        sources = [str(s) for s in spec.sources]
        if spec.generate is not None:
            sources += [str(s) for s in spec.generate(build_dir)]
        announce(f"dsa_ops: compiling {spec.what} into {build_dir} (first use)...")
        t0 = time.perf_counter()
        path = cpp_extension.load(
            name=spec.name,
            sources=sources,
            extra_cflags=spec.cflags,
            extra_cuda_cflags=spec.cuda_cflags,
            extra_ldflags=spec.ldflags,
            extra_include_paths=[str(d) for d in spec.include_dirs],
            build_directory=str(build_dir),
            verbose=verbose,
            is_python_module=False,  # a plain library of torch ops, loaded with torch.ops.load_library
        )
        announce(f"dsa_ops: compiling {spec.what} ... done in {time.perf_counter() - t0:.1f} s ({path})")
        return str(path)

    def op(self, name: str):
        """The loaded library's op `name` (an OpOverload: the cheapest way to call it from Python)."""
        try:
            return getattr(getattr(torch.ops, self.namespace), name).default
        except AttributeError:
            raise RuntimeError(
                f"dsa_ops: {self.path} does not register torch.ops.{self.namespace}.{name}: it was built "
                f"from older sources; rebuild it (or unset {self.env_var} / remove the prebuilt file)"
            ) from None
