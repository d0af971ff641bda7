"""The exact references, callable on tensors of any device (plain torch): ``dsa_ops.reference.topk(...)``.

Each function takes the op's arguments as its public API does (``out=`` excepted), validates them, and
runs the op's reference directly, whatever provider would serve the op on that device. The GPU tests
use these as the oracle at full size without copying to the CPU.
"""

from __future__ import annotations

import torch

from ._checks import check_flag, check_given_int
from ._define import OPS, _normalize

__all__ = sorted(OPS)


def _make(name: str):
    d = OPS[name]
    types = [str(x.type) for x in torch._C.parse_schema(f"dsa::{name}{d.schema}").arguments]
    flags = [i for i, t in enumerate(types) if t == "bool"]
    ints = [i for i, t in enumerate(types) if t == "int"]

    def run(*args, **kwargs):
        a = _normalize(name, d.arg_names, d.defaults, args, kwargs)  # refuses unknown or repeated keywords
        # As the op's wrapper does: bools and ints as given, never coerced.
        for i in flags:
            check_flag(name, d.arg_names[i], a[i])
        for i in ints:
            check_given_int(name, d.arg_names[i], a[i])
        d.validate(*a)
        return d.reference(*a)

    run.__name__ = run.__qualname__ = name
    run.__doc__ = f"Exact reference of dsa.{name} (schema: dsa::{name}{d.schema}), on any device."
    return run


globals().update({name: _make(name) for name in OPS})
