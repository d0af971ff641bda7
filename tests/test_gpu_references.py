"""The references run on a CUDA device too (plain torch), equal to their CPU run: the GPU tests use
them as the oracle at full size without copying to the CPU."""

import dsa_ops  # noqa: F401
import pytest
import torch
from dsa_ops import registry
from op_samples import samples

pytestmark = pytest.mark.gpu
S = samples()


def _to(x, dev):
    return x.to(dev) if isinstance(x, torch.Tensor) else x


@pytest.mark.parametrize("name", sorted(S))
def test_reference_on_cuda_equals_cpu(name):
    op, args, kwargs = S[name]
    cpu_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    cpu_kwargs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    want = op(*cpu_args, **cpu_kwargs)
    gargs = [_to(a, "cuda") for a in args]
    gkwargs = {k: _to(v, "cuda") for k, v in kwargs.items()}
    with registry.use_backend("reference"):
        got = op(*gargs, **gkwargs)
    if want is None:  # .out overloads: compare the written buffers
        got = tuple(v for k, v in gkwargs.items() if k.startswith("out") and v is not None)
        want = tuple(v for k, v in cpu_kwargs.items() if k.startswith("out") and v is not None)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g.cpu().float(), w.float(), rtol=1e-5, atol=1e-5, equal_nan=True)
        else:
            assert torch.equal(g.cpu(), w)
