"""GPU tests of the C++ kernel for dsa.paged_indexer_logits' CUDA key
(backends_cuda/csrc/paged_indexer_logits_route.cpp) and its handoff to the Python router (dsa_ops._route): who
serves which call, scores bitwise equal to the cuda provider's Python launch in both modes, errors, forced
backends, fakes, torch.compile and capture. Inputs from tests/test_gpu_indexer_logits.py (`_paged`: hostile block
tables, negative and zero lengths). Run on the H200: `pytest -m gpu tests/test_gpu_paged_indexer_logits_route.py`.
"""

from __future__ import annotations

import dsa_ops
import pytest
import torch
from dsa_ops import _route
from dsa_ops.ops.paged_indexer_logits import reference
from route_helpers import python_calls, replayed
from test_gpu_indexer_logits import _paged

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)
if torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("the CUDA paged indexer kernel is SM90-only", allow_module_level=True)
cu = pytest.importorskip("dsa_ops.backends.cuda.providers_paged_indexer")

CASES = [(8, 1, 64, [5000, 1, 0, -7, 4096, 9000, 64, 65], 300, 100, 6000), (8, 2, 64, [5000, 1, 0, -7, 4096, 9000,
         64, 65], 300, 100, 6400), (4, 4, 32, [3000, 2, 130, 6400], 200, 100, 6400)]


@pytest.fixture(scope="module", autouse=True)
def loaded():
    args = _paged(2, 1, 64, [100, 50], 8, 4, hostile=False)
    dsa_ops.paged_indexer_logits(*args, max_context_len=128)  # loads (or builds) the CUDA library
    torch.cuda.synchronize()
    assert not _route.python_routed("paged_indexer_logits")


def _exact_where_finite(got, ref, tol):
    vis = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(got), vis)
    norm = torch.where(vis, ref, 0).double().norm(dim=1, keepdim=True).clamp_min(1e-30)
    assert (torch.where(vis, (got.double() - ref.double()).abs(), 0) / norm).max().item() <= tol


@pytest.mark.parametrize("precise", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_cpp_kernel_serves_default_calls_bitwise_as_the_provider(case, precise):
    b, next_n, h, lens, nb, mb, L = CASES[case]
    args = _paged(b, next_n, h, lens, nb, mb, hostile=True, seed=case)
    fn = lambda: dsa_ops.paged_indexer_logits(*args, max_context_len=L, precise=precise)  # noqa: E731
    fn()
    assert python_calls(fn) == [], "the Python router ran"
    got = fn()
    assert torch.equal(got, cu.run(*args, L, True, precise))
    _exact_where_finite(got, reference(*args, L, True), 2e-3 if not precise else 1e-5)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_forced_backends_go_through_the_router(backend):
    args = _paged(4, 1, 64, [300, 1, 0, 200], 40, 8, hostile=True, seed=9)
    fn = lambda: dsa_ops.paged_indexer_logits(*args, max_context_len=320)  # noqa: E731
    with dsa_ops.use_backend(backend):
        assert any("<dsa::" in c for c in python_calls(fn)), "not routed to Python"
        got = fn()
    _exact_where_finite(got, reference(*args, 320, True), 2e-3)
    assert python_calls(fn) == [], "the C++ kernel did not take over again"


@pytest.mark.parametrize("bad", ["q_bf16", "lens_shape", "table_int64", "max_len_negative", "weights_shape"])
def test_bad_arguments_give_the_routers_errors(bad):
    q, kv, w, lens, table = args = list(_paged(4, 1, 64, [300, 1, 0, 200], 40, 8, hostile=False, seed=2))
    L = 320
    if bad == "q_bf16":
        args[0] = q.to(torch.bfloat16)
    elif bad == "lens_shape":
        args[3] = lens[:3]
    elif bad == "table_int64":
        args[4] = table.long()
    elif bad == "weights_shape":
        args[2] = w[:, :32]
    else:
        L = -1
    with pytest.raises(dsa_ops.DsaArgumentError) as want:
        with dsa_ops.use_backend("reference"):  # the router's own error, as the Python path raises it
            dsa_ops.paged_indexer_logits(*args, max_context_len=L)
    with pytest.raises(dsa_ops.DsaArgumentError) as got:
        dsa_ops.paged_indexer_logits(*args, max_context_len=L)
    assert str(got.value) == str(want.value)
    with pytest.raises(RuntimeError) as got_raw:
        torch.ops.dsa.paged_indexer_logits(*args, max_context_len=L)
    assert str(want.value) in str(got_raw.value)


def test_fake_tensors_compile_and_capture():
    args = _paged(4, 2, 64, [300, 1, 0, 200], 40, 8, hostile=True, seed=3)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in args]
        assert torch.ops.dsa.paged_indexer_logits(*fake, max_context_len=320).shape == (8, 320)

    def f(*a):
        return dsa_ops.paged_indexer_logits(*a, max_context_len=320)

    want = f(*args)
    assert torch.equal(torch.compile(f, fullgraph=True)(*args), want)
    assert torch.equal(replayed(lambda: torch.ops.dsa.paged_indexer_logits(*args, max_context_len=320)), want)
