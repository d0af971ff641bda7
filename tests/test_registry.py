"""Provider selection: forced backends, clear errors listing what was tried, and `info`."""

import subprocess
import sys

import pytest
import torch
from dsa_ops import registry
from dsa_ops.registry import DispatchError, Provider


@pytest.fixture
def fake_op():
    op = "_test_op"
    calls = []
    registry.register_provider(Provider(op, "triton", lambda *a: calls.append("triton"),
                                        supports=lambda x: None if x.shape[0] < 4 else "too many rows",
                                        available=lambda dev: None))
    registry.register_provider(Provider(op, "cuda", lambda *a: calls.append("cuda"),
                                        supports=lambda x: None, available=lambda dev: "needs sm_90"))
    yield op, calls
    registry._providers.pop(op)


def test_automatic_order_skips_unavailable(fake_op):
    op, calls = fake_op
    registry.select(op, (torch.zeros(2),)).fn()
    assert calls == ["triton"]


def test_error_lists_every_backend_tried(fake_op):
    op, _ = fake_op
    with pytest.raises(DispatchError) as e:
        registry.select(op, (torch.zeros(8),))
    msg = str(e.value)
    assert "cuda: needs sm_90" in msg and "hip: no hip kernel" in msg and "triton: too many rows" in msg


def test_forced_backend_never_falls_back(fake_op):
    op, _ = fake_op
    with registry.use_backend("cuda"):
        with pytest.raises(DispatchError, match="forced"):
            registry.select(op, (torch.zeros(2),))
    with pytest.raises(DispatchError, match="not one of"):
        with registry.use_backend("tpu"):
            pass


def test_reference_backend_serves_every_op_when_forced():
    from dsa_ops._define import OPS

    with registry.use_backend("reference"):
        for op in OPS:
            assert registry.select(op, (torch.zeros(1),)).backend == "reference"


def test_env_var_is_validated():
    r = subprocess.run([sys.executable, "-c", "import dsa_ops"], env={"DSA_OPS_BACKEND": "bogus", "PATH": ""},
                       capture_output=True, text=True)
    assert r.returncode != 0 and "DSA_OPS_BACKEND='bogus'" in r.stderr


def test_info_lists_all_ten_ops():
    r = subprocess.run([sys.executable, "-m", "dsa_ops", "info"], capture_output=True, text=True, check=True)
    for op in ("indexer_logits", "paged_indexer_logits", "topk", "topk_page_table_transform", "topk_ragged_transform",
               "page_table_transform", "indexer_topk", "dequant_k_cache_paged", "sparse_attention",
               "sparse_mla_decode"):
        assert op in r.stdout
    assert "10 ops" in r.stdout


def test_demo_runs_on_cpu():
    r = subprocess.run([sys.executable, "-m", "dsa_ops", "demo", "--device", "cpu", "--rows", "8", "--keys", "4096"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "equals the reference: True" in r.stdout


def test_reference_module_runs_every_op_directly():
    import dsa_ops
    from op_samples import samples

    for name, (op, args, kwargs) in samples().items():
        if name.endswith(".out"):
            continue
        got = getattr(dsa_ops.reference, name)(*args, **kwargs)
        want = op(*args, **kwargs)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert torch.equal(g, w), name
