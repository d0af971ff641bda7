"""Defines each op once: schema, fake, CPU reference, reference provider and the device router.

Every op file in ``dsa_ops.ops`` calls :func:`define_op` once. For ops that take ``out=`` buffers a
second overload ``dsa::<op>.out`` (mutating its out arguments, returning nothing) is defined next to
the functional one; device providers implement that out form, and the functional form allocates and
calls it, so each backend writes one kernel entry per op.

The functions registered with torch are generated from the schema with the op's real Python signature
(see :func:`_compile_impl`): the dispatcher passes keyword-only arguments as keywords and leaves out
defaulted ones, and letting Python bind them costs far less per call than normalizing by hand.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import _route, registry

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
    # The routers registered for the CUDA key (functional and `.out` forms), for tests and benchmarks.
    device_impl: Optional[Callable] = None
    out_device_impl: Optional[Callable] = None


_NO_DEFAULT = object()


def _parse(full_schema: str):
    """(names, defaults, kwarg_only flags) of a schema's arguments."""
    s = torch._C.parse_schema(full_schema)
    names = tuple(a.name for a in s.arguments)
    defaults = tuple(a.default_value if a.has_default_value() else _NO_DEFAULT for a in s.arguments)
    return names, defaults, tuple(a.kwarg_only for a in s.arguments)


def _signature(full_schema: str):
    names, defaults, _ = _parse(full_schema)
    return names, defaults


def _normalize(op: str, names, defaults, args, kwargs) -> tuple:
    """Arguments in schema order with defaults filled in: providers see one calling convention."""
    if not kwargs and len(args) == len(names):
        return args
    if len(args) > len(names):
        raise TypeError(f"dsa.{op}: takes {len(names)} arguments, got {len(args)}")
    full = list(args) + list(defaults[len(args):])
    for k, v in kwargs.items():
        if k not in names or k in names[:len(args)]:
            raise TypeError(f"dsa.{op}: unexpected or repeated argument `{k}` (arguments: {', '.join(names)})")
        full[names.index(k)] = v
    for i, v in enumerate(full):
        if v is _NO_DEFAULT:
            raise TypeError(f"dsa.{op}: missing argument `{names[i]}`")
    return tuple(full)


def _compile_impl(op: str, full_schema: str, body: str, env: dict, n_out: int = 0) -> Callable:
    """A function with the schema's Python signature whose body sees every argument by name.

    `body` may use {ARGS} (every argument, comma-separated, schema order), {IN} (all but the trailing
    `n_out` out arguments) and {F} (the first argument). The dispatcher calls these on every op call,
    so the body is plain code over the op's own names: no per-call argument lists, dict lookups or loops.
    """
    names, defaults, kwarg_only = _parse(full_schema)
    if any(not n.isidentifier() or keyword.iskeyword(n) or n.startswith("_") or n == "outs" for n in names):
        raise ValueError(f"dsa::{op}: argument names must be plain Python identifiers (not `outs`): {names}")
    params, star = [], False
    for i, (n, d, kw) in enumerate(zip(names, defaults, kwarg_only)):
        if kw and not star:
            params.append("*")
            star = True
        params.append(n if d is _NO_DEFAULT else f"{n}=_D[{i}]")
    args = ", ".join(names)
    n_in = len(names) - n_out
    src = f"def {op}({', '.join(params)}):\n" + body.format(ARGS=args, IN=", ".join(names[:n_in]) + ",", F=names[0])
    scope = dict(env, _D=defaults)
    exec(compile(src, f"<dsa::{op} impl>", "exec"), scope)
    return scope[op]


def given(**optional_tensors) -> dict:
    """The keyword arguments that are not None. For a `Tensor? x=None` argument, leaving None out is the
    same call, and every keyword passed to a torch op costs parsing time (~0.5 us) on each call."""
    return {k: v for k, v in optional_tensors.items() if v is not None}


def define_op(name, schema, *, validate, reference, fake, out: Optional[OutForm] = None,
              compiled_cuda: bool = False) -> OpDef:
    """Define dsa::<name> (and its `.out` form) with its fake, CPU reference, reference provider and router.

    compiled_cuda: a backend library may register C++ kernels for the op's CUDA key, which call the
    router (then also dsa_route::<name>) for what they do not serve (see _route).
    """
    full = f"dsa::{name}{schema}"
    names, defaults = _signature(full)
    # The routers take the device from the first argument: the dispatcher guarantees it is a tensor.
    if str(torch._C.parse_schema(full).arguments[0].type) != "Tensor":
        raise ValueError(f"dsa::{name}: the first argument must be a (non-optional) Tensor")
    d = OpDef(name, schema, validate, reference, fake, out, names, defaults)
    LIB.define(f"{name}{schema}")
    env = {"_validate": validate, "_fake": fake, "_reference": reference, "_select": registry.select_on,
           "_op_name": name, "_no_grad": torch.no_grad}

    fake_impl = _compile_impl(name, full, "    _validate({ARGS})\n    return _fake({ARGS})\n", env)
    # No backward (see the Autograd registration below): the reference records no graph, as a kernel would not.
    cpu_impl = _compile_impl(
        name, full, "    _validate({ARGS})\n    with _no_grad():\n        return _reference({ARGS})\n", env)

    if out is None:
        device_impl = _compile_impl(
            name, full, "    _validate({ARGS})\n    return _select(_op_name, {F}.device, ({ARGS},)).fn({ARGS})\n", env)
        provider_fn = reference
    else:
        out_full = f"dsa::{name}.out{out.schema}"
        d.out_arg_names, d.out_defaults = _signature(out_full)
        LIB.define(f"{name}.out{out.schema}")
        env.update(_alloc=out.alloc, _check_outs=out.check_outs, _reference_out=out.reference)

        device_impl = _compile_impl(name, full, (
            "    _validate({ARGS})\n"
            "    outs = _alloc({ARGS})\n"
            "    _select(_op_name, {F}.device, ({ARGS}, *outs)).fn({ARGS}, *outs)\n"
            "    return outs[0]\n"), env)
        checks = "    _validate({IN})\n    _check_outs({ARGS})\n"
        n = out.n_out
        out_fake = _compile_impl(name, out_full, checks + "    return None\n", env, n)
        out_cpu = _compile_impl(
            name, out_full, checks + "    with _no_grad():\n        _reference_out({ARGS})\n", env, n)
        out_device = _compile_impl(name, out_full, checks + "    _select(_op_name, {F}.device, ({ARGS},)).fn({ARGS})\n",
                                   env, n)

        d.out_device_impl = out_device
        torch.library.register_fake(f"dsa::{name}.out", out_fake, lib=LIB)
        LIB.impl(f"{name}.out", out_cpu, "CPU")
        provider_fn = out.reference

    d.device_impl = device_impl
    torch.library.register_fake(f"dsa::{name}", fake_impl, lib=LIB)
    LIB.impl(name, cpu_impl, "CPU")
    # Inference ops: torch's recommended registration for an op without a derivative. Without it the
    # default fallback attaches a node that lets backward run through the op and warns that its gradients
    # may be silently wrong; a fallthrough costs nothing per call and leaves the outputs without grad_fn.
    for overload in (name, f"{name}.out") if out is not None else (name,):
        LIB.impl(overload, torch.library.fallthrough_kernel, "Autograd")
    routers = [(name, schema, device_impl)]
    if out is not None:
        routers.append((f"{name}.out", out.schema, d.out_device_impl))
    if compiled_cuda:
        _route.add(name, routers)
    else:
        for overload, _, router in routers:
            LIB.impl(overload, router, "CUDA")
    registry.register_provider(
        registry.Provider(name, "reference", torch.no_grad()(provider_fn), supports=lambda *a: None,
                          available=lambda dev: None)
    )
    OPS[name] = d
    return d
