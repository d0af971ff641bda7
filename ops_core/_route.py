"""Compiled kernels for the CUDA key of some dsa ops, with the Python router kept behind them.

The Python CUDA-key function of an op (the router: validate, pick a provider, call it) costs 20-30 us
of Python per call. A backend library may instead register C++ kernels for the CUDA key of the ops
defined with ``define_op(..., compiled_cuda=True)``. Such a kernel serves the calls it can check
cheaply and hands every other call to the Python router, which is also the CUDA kernel of
``dsa_route::<op>`` (the same schema in another namespace), so those calls behave exactly as the router
alone makes them.

Registration: torch must never see two kernels for one key, so these ops' routers are registered for
``dsa::<op>`` on a ``torch.library.Library`` of their own, which :func:`handed_over` destroys right
before the backend's library loads and registers again when the load fails or the library turns out
to register no kernel for the key.

Errors: the stable ABI's dispatcher call turns the router's exception into an error code, so
``dsa_route``'s router first hands the message to the library (:func:`set_error_sink`): a raw
``torch.ops.dsa.<op>`` call raises a RuntimeError with the router's message. It also keeps the
exception, which the documented API functions re-raise (:func:`original`): they raise exactly the
router's exception.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterable, Optional

import torch

ROUTE_LIB = torch.library.Library("dsa_route", "DEF")

# op -> its CUDA-key routers, (overload name in dsa, e.g. "topk_page_table_transform.out", function).
_routers: dict[str, list[tuple[str, Callable]]] = {}
# op -> the Library holding those routers' dsa registrations (None while a compiled library serves).
_libs: dict[str, Optional[torch.library.Library]] = {}
_sink: Optional[Callable[[str], None]] = None
_last = threading.local()  # .error: the router's last exception raised to a compiled kernel, per thread


def add(op: str, overloads: list[tuple[str, str, Callable]]) -> None:
    """Register `op`'s CUDA-key routers, given as (overload name, schema, router), for a takeover."""
    for overload, schema, router in overloads:
        ROUTE_LIB.define(f"{overload}{schema}")
        ROUTE_LIB.impl(overload, _keeping_errors(router), "CUDA")
        # As the dsa op's (see _define): without it a compiled kernel's router call on inputs that require grad
        # would come back with outputs carrying torch's autograd-not-implemented node.
        ROUTE_LIB.impl(overload, torch.library.fallthrough_kernel, "Autograd")
    _routers[op] = [(overload, router) for overload, _, router in overloads]
    _register(op)


def _register(op: str) -> None:
    lib = torch.library.Library("dsa", "FRAGMENT")
    for overload, router in _routers[op]:
        lib.impl(overload, router, "CUDA")
    _libs[op] = lib


def _keeping_errors(router: Callable) -> Callable:
    def route(*args, **kwargs):
        try:
            return router(*args, **kwargs)
        except Exception as e:  # noqa: B902 - every error goes back to the caller, message first
            _last.error = e
            if _sink is not None:
                _sink(str(e))
            raise

    return route


def set_error_sink(sink: Optional[Callable[[str], None]]) -> None:
    """`sink(message)` receives the message of each error the router raises to a compiled kernel."""
    global _sink
    _sink = sink


def python_routed(op: str) -> bool:
    """Whether `op`'s CUDA key is served by its Python router (not handed over)."""
    return _libs.get(op) is not None


@contextlib.contextmanager
def handed_over(ops: Iterable[str]):
    """Unregister the Python routers of `ops` from the CUDA key around a block that loads a library with
    C++ kernels for that key; register them again if the block raises or registers no such kernel."""
    ops = [op for op in ops if python_routed(op)]
    # The load usually happens inside a router's call (the first call of an op on a GPU): its
    # registration goes while it runs; the Python function itself lives on in the running frame.
    for op in ops:
        _libs[op]._destroy()
        _libs[op] = None
    try:
        yield
    except BaseException:
        for op in ops:
            _register(op)
        raise
    for op in ops:
        if not all(torch._C._dispatch_has_kernel_for_dispatch_key(f"dsa::{o}", "CUDA") for o, _ in _routers[op]):
            _register(op)  # e.g. a prebuilt library from older sources: the router keeps serving


def original(e: BaseException) -> BaseException:
    """The router's own exception when `e` is a compiled kernel's RuntimeError copy of it, else `e`."""
    err, _last.error = getattr(_last, "error", None), None
    return err if err is not None and type(e) is RuntimeError and str(err) in str(e) else e
