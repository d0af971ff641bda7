"""The validators' fast paths (see ops_core/_checks.py) accept exactly what the full checks accept.

For the hot ops, every single-argument perturbation of a valid call (and seeded random pairs of them)
is validated twice: as shipped, and with the fast-path predicates forced to say False. Both must
pass, or both raise the same message.
"""

import importlib
import itertools
import random

import pytest
import torch
from dsa_ops import DsaArgumentError
from dsa_ops._define import OPS, _normalize
from op_samples import samples

HOT = ["topk", "topk_ragged_transform", "topk_page_table_transform", "topk_page_table_transform.out",
       "page_table_transform", "page_table_transform.out"]
# module -> its fast-path predicates (forcing them False sends every call down the full checks)
FAST = {
    "dsa_ops.ops.topk": ["scores_and_windows_ok"],
    "dsa_ops.ops.topk_ragged_transform": ["scores_and_windows_ok"],
    "dsa_ops.ops.topk_page_table_transform": ["pow2_ok", "out_ok"],
    "dsa_ops.ops.page_table_transform": ["pow2_ok", "out_ok"],
}


def _variants(v):
    if isinstance(v, torch.Tensor):
        out = [None, 3, v.double(), v.to(torch.int64), v.float(), v.to(torch.int32), v[..., None], v.reshape(-1),
               v[:1], v[:-1], v.to("meta"), torch.nn.Parameter(v.clone(), requires_grad=False)]
        if v.dim() == 2:
            out += [v.t(), v[:, ::2], v[:1].expand_as(v), v.t().contiguous().t(), v[:, :1], v[:, :0]]
        if v.dim() == 1:
            out += [v[:1].expand_as(v), v.repeat(2)[::2]]
        return out
    if isinstance(v, bool):
        return [not v, 1]
    if isinstance(v, int):
        return [0, -1, 1, 3, 48, 64, True, 2.0, None, v * 2]
    return [None]


def _outcome(name, args):
    d = OPS[name.split(".")[0]]
    try:
        if name.endswith(".out"):
            d.validate(*args[: -d.out.n_out])
            d.out.check_outs(*args)
        else:
            d.validate(*args)
    except DsaArgumentError as e:
        return str(e)
    except Exception as e:  # the full checks may hit a TypeError on absurd input: the fast path must too
        return f"{type(e).__name__}: {e}"
    return None


def _cases(name):
    op, args, kwargs = samples()[name]
    d = OPS[name.split(".")[0]]
    names, defaults = (d.out_arg_names, d.out_defaults) if name.endswith(".out") else (d.arg_names, d.defaults)
    base = _normalize(name, names, defaults, args, kwargs)
    singles = [(i, v) for i, a in enumerate(base) for v in _variants(a)]
    cases = [base] + [base[:i] + (v,) + base[i + 1:] for i, v in singles]
    rng = random.Random(0)
    pairs = [p for p in itertools.combinations(singles, 2) if p[0][0] != p[1][0]]
    for (i, a), (j, b) in rng.sample(pairs, min(300, len(pairs))):
        c = list(base)
        c[i], c[j] = a, b
        cases.append(tuple(c))
    return cases


@pytest.mark.parametrize("name", HOT)
def test_fast_path_accepts_exactly_what_the_full_checks_accept(name, monkeypatch):
    cases = _cases(name)
    shipped = [_outcome(name, c) for c in cases]
    assert shipped[0] is None, shipped[0]
    assert sum(o is None for o in shipped) > 1 and sum(o is not None for o in shipped) > 10
    for mod, preds in FAST.items():
        m = importlib.import_module(mod)
        for p in preds:
            monkeypatch.setattr(m, p, lambda *a: False)
    full = [_outcome(name, c) for c in cases]
    for c, s, f in zip(cases, shipped, full):
        assert s == f, (name, [(type(a).__name__, getattr(a, "shape", a), getattr(a, "dtype", None)) for a in c])
