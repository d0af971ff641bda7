"""The handover of the CUDA key of the top-k family, sparse_mla_decode, sparse_attention and paged_indexer_logits to
compiled kernels (dsa_ops._route), without a GPU: registrations, the forced-backend flag the kernels follow, and the
error keeping of dsa_route."""

import warnings

import dsa_ops
import pytest
import torch
from dsa_ops import _route, registry
from dsa_ops.backends.cuda import providers_topk

OPS = providers_topk.ROUTED_OPS + ("sparse_mla_decode", "sparse_attention", "paged_indexer_logits")


def _has_cuda_kernel(name):
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA")


def test_routers_registered_for_both_namespaces():
    for op in OPS:
        assert _route.python_routed(op)
        assert _has_cuda_kernel(f"dsa::{op}") and _has_cuda_kernel(f"dsa_route::{op}")
    assert _has_cuda_kernel("dsa::topk_page_table_transform.out")
    assert _has_cuda_kernel("dsa_route::topk_page_table_transform.out")


def test_routers_fall_through_autograd():
    """A compiled kernel's router call on inputs that require grad must not attach torch's autograd-not-implemented
    node to the outputs: dsa_route's overloads fall through the Autograd key as the dsa ops do."""
    for op in OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"dsa_route::{op}", "Autograd")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("dsa_route::topk_page_table_transform.out", "Autograd")


def test_failed_load_restores_the_routers():
    with pytest.raises(OSError):
        with _route.handed_over(OPS):
            assert not any(_has_cuda_kernel(f"dsa::{op}") for op in OPS)
            raise OSError("load failed")
    assert all(_route.python_routed(op) and _has_cuda_kernel(f"dsa::{op}") for op in OPS)


def test_load_without_kernels_restores_the_routers():
    with _route.handed_over(OPS):
        pass  # a library that registers nothing for the key (e.g. built from older sources)
    assert all(_route.python_routed(op) and _has_cuda_kernel(f"dsa::{op}") for op in OPS)


def test_takeover_by_a_kernel_warns_nothing():
    """A kernel registered for the key after the handover replaces nothing (no override warning), and
    the router comes back when that registration goes (the test's stand-in for a library)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with _route.handed_over(["topk_ragged_transform"]):
            lib = torch.library.Library("dsa", "FRAGMENT")
            lib.impl("topk_ragged_transform", lambda *a, **k: None, "CUDA")
        assert not _route.python_routed("topk_ragged_transform")
        lib._destroy()
        _route._register("topk_ragged_transform")
    assert _route.python_routed("topk_ragged_transform")


def test_route_follows_forced_backend_and_providers():
    seen = []
    saved = dict(providers_topk._registered)
    providers_topk.start_route(registry, seen.append, 0b11)
    try:
        assert seen[-1] == 0b11
        for name, want in (("triton", 0), ("reference", 0), ("hip", 0), ("cuda", 0b11), (None, 0b11)):
            with dsa_ops.use_backend(name):
                assert seen[-1] == want, name
            assert seen[-1] == 0b11
        # Another cuda provider for one of the ops: the Python router must see every call.
        p = registry.providers("topk")["cuda"]
        registry.register_provider(registry.Provider("topk", "cuda", p.fn, p.supports, p.available))
        assert seen[-1] == 0
        registry.register_provider(p)
        assert seen[-1] == 0b11
    finally:
        registry._listeners.pop()
        providers_topk._registered.clear()
        providers_topk._registered.update(saved)


def test_route_devices_mask():
    ok = {0, 2}
    assert providers_topk.route_devices(lambda d: None if d.index in ok else "no", 3) == 0b101
    assert providers_topk.route_devices(lambda d: None, 0) == 0


def test_router_errors_reach_the_sink_and_the_api():
    """dsa_route's router (on CPU tensors here, through its CUDA function) hands the message to the
    library and keeps the exception; the API re-raises it for the kernel's RuntimeError copy."""
    from dsa_ops._define import OPS as DEFS

    messages = []
    _route.set_error_sink(messages.append)
    try:
        route = _route._keeping_errors(DEFS["topk"].device_impl)
        with pytest.raises(dsa_ops.DsaArgumentError) as e:
            route(torch.zeros(2, 8), 0)
        assert messages == [str(e.value)] and "`k` must be >= 1" in messages[0]
        copy = RuntimeError(messages[0])
        assert _route.original(copy) is e.value
        assert _route.original(copy) is copy  # taken once
    finally:
        _route.set_error_sink(None)
