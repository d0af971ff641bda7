"""GPU tests of the C++ kernels for dsa.sparse_attention's CUDA key (backends_cuda/csrc/sparse_attention_route.cpp)
and their handoff to the Python router (dsa_ops._route): who serves which call, results bitwise equal to the cuda
provider's Python launch (single pass, splits, split tail, persistent grid), the capture rule, errors, forced
backends, the split plan's C++ copy, fakes and torch.compile. Inputs from tests/sparse_attention_cases.py (unused
cache pages NaN, hostile indices). Run on the H200: `pytest -m gpu tests/test_gpu_sparse_attention_route.py`.
"""

from __future__ import annotations

import dsa_ops
import pytest
import torch
from dsa_ops import _route
from dsa_ops.ops.sparse_attention import reference
from route_helpers import python_calls
from sparse_attention_cases import FP8, compare, make_case

pytestmark = pytest.mark.gpu
DEV = "cuda"
SCALES = (128**-0.5, 0.7, 1.9)
KW = dict(softmax_scale=SCALES[0], k_scale=SCALES[1], v_scale=SCALES[2])

if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)
if torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("the route serves SM90 here (SM100: compiled, not run)", allow_module_level=True)
cu = pytest.importorskip("dsa_ops.backends.cuda.providers_sparse_attention")


def _case(rows, seed=0, layout="plain", topk=512):
    return make_case(rows, 24, 2, 128, 128, page=64, num_blocks=600, num_reqs=7, max_pages=256, topk=topk,
                     dtype=FP8, seed=seed, device=DEV, cache_layout=layout)


@pytest.fixture(scope="module", autouse=True)
def loaded():
    dsa_ops.sparse_attention(*_case(40), **KW)  # loads (or builds) the CUDA library
    torch.cuda.synchronize()
    assert not _route.python_routed("sparse_attention")


@pytest.mark.parametrize("rows,layout", [(1, "plain"), (16, "vllm"), (64, "plain"), (300, "vllm"), (600, "plain")])
def test_cpp_kernels_serve_eager_calls_bitwise_as_the_provider(rows, layout):
    case = _case(rows, seed=rows, layout=layout, topk=2048 if rows >= 300 else 512)
    out = torch.full((rows, 24, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
    fns = {"functional": lambda: dsa_ops.sparse_attention(*case, **KW),
           "out": lambda: dsa_ops.sparse_attention(*case, out=out, **KW)}
    want = torch.full_like(out, float("nan"))
    cu.launch(*case, *SCALES, want)
    for name, fn in fns.items():
        fn()
        assert python_calls(fn) == [], f"{name}: the Python router ran"
        got = fn()
        assert torch.equal(got, want), name
    assert compare(want, reference(*case, *SCALES)) is None


def test_small_captures_go_to_the_router_large_ones_not():
    for rows, routed in ((8, True), (31, True), (32, False), (40, False)):  # the rule: rows x 2 KV heads < 64
        case = _case(rows, seed=5)
        out = torch.empty((rows, 24, 128), dtype=torch.bfloat16, device=DEV)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            dsa_ops.sparse_attention(*case, out=out, **KW)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            seen = python_calls(lambda c=case, o=out: torch.ops.dsa.sparse_attention.out(*c, out=o, **KW))
        assert any("<dsa::" in c for c in seen) == routed, (rows, seen)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert compare(out, reference(*case, *SCALES)) is None


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_forced_backends_go_through_the_router(backend):
    case = _case(8, seed=3)
    fn = lambda: dsa_ops.sparse_attention(*case, **KW)  # noqa: E731
    with dsa_ops.use_backend(backend):
        assert any("<dsa::" in c for c in python_calls(fn)), "not routed to Python"
        out = fn()
    assert compare(out, reference(*case, *SCALES)) is None
    assert python_calls(fn) == [], "the C++ kernels did not take over again"


def test_bf16_caches_go_to_the_router_and_triton():
    q, kc, vc, idx, bt, t2r = _case(8, seed=4)
    kb, vb = kc.to(torch.bfloat16), vc.to(torch.bfloat16)
    fn = lambda: dsa_ops.sparse_attention(q, kb, vb, idx, bt, t2r, **KW)  # noqa: E731
    assert any("<dsa::" in c for c in python_calls(fn))
    assert compare(fn(), reference(q, kb, vb, idx, bt, t2r, *SCALES)) is None


@pytest.mark.parametrize("bad", ["q_dtype", "t2r_rows", "idx_cpu", "out_dtype", "out_is_q", "out_self_overlap"])
def test_bad_arguments_give_the_routers_errors(bad):
    q, kc, vc, idx, bt, t2r = _case(4, seed=6)
    args = [q, kc, vc, idx, bt, t2r]
    out = torch.empty((4, 24, 128), dtype=torch.bfloat16, device=DEV)
    if bad == "q_dtype":
        args[0] = q.float()
    elif bad == "t2r_rows":
        args[5] = t2r[:3]
    elif bad == "idx_cpu":
        args[3] = idx.cpu()
    elif bad == "out_dtype":
        out = out.float()
    elif bad == "out_is_q":
        out = q
    else:
        out = torch.empty(24 * 128 + 3 * 128, dtype=torch.bfloat16, device=DEV).as_strided((4, 24, 128), (128, 128, 1))
    with pytest.raises(dsa_ops.DsaArgumentError) as want:
        with dsa_ops.use_backend("reference"):  # the router's own error, as the Python path raises it
            dsa_ops.sparse_attention(*args, out=out, **KW)
    with pytest.raises(dsa_ops.DsaArgumentError) as got:
        dsa_ops.sparse_attention(*args, out=out, **KW)
    assert str(got.value) == str(want.value)
    with pytest.raises(RuntimeError) as got_raw:
        torch.ops.dsa.sparse_attention.out(*args, out=out, **KW)
    assert str(want.value) in str(got_raw.value)


def test_split_plan_is_the_providers():
    plan = torch.ops.dsa_cuda.sparse_attention_split_plan
    for sms in (78, 132, 148):
        for rows in (0, 1, 2, 7, 16, 32, 33, 64, 65, 128, 264, 265, 280, 300, 330, 400, 1600, 4096):
            for hkv in (1, 2, 4, 8):
                for topk in (1, 16, 300, 383, 384, 512, 2048, 8192):
                    assert tuple(plan(rows, hkv, topk, sms)) == cu.split_plan(rows, hkv, topk, sms), (rows, hkv, topk)


def test_fake_tensors_and_compile():
    case = _case(16, seed=8)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in case]
        assert torch.ops.dsa.sparse_attention(*fake, **KW).shape == (16, 24, 128)

    def f(*a):
        return dsa_ops.sparse_attention(*a, **KW)

    assert torch.equal(torch.compile(f, fullgraph=True)(*case), f(*case))
