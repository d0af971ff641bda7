"""GPU tests of the C++ kernels for the top-k family's CUDA key (backends_cuda/csrc/topk_route.cpp) and
their handoff to the Python router (dsa_ops._route): who serves which call, results, errors, forced
backends, torch.compile, fake tensors and CUDA-graph capture.
Run on the H200: `pytest -m gpu tests/test_gpu_topk_route.py`.
"""

from __future__ import annotations

import dsa_ops
import pytest
import torch
from dsa_ops import _route, registry
from dsa_ops.ops._common import map_through_page_table, window_topk
from dsa_ops.ops.topk_ragged_transform import reference as ragged_reference
from route_helpers import python_calls

pytestmark = pytest.mark.gpu
DEV = "cuda"
R, W, K, P = 4, 5000, 64, 64


@pytest.fixture(scope="module", autouse=True)
def loaded():
    dsa_ops.topk(torch.randn(1, 128, device=DEV), 4)  # loads (or builds) the CUDA library
    torch.cuda.synchronize()
    assert not any(_route.python_routed(op) for op in ("topk", "topk_page_table_transform", "topk_ragged_transform"))


def inputs(seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    scores = torch.randn(R, W, device=DEV, generator=g)
    lengths = torch.tensor([W, 3000, 10, 0], dtype=torch.int32, device=DEV)
    starts = torch.tensor([0, 1000, 5, 7], dtype=torch.int32, device=DEV)
    table = torch.randint(0, 1000, (R, (W + P - 1) // P), dtype=torch.int32, device=DEV, generator=g)
    offsets = torch.tensor([0, 100, 2**31 - 5, 7], dtype=torch.int32, device=DEV)
    return scores, lengths, starts, table, offsets


def _as_set(idx):
    """Each row sorted, -1s last: the default (filter) kernel's order is unspecified."""
    return torch.where(idx < 0, 2**31 - 1, idx).sort(dim=1).values


def calls():
    """(name, fn, expected) for every op and form, on the C++ fast path's arguments."""
    s, n, st, t, off = inputs()
    raw = window_topk(s, K, n, st)
    ragged = ragged_reference(s, off, n, K, st)
    mapped = map_through_page_table(raw, t, None, None, P)
    out, out_raw = torch.full_like(raw, 7), torch.full_like(raw, 7)

    def page_out():
        torch.ops.dsa.topk_page_table_transform.out(s, t, n, K, row_starts=st, page_size=P, deterministic=True,
                                                    out=out, out_raw=out_raw)
        return out, out_raw

    # nan_first=True on rows with NaNs: fewer than K (row 0), more than K (row 1), in a short window (row 2)
    sn = s.clone()
    sn[0, ::401] = float("nan")
    sn[1, 1000:1000 + 2 * K] = float("nan")
    sn[2, 5:9] = float("nan")
    raw_n = window_topk(sn, K, n, st, nan_first=True)
    mapped_n = map_through_page_table(raw_n, t, None, None, P)
    ragged_n = ragged_reference(sn, off, n, K, st, True)
    out_n, out_raw_n = torch.full_like(raw, 7), torch.full_like(raw, 7)

    def page_out_n():
        torch.ops.dsa.topk_page_table_transform.out(sn, t, n, K, row_starts=st, page_size=P, deterministic=True,
                                                    nan_first=True, out=out_n, out_raw=out_raw_n)
        return out_n, out_raw_n

    return [
        ("topk", lambda: torch.ops.dsa.topk(s, K, lengths=n, row_starts=st, deterministic=True), raw),
        ("topk_unordered", lambda: _as_set(torch.ops.dsa.topk(s, K, lengths=n, row_starts=st)), _as_set(raw)),
        ("page", lambda: torch.ops.dsa.topk_page_table_transform(s, t, n, K, row_starts=st, page_size=P,
                                                                 deterministic=True), mapped),
        ("page_out", page_out, (mapped, raw)),
        ("ragged", lambda: _as_set(torch.ops.dsa.topk_ragged_transform(s, off, n, K, row_starts=st)), _as_set(ragged)),
        ("topk_nan_first", lambda: torch.ops.dsa.topk(sn, K, lengths=n, row_starts=st, deterministic=True,
                                                      nan_first=True), raw_n),
        ("topk_unordered_nan_first", lambda: _as_set(torch.ops.dsa.topk(sn, K, lengths=n, row_starts=st,
                                                                        nan_first=True)), _as_set(raw_n)),
        ("page_nan_first", lambda: torch.ops.dsa.topk_page_table_transform(
            sn, t, n, K, row_starts=st, page_size=P, deterministic=True, nan_first=True), mapped_n),
        ("page_out_nan_first", page_out_n, (mapped_n, raw_n)),
        ("ragged_nan_first", lambda: _as_set(torch.ops.dsa.topk_ragged_transform(sn, off, n, K, row_starts=st,
                                                                                 nan_first=True)),
         _as_set(ragged_n)),
    ]


N_CALLS = 10


def _same(got, want):
    if isinstance(want, tuple):
        return all(_same(g, w) for g, w in zip(got, want))
    return torch.equal(got, want)


@pytest.mark.parametrize("i", range(N_CALLS))
def test_cpp_kernel_serves_default_calls_exactly(i):
    name, fn, want = calls()[i]
    got = fn()  # warm
    assert python_calls(fn) == [], f"{name}: the Python router ran"
    assert _same(fn(), want), name
    del got


@pytest.mark.parametrize("i", range(N_CALLS))
def test_forced_reference_goes_through_the_router(i):
    name, fn, want = calls()[i]
    with dsa_ops.use_backend("reference"):
        seen = python_calls(fn)
        assert any("<dsa::" in c for c in seen), f"{name}: not routed to Python"
        assert _same(fn(), want), name
    assert python_calls(fn) == [], f"{name}: the C++ kernel did not take over again"


def test_forced_triton_raises_todays_dispatch_error():
    s = torch.randn(2, 100, device=DEV)
    with dsa_ops.use_backend("triton"):
        with pytest.raises(dsa_ops.DispatchError, match="forced") as api:
            dsa_ops.topk(s, 4)
        with pytest.raises(RuntimeError, match="forced") as raw:  # the raw op: today's message
            torch.ops.dsa.topk(s, 4)
    assert str(api.value) in str(raw.value)


@pytest.mark.parametrize("case", ["k0", "lengths_cpu", "lengths_int64", "stride", "out_shape", "page_size"])
def test_bad_arguments_give_todays_errors(case):
    s, n, st, t, off = inputs()
    out = torch.empty(R, K, dtype=torch.int32, device=DEV)
    api, raw = {
        "k0": (lambda: dsa_ops.topk(s, 0), lambda: torch.ops.dsa.topk(s, 0)),
        "lengths_cpu": (lambda: dsa_ops.topk(s, K, lengths=n.cpu()),
                        lambda: torch.ops.dsa.topk(s, K, lengths=n.cpu())),
        "lengths_int64": (lambda: dsa_ops.topk_ragged_transform(s, off, n.long(), K),
                          lambda: torch.ops.dsa.topk_ragged_transform(s, off, n.long(), K)),
        "stride": (lambda: dsa_ops.topk(s[:, ::2], K), lambda: torch.ops.dsa.topk(s[:, ::2], K)),
        "out_shape": (lambda: dsa_ops.topk_page_table_transform(s, t, n, K, out=out[:, :-1]),
                      lambda: torch.ops.dsa.topk_page_table_transform.out(s, t, n, K, out=out[:, :-1])),
        "page_size": (lambda: dsa_ops.topk_page_table_transform(s, t, n, K, page_size=48),
                      lambda: torch.ops.dsa.topk_page_table_transform(s, t, n, K, page_size=48)),
    }[case]
    with pytest.raises(dsa_ops.DsaArgumentError) as want:
        with dsa_ops.use_backend("reference"):  # the router's own error, as the Python path raises it
            api()
    with pytest.raises(dsa_ops.DsaArgumentError) as got:
        api()
    assert str(got.value) == str(want.value)
    with pytest.raises(RuntimeError) as got_raw:
        raw()
    assert str(want.value) in str(got_raw.value)


def test_fake_tensors_and_compile():
    s, n, st, t, off = inputs()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fs = mode.from_tensor(s)
        assert torch.ops.dsa.topk(fs, K).shape == (R, K)

    def f(s, n, st, t):
        idx = dsa_ops.topk(s, K, lengths=n, row_starts=st, deterministic=True)
        return idx, dsa_ops.topk_page_table_transform(s, t, n, K, row_starts=st, deterministic=True)

    got = torch.compile(f, fullgraph=True, dynamic=True)(s, n, st, t)
    want = f(s, n, st, t)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_cuda_graph_capture():
    s, n, st, t, off = inputs()
    out = torch.empty(R, K, dtype=torch.int32, device=DEV)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dsa_ops.topk(s, K, lengths=n, row_starts=st, deterministic=True)  # warm on the side stream
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=stream):
            idx = torch.ops.dsa.topk(s, K, lengths=n, row_starts=st, deterministic=True)
            torch.ops.dsa.topk_page_table_transform.out(s, t, n, K, row_starts=st, deterministic=True, out=out)
    s.copy_(inputs(seed=1)[0])
    g.replay()
    torch.cuda.synchronize()
    raw = window_topk(s, K, n, st)
    assert torch.equal(idx, raw)
    assert torch.equal(out, map_through_page_table(raw, t, None, None, 64))


def test_registry_notifications_turn_the_kernel_off_and_on():
    s = torch.randn(2, 100, device=DEV)
    p = registry.providers("topk")["cuda"]
    registry.register_provider(registry.Provider("topk", "cuda", p.fn, p.supports, p.available))
    try:
        assert python_calls(lambda: torch.ops.dsa.topk(s, 4)) != []
    finally:
        registry.register_provider(p)
    assert python_calls(lambda: torch.ops.dsa.topk(s, 4)) == []
