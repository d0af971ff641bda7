"""Defines each op once: schema, fake, CPU reference, reference provider and the device router.

Every op file in ``dsa_ops.ops`` calls :func:`define_op` once. For ops that take ``out=`` buffers a
second overload ``dsa::<op>.out`` (mutating its out arguments, returning nothing) is defined next to
the functional one; device providers implement that out form, and the functional form allocates and
calls it, so each backend writes one kernel entry per op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import registry

LIB = torch.library.Library("dsa", "DEF")
OPS: dict[str, "OpDef"] = {}


@dataclass
class OutForm:
    schema: str  # the full `.out` argument list and return, e.g. "(Tensor x, *, Tensor(a!) out) -> ()"
    n_out: int  # trailing out arguments, in schema order
    alloc: Callable  # alloc(*args) -> tuple of fresh out tensors for the functional form
    reference: Callable  # reference_out(*args, *outs) -> None
    check_outs: Callable  # check_outs(*args, *outs) -> None, raises DsaArgumentError


@dataclass
class OpDef:
    name: str
    schema: str
    validate: Callable
    reference: Callable
    fake: Callable
    out: Optional[OutForm]
    arg_names: tuple
    defaults: tuple
    out_arg_names: tuple = ()
    out_defaults: tuple = ()


_NO_DEFAULT = object()


def _signature(full_schema: str):
    s = torch._C.parse_schema(full_schema)
    names = tuple(a.name for a in s.arguments)
    defaults = tuple(a.default_value if a.has_default_value() else _NO_DEFAULT for a in s.arguments)
    return names, defaults


def _normalize(op: str, names, defaults, args, kwargs) -> tuple:
    """Arguments in schema order with defaults filled in: providers see one calling convention."""
    if not kwargs and len(args) == len(names):
        return args
    full = list(args) + list(defaults[len(args):])
    for k, v in kwargs.items():
        full[names.index(k)] = v
    for i, v in enumerate(full):
        if v is _NO_DEFAULT:
            raise TypeError(f"dsa.{op}: missing argument `{names[i]}`")
    return tuple(full)


def define_op(name, schema, *, validate, reference, fake, out: Optional[OutForm] = None) -> OpDef:
    names, defaults = _signature(f"dsa::{name}{schema}")
    d = OpDef(name, schema, validate, reference, fake, out, names, defaults)
    LIB.define(f"{name}{schema}")

    def fake_impl(*args, **kwargs):
        a = _normalize(name, names, defaults, args, kwargs)
        validate(*a)
        return fake(*a)

    def cpu_impl(*args, **kwargs):
        a = _normalize(name, names, defaults, args, kwargs)
        validate(*a)
        return reference(*a)

    if out is None:

        def device_impl(*args, **kwargs):
            a = _normalize(name, names, defaults, args, kwargs)
            validate(*a)
            return registry.select(name, a).fn(*a)

        provider_fn = reference
    else:
        d.out_arg_names, d.out_defaults = _signature(f"dsa::{name}.out{out.schema}")
        LIB.define(f"{name}.out{out.schema}")

        def device_impl(*args, **kwargs):
            a = _normalize(name, names, defaults, args, kwargs)
            validate(*a)
            outs = out.alloc(*a)
            full = a + outs
            registry.select(name, full).fn(*full)
            return outs[0]

        def out_fake(*args, **kwargs):
            a = _normalize(name, d.out_arg_names, d.out_defaults, args, kwargs)
            validate(*a[: -out.n_out])
            out.check_outs(*a)
            return None

        def out_impl_for(kernel):
            def impl(*args, **kwargs):
                a = _normalize(name, d.out_arg_names, d.out_defaults, args, kwargs)
                validate(*a[: -out.n_out])
                out.check_outs(*a)
                kernel(a)

            return impl

        torch.library.register_fake(f"dsa::{name}.out", out_fake, lib=LIB)
        LIB.impl(f"{name}.out", out_impl_for(lambda a: out.reference(*a)), "CPU")
        LIB.impl(f"{name}.out", out_impl_for(lambda a: registry.select(name, a).fn(*a)), "CUDA")
        provider_fn = out.reference

    torch.library.register_fake(f"dsa::{name}", fake_impl, lib=LIB)
    LIB.impl(name, cpu_impl, "CPU")
    LIB.impl(name, device_impl, "CUDA")
    registry.register_provider(
        registry.Provider(name, "reference", provider_fn, supports=lambda *a: None, available=lambda dev: None)
    )
    OPS[name] = d
    return d
