"""A non-editable install (`pip install .`, a wheel) carries every package and every kernel source.

An editable install reads the tree itself, so a subpackage missing from pyproject's `packages`, or a
header in a folder that `package-data` does not match, passes every other test and breaks only the
user who installs a wheel: the import fails, or the first-use CUDA build cannot find a source.
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parent.parent
# Folders whose files the JIT builds and the bindings include (backends_*/_jit.py, dsa_ops/csrc).
SOURCE_FOLDERS = ("include", "kernels", "csrc")


def _setuptools_config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _package_dirs() -> dict[str, Path]:
    """Every package named in `packages`, mapped to its folder through `package-dir`."""
    cfg = _setuptools_config()
    roots = cfg["package-dir"]
    dirs = {}
    for pkg in cfg["packages"]:
        # The longest mapped prefix decides the folder (dsa_ops.backends.cuda before dsa_ops).
        prefix = max((p for p in roots if pkg == p or pkg.startswith(p + ".")), key=len)
        rest = pkg[len(prefix):].lstrip(".").split(".") if pkg != prefix else []
        dirs[pkg] = ROOT.joinpath(roots[prefix], *rest)
    return dirs


def test_every_python_package_is_listed():
    dirs = _package_dirs()
    for pkg, d in dirs.items():
        assert (d / "__init__.py").is_file(), f"{pkg} maps to {d}, which is no package"
    listed = {d.resolve() for d in dirs.values()}
    for d in set(dirs.values()):
        for init in d.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            assert init.parent.resolve() in listed, (
                f"{init.parent.relative_to(ROOT)} is a package that pyproject's `packages` leaves out of a wheel")


def test_every_kernel_source_is_package_data():
    cfg = _setuptools_config()
    data = cfg["package-data"]
    checked = 0
    for pkg, d in _package_dirs().items():
        for folder in SOURCE_FOLDERS:
            if not (d / folder).is_dir():
                continue
            files = {p for p in (d / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
            # setuptools expands package-data patterns with glob(recursive=True) from the package folder.
            shipped = {Path(f) for pattern in data.get(pkg, [])
                       for f in glob.glob(str(d / pattern), recursive=True)}
            missing = sorted(str(p.relative_to(ROOT)) for p in files - shipped)
            assert not missing, f"package-data of {pkg} does not ship {missing}"
            checked += len(files)
    assert checked > 50, f"only {checked} source files found: the package map no longer points at the kernels"
