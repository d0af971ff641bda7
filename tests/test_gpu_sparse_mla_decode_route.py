"""GPU tests of the C++ kernel for dsa.sparse_mla_decode's CUDA key (backends_cuda/csrc/sparse_mla_decode_route.cpp)
and its handoff to the Python router (dsa_ops._route): who serves which call, results bitwise equal to the cuda
provider's Python launch, errors, forced backends, declined shapes, the split rule's C++ copy, torch.compile, fake
tensors and CUDA-graph capture. Caches NaN-filled except the slots in use (tests/sparse_mla_decode_cases.py).
Run on the H200: `pytest -m gpu tests/test_gpu_sparse_mla_decode_route.py`.
"""

from __future__ import annotations

import dsa_ops
import pytest
import torch
from dsa_ops import _route
from route_helpers import python_calls, replayed
from sparse_mla_decode_cases import compare, make_case, oracle

pytestmark = pytest.mark.gpu
DEV = "cuda"
SCALE = {"v32": 576**-0.5, "v4": 512**-0.5}

if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)
if torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("the route serves SM90 here (SM100: compiled, not run)", allow_module_level=True)
mc = pytest.importorskip("dsa_ops.backends.cuda.providers_sparse_mla_decode")


@pytest.fixture(scope="module", autouse=True)
def loaded():
    q, cache, idx, _, _ = make_case("v32", 1, 1, 64, 64, page=64, num_blocks=4, device=DEV)
    dsa_ops.sparse_mla_decode(q, cache, idx, softmax_scale=1.0)  # loads (or builds) the CUDA library
    torch.cuda.synchronize()
    assert not _route.python_routed("sparse_mla_decode")


def _case(layout, batch=2, heads=64, topk=512, extras=True, seed=3):
    lens = [topk // 3 if i == 1 else topk for i in range(batch)] if extras else None
    return make_case(layout, batch, 2, heads, topk, page=64, num_blocks=64, seed=seed, lens=lens, sink=extras,
                     device=DEV)


def _check(out, lse, case, layout):
    q, cache, idx, lens, sink = case
    err = compare(out, lse, *oracle(q, cache, idx, SCALE[layout], layout, lens, sink))
    assert err is None, err


def _op(case, layout):
    q, cache, idx, lens, sink = case
    return lambda: dsa_ops.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE[layout], layout=layout,
                                             topk_lens=lens, attn_sink=sink)


@pytest.mark.parametrize("layout", ["v32", "v4"])
@pytest.mark.parametrize("extras", [False, True])
@pytest.mark.parametrize("batch,heads", [(1, 64), (2, 128), (40, 64)])
def test_cpp_kernel_serves_default_calls_bitwise_as_the_provider(layout, extras, batch, heads):
    case = _case(layout, batch, heads, extras=extras)
    fn = _op(case, layout)
    fn()
    assert python_calls(fn) == [], "the Python router ran"
    out, lse = fn()
    want_out, want_lse = mc.launch(case[0], case[1], case[2], SCALE[layout], layout, case[3], case[4])
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    _check(out, lse, case, layout)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_forced_backends_go_through_the_router(backend):
    case = _case("v32")
    fn = _op(case, "v32")
    with dsa_ops.use_backend(backend):
        assert any("<dsa::" in c for c in python_calls(fn)), "not routed to Python"
        out, lse = fn()
    _check(out, lse, case, "v32")
    assert python_calls(fn) == [], "the C++ kernel did not take over again"


def test_declined_heads_go_to_the_router_and_triton():
    """32 heads: the CUDA kernel takes multiples of 64, so the router picks Triton."""
    case = _case("v32", heads=32)
    fn = _op(case, "v32")
    assert any("<dsa::" in c for c in python_calls(fn))
    out, lse = fn()
    _check(out, lse, case, "v32")


@pytest.mark.parametrize("bad", ["layout", "q_dtype", "q_dim", "indices_cpu", "lens_shape", "sink_dtype"])
def test_bad_arguments_give_the_routers_errors(bad):
    q, cache, idx, lens, sink = _case("v32")
    kw = dict(softmax_scale=1.0, layout="v32", topk_lens=lens, attn_sink=sink)
    args = [q, cache, idx]
    if bad == "layout":
        kw["layout"] = "v5"
    elif bad == "q_dtype":
        args[0] = q.float()
    elif bad == "q_dim":
        args[0] = q[..., :512]
    elif bad == "indices_cpu":
        args[2] = idx.cpu()
    elif bad == "lens_shape":
        kw["topk_lens"] = lens[:1]
    else:
        kw["attn_sink"] = sink.double()
    with pytest.raises(dsa_ops.DsaArgumentError) as want:
        with dsa_ops.use_backend("reference"):  # the router's own error, as the Python path raises it
            dsa_ops.sparse_mla_decode(*args, **kw)
    with pytest.raises(dsa_ops.DsaArgumentError) as got:
        dsa_ops.sparse_mla_decode(*args, **kw)
    assert str(got.value) == str(want.value)
    with pytest.raises(RuntimeError) as got_raw:
        torch.ops.dsa.sparse_mla_decode(*args, **{k: v for k, v in kw.items() if v is not None})
    assert str(want.value) in str(got_raw.value)


def test_split_rule_is_the_providers():
    ns = torch.ops.dsa_cuda
    for sms in (78, 132, 148):
        for batch in (1, 2, 3, 4, 7, 8, 16, 33, 64, 128):
            for s_q in (1, 2, 4):
                for heads in (64, 128):
                    for topk in (1, 64, 127, 128, 512, 2047, 2048, 8192):
                        want = mc.split_count(batch, s_q, heads, topk, sms)
                        assert ns.sparse_mla_decode_split_count(batch, s_q, heads, topk, sms) == want


def test_fake_tensors_compile_and_capture():
    case = _case("v4", extras=True)
    q, cache, idx, lens, sink = case
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fq, fc, fi = (mode.from_tensor(t) for t in (q, cache, idx))
        o, s = torch.ops.dsa.sparse_mla_decode(fq, fc, fi, softmax_scale=1.0, layout="v4")
        assert o.shape == (2, 2, 64, 512) and s.shape == (2, 64, 2)

    def f(q, cache, idx, lens, sink):
        return dsa_ops.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE["v4"], layout="v4", topk_lens=lens,
                                         attn_sink=sink)

    want = f(*case)
    got = torch.compile(f, fullgraph=True)(*case)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    go, gl = replayed(lambda: torch.ops.dsa.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE["v4"], layout="v4",
                                                              topk_lens=lens, attn_sink=sink))
    assert torch.equal(go, want[0]) and torch.equal(gl, want[1])
