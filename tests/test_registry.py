"""Provider selection: forced backends, clear errors listing what was tried, and `info`."""

import subprocess
import sys

import dsa_ops
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
    registry.unregister_provider(op)


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
        got = getattr(dsa_ops.reference, name.split("[")[0])(*args, **kwargs)
        want = op(*args, **kwargs)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert torch.equal(g, w), name


# The provider choice is cached per (op, device, forced backend); these show it never serves stale.


def test_cache_follows_use_backend(fake_op):
    op, calls = fake_op
    x = torch.zeros(2)
    assert registry.select(op, (x,)).backend == "triton"  # cached for the automatic order
    with registry.use_backend("cuda"):
        with pytest.raises(DispatchError, match="forced"):
            registry.select(op, (x,))
    with registry.use_backend("reference"):
        with pytest.raises(DispatchError, match="reference: no reference kernel"):
            registry.select(op, (x,))
    with registry.use_backend("triton"):
        assert registry.select(op, (x,)).backend == "triton"
    assert registry.select(op, (x,)).backend == "triton"


def test_cache_never_serves_a_call_supports_declines(fake_op):
    op, _ = fake_op
    assert registry.select(op, (torch.zeros(2),)).backend == "triton"
    with pytest.raises(DispatchError, match="triton: too many rows"):
        registry.select(op, (torch.zeros(8),))
    # A provider later in the order serves what the first declines, call by call.
    registry.register_provider(Provider(op, "hip", lambda *a: None, supports=lambda x: None,
                                        available=lambda dev: None))
    assert registry.select(op, (torch.zeros(2),)).backend == "hip"
    registry.unregister_provider(op, "hip")
    assert registry.select(op, (torch.zeros(2),)).backend == "triton"


def test_cache_follows_register_and_unregister(fake_op):
    op, calls = fake_op
    assert registry.select(op, (torch.zeros(2),)).backend == "triton"
    registry.register_provider(Provider(op, "cuda", lambda *a: calls.append("cuda2"), supports=lambda x: None,
                                        available=lambda dev: None))
    registry.select(op, (torch.zeros(8),)).fn()
    assert calls == ["cuda2"]
    registry.unregister_provider(op, "cuda")
    with pytest.raises(DispatchError, match="cuda: no cuda kernel"):
        registry.select(op, (torch.zeros(8),))


def test_cache_is_per_device(fake_op):
    op, _ = fake_op
    registry.register_provider(Provider(op, "hip", lambda *a: None, supports=lambda x: None,
                                        available=lambda dev: None if dev.type == "meta" else "meta only"))
    assert registry.select(op, (torch.zeros(2, device="meta"),)).backend == "hip"
    assert registry.select(op, (torch.zeros(2),)).backend == "triton"
    assert registry.select(op, (torch.zeros(2, device="meta"),)).backend == "hip"


@pytest.fixture
def stub_topk_on_cpu():
    """The real dsa.topk router (the function dsa_ops registers for the CUDA key), run on CPU with a
    stub "triton" provider of topk (triton has no topk kernel, so nothing real is displaced)."""
    from dsa_ops._define import OPS

    calls = []

    def fn(scores, k, lengths, row_starts, deterministic, nan_first):
        calls.append((k, lengths is not None, row_starts is not None, deterministic))
        return torch.full((scores.shape[0], k), 7, dtype=torch.int32)

    registry.register_provider(Provider("topk", "triton", fn, supports=lambda s, k, *a: None if k <= 4 else "k > 4",
                                        available=lambda dev: None))
    yield OPS["topk"].device_impl, calls
    registry.unregister_provider("topk", "triton")


def test_router_uses_the_current_provider(stub_topk_on_cpu):
    router, calls = stub_topk_on_cpu
    x = torch.randn(2, 16)
    assert router(x, 3).eq(7).all()  # automatic order: cuda and hip are unavailable for CPU tensors
    assert router(x, 2, lengths=torch.ones(2, dtype=torch.int32), deterministic=True).shape == (2, 2)
    assert calls == [(3, False, False, False), (2, True, False, True)]
    with pytest.raises(DispatchError, match="triton: k > 4"):
        router(x, 5)  # the cached triton provider declines: nothing else serves, nothing falls back
    with registry.use_backend("reference"):
        assert torch.equal(router(x, 5), dsa_ops.reference.topk(x, 5))
    with registry.use_backend("cuda"):
        with pytest.raises(DispatchError, match="forced"):
            router(x, 3)
    assert len(calls) == 2
    with pytest.raises(dsa_ops.DsaArgumentError, match="`k` must be >= 1"):  # validation still runs first
        router(x, 0)


def test_generated_impls_have_the_schema_signature():
    import inspect

    from dsa_ops._define import _NO_DEFAULT, OPS

    for name, d in OPS.items():
        impls = [(d.device_impl, d.arg_names, d.defaults)]
        if d.out is not None:
            impls.append((d.out_device_impl, d.out_arg_names, d.out_defaults))
        for fn, names, defaults in impls:
            params = list(inspect.signature(fn).parameters.values())
            assert tuple(p.name for p in params) == names, name
            for p, want in zip(params, defaults):
                assert (p.default is inspect.Parameter.empty) == (want is _NO_DEFAULT), (name, p.name)
                if want is not _NO_DEFAULT:
                    assert p.default == want, (name, p.name)


# Per-shape preferences: a measured rule names the backend tried first in the automatic order.


@pytest.fixture
def two_providers():
    op, calls = "_test_pref_op", []
    for b in ("cuda", "triton"):
        registry.register_provider(Provider(op, b, lambda *a, b=b: calls.append(b),
                                            supports=lambda x, b=b: "declines" if x.shape[0] == 3 and b == "triton"
                                            else None, available=lambda dev: None))
    registry.set_preference(op, lambda x: "triton" if x.shape[0] >= 2 else None, "triton from 2 rows")
    yield op, calls
    registry.set_preference(op, None)
    registry.unregister_provider(op)


def test_preference_picks_the_measured_backend(two_providers):
    op, _ = two_providers
    assert registry.select(op, (torch.zeros(1),)).backend == "cuda"  # rule says None: the order
    assert registry.select(op, (torch.zeros(2),)).backend == "triton"
    assert registry.select(op, (torch.zeros(3),)).backend == "cuda"  # triton declines: the order serves
    assert registry.preferred_backend(op, (torch.zeros(5),)) == "triton"
    with registry.use_backend("cuda"):  # forcing ignores the rule
        assert registry.select(op, (torch.zeros(2),)).backend == "cuda"
    with registry.use_backend("triton"):
        with pytest.raises(DispatchError, match="triton: declines"):
            registry.select(op, (torch.zeros(3),))
    assert any(r[0] == op and "by shape: triton from 2 rows" in r[2] for r in registry.describe(None))


def test_indexer_rules_follow_the_measurements():
    """dsa.indexer_logits: Triton from 4096 rows and 32768 keys at 32 or 64 heads for bf16 and for fp8 in the
    exact mode with overlapping kv rows (every measured row); fp8 with rows 128 bytes apart (the CUDA TMA
    kernels, both modes), everything else, and the paged op keep the CUDA-first order."""

    def dense(t, n, h=64, dtype=torch.float8_e4m3fn, precise=False, overlapping=False):
        m = "meta"
        q = torch.empty(t, h, 128, dtype=dtype, device=m)
        kv = torch.empty(n + 1, 64, dtype=dtype, device=m).as_strided((n, 128), (64, 1)) if overlapping else (
            torch.empty(n, 128, dtype=dtype, device=m))
        s = torch.empty(n, device=m) if dtype == torch.float8_e4m3fn else None
        ks = torch.empty(t, dtype=torch.int32, device=m)
        return registry.preferred_backend("indexer_logits", (q, kv, s, torch.empty(t, h, device=m), ks, ks,
                                                             True, precise))

    for dtype, precise, over in ((torch.float8_e4m3fn, True, True), (torch.bfloat16, False, False),
                                 (torch.bfloat16, True, False)):
        kw = dict(dtype=dtype, precise=precise, overlapping=over)
        assert dense(4096, 32768, **kw) == "triton"
        assert dense(4096, 131072, **kw) == "triton"
        assert dense(4096, 32768, h=32, **kw) == "triton"
        assert dense(4095, 32768, **kw) is None
        assert dense(4096, 32767, **kw) is None
        assert dense(4096, 32768, h=16, **kw) is None
    for t, n, h in ((4096, 32768, 64), (4096, 131072, 64), (4096, 32768, 32), (128, 32768, 64)):
        for precise in (False, True):
            assert dense(t, n, h=h, precise=precise) is None
        assert dense(t, n, h=h, overlapping=True) is None
    q = torch.empty(64, 1, 64, 128, dtype=torch.float8_e4m3fn, device="meta")
    for precise in (False, True):
        assert registry.preferred_backend("paged_indexer_logits", (q, None, None, None, None, 65536, True,
                                                                   precise)) == "cuda"
