"""The exact references, callable on tensors of any device (plain torch): ``dsa_ops.reference.topk(...)``.

Each function takes the op's arguments as its public API does (``out=`` excepted), validates them, and
runs the op's reference directly, whatever provider would serve the op on that device. The GPU tests
use these as the oracle at full size without copying to the CPU.
"""

from __future__ import annotations

from ._define import OPS, _normalize

__all__ = sorted(OPS)


def _make(name: str):
    d = OPS[name]

    def run(*args, **kwargs):
        a = _normalize(name, d.arg_names, d.defaults, args, kwargs)
        d.validate(*a)
        return d.reference(*a)

    run.__name__ = run.__qualname__ = name
    run.__doc__ = f"Exact reference of dsa.{name} (schema: dsa::{name}{d.schema}), on any device."
    return run


globals().update({name: _make(name) for name in OPS})
