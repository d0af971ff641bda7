"""torch.library.opcheck on every op and overload, and fakes under torch.compile(dynamic=True)."""

import warnings

import dsa_ops  # noqa: F401
import pytest
import torch
from dsa_ops._define import OPS
from op_samples import samples

SAMPLES = samples()


def test_every_op_has_a_sample():
    names = set(OPS) | {f"{n}.out" for n, d in OPS.items() if d.out is not None}
    assert names == {n.split("[")[0] for n in SAMPLES}  # op[variant]: a further call of op
    assert len(OPS) == 10


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_opcheck(name):
    op, args, kwargs = SAMPLES[name]
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args):
        # torch's SchemaCheckMode compares inputs with float arithmetic that fp8 lacks on the CPU; the
        # fp8 path of the scoring ops is covered by the other three checks and test_fp8_inputs_not_mutated.
        utils = utils[1:]
    torch.library.opcheck(op, args, kwargs, test_utils=utils)


def test_fp8_inputs_not_mutated():
    op, args, kwargs = SAMPLES["paged_indexer_logits"]
    before = [a.clone() for a in args]
    op(*args, **kwargs)
    for a, b in zip(args, before):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("name", sorted(n for n in SAMPLES if not n.endswith(".out")))
def test_compiled_matches_eager_with_dynamic_shapes(name):
    op, args, kwargs = SAMPLES[name]
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: op(*a, **kwargs), fullgraph=True, dynamic=True, backend="aot_eager")
    got, want = compiled(*args), op(*args, **kwargs)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(a, b) or torch.allclose(a.float(), b.float(), equal_nan=True)


def test_fake_shapes_track_symbolic_sizes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        scores = mode.from_tensor(torch.randn(7, 100), static_shapes=False)
        out = torch.ops.dsa.topk(scores, 9)
        assert out.shape[1] == 9 and out.dtype == torch.int32
        assert out.shape[0] is scores.shape[0] or str(out.shape[0]) == str(scores.shape[0])


def test_out_overload_writes_in_place_under_compile():
    op, args, kwargs = SAMPLES["page_table_transform.out"]
    idx, pt = args

    def f(i, t):
        o = torch.empty_like(i)
        torch.ops.dsa.page_table_transform.out(i, t, page_size=64, out=o)
        return o

    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, fullgraph=True, dynamic=True)(idx, pt), f(idx, pt))


def _requiring_grad(v):
    if isinstance(v, torch.Tensor) and v.dtype in (torch.float32, torch.bfloat16):
        return v.detach().clone().requires_grad_(True)
    return v


def _no_backward_through(name, device):
    op, args, kwargs = SAMPLES[name]
    to = (lambda v: v.to(device) if isinstance(v, torch.Tensor) else v)
    args = tuple(_requiring_grad(to(a)) for a in args)
    kwargs = {k: to(v) if k.startswith("out") else _requiring_grad(to(v)) for k, v in kwargs.items()}
    assert any(isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "autograd kernel was not registered" warning is a failure
        got = op(*args, **kwargs)
    outs = [kwargs[n] for n in kwargs if n.startswith("out")] if got is None else (
        list(got) if isinstance(got, tuple) else [got])
    for o in outs:
        assert not o.requires_grad and o.grad_fn is None, f"{name}: an output carries a graph"


# The inputs below include every float tensor of each sample. The ops have no backward: their outputs must
# not carry a graph (the default fallback would let backward run through them with wrong gradients).
@pytest.mark.parametrize("name", sorted(n for n in SAMPLES if any(
    isinstance(v, torch.Tensor) and v.dtype in (torch.float32, torch.bfloat16)
    for v in (*SAMPLES[n][1], *SAMPLES[n][2].values()))))
def test_outputs_carry_no_graph(name):
    _no_backward_through(name, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(n for n in SAMPLES if any(
    isinstance(v, torch.Tensor) and v.dtype in (torch.float32, torch.bfloat16)
    for v in (*SAMPLES[n][1], *SAMPLES[n][2].values()))))
def test_outputs_carry_no_graph_gpu(name):
    # Some samples are smaller than any GPU kernel takes (2 heads, head dim 16, a bf16 cache for CUDA
    # sparse_attention); those run through the reference provider on the GPU: the Autograd key is the same
    # whichever provider serves the call. A routed op's raw call passes the router's DispatchError through its
    # C++ kernel, which raises it as a RuntimeError with the router's message.
    from dsa_ops.registry import use_backend

    try:
        _no_backward_through(name, "cuda")
    except RuntimeError as e:
        if "no provider serves this call" not in str(e):
            raise
        with use_backend("reference"):
            _no_backward_through(name, "cuda")
