"""CPU tests of the JIT cache's reuse rule (backends_cuda/_jit.py): a library built by an earlier process is
loaded directly only when no other process holds torch's build lock on its directory; otherwise, or when the
file does not load, the build path (which waits on that lock) takes over."""

from __future__ import annotations

import pytest
import torch
import torch.utils.cpp_extension
from dsa_ops.backends.cuda import _jit


@pytest.fixture
def setup(tmp_path, monkeypatch):
    src = tmp_path / "k.cu"
    src.write_text("// kernel\n")
    spec = _jit.BuildSpec(name="libk", what="test kernels", sources=[src], depends=[], include_dirs=[], cflags=[],
                          cuda_cflags=[])
    build_dir = tmp_path / "cache" / f"{torch.__version__}-{spec.digest()}"
    build_dir.mkdir(parents=True)
    (build_dir / "libk.so").write_bytes(b"\x7fELF")
    calls = {"load_library": 0, "build": 0}

    def load_library(path):
        calls["load_library"] += 1
        if calls.get("fail"):
            raise OSError("half-written")

    def build(**kw):
        calls["build"] += 1
        return str(build_dir / "libk.so")

    monkeypatch.setattr(torch.ops, "load_library", load_library)
    monkeypatch.setattr(torch.utils.cpp_extension, "load", build)
    monkeypatch.setattr(_jit, "find_cuda_home", lambda: None)
    lib = _jit.Library("cuda", "dsa_test", tmp_path, env_var="DSA_TEST_LIB")
    return lib, spec, build_dir, calls, tmp_path / "cache"


def test_reuses_a_finished_build(setup):
    lib, spec, _, calls, root = setup
    lib._build(spec, root, verbose=False)
    assert calls == {"load_library": 1, "build": 0}


def test_waits_while_another_process_builds(setup):
    lib, spec, build_dir, calls, root = setup
    (build_dir / "lock").touch()
    lib._build(spec, root, verbose=False)
    assert calls == {"load_library": 0, "build": 1}


def test_a_file_that_does_not_load_goes_to_the_build(setup):
    lib, spec, _, calls, root = setup
    calls["fail"] = True
    lib._build(spec, root, verbose=False)
    assert calls["load_library"] == 1 and calls["build"] == 1
