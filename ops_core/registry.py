"""Provider registry and device dispatch.

A provider is one backend's implementation of one op: ``Provider(op, backend, fn, supports, available)``.
For tensors on a GPU (the CUDA dispatch key, which ROCm builds of torch use too) the first provider in
``AUTO_ORDER`` that is available on the machine and supports the call serves it. CPU tensors always run
the exact reference. ``DSA_OPS_BACKEND=cuda|hip|triton|reference`` (read once, at import) or
``dsa_ops.use_backend(name)`` forces one backend; a forced backend that cannot serve raises, it never
falls back silently. Compiled kernels that serve an op's CUDA key themselves (see ``_route``) follow
these choices through :func:`on_change`.

Where providers of one op differ in speed by shape or mode, the op registers one measured rule with
:func:`set_preference`: in the automatic order the backend it names for a call is tried first (when
available and its `supports` accepts the call); forcing a backend ignores it.

Per call, ``select`` only asks ``supports`` of the providers that can run on the device: which
providers those are (availability, and the forced backend) is worked out once per (op, device, forced
backend) and kept until a provider is registered again. ``supports`` itself is never cached, so a
call that a provider declines is never served by it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch

BACKENDS = ("cuda", "hip", "triton", "reference")
# The reference is not in the automatic order: on a GPU a missing kernel is an error, not a slow path.
AUTO_ORDER = ("cuda", "hip", "triton")
ENV_VAR = "DSA_OPS_BACKEND"


class DispatchError(RuntimeError):
    """No provider could serve a call; the message lists each one tried and why it declined."""


@dataclass(frozen=True)
class Provider:
    op: str
    backend: str
    # Implements the op's kernel form: the `.out` overload where the op has one (writes `out`,
    # returns None), the functional schema otherwise.
    fn: Callable
    # supports(*args) -> None when it serves these arguments, else a short reason.
    supports: Callable[..., Optional[str]]
    # available(device) -> None when usable on this machine and device, else a short reason.
    available: Callable[[torch.device], Optional[str]]


_providers: dict[str, dict[str, Provider]] = {}
_available_cache: dict[tuple[str, str, torch.device], Optional[str]] = {}
# (op, device, forced backend) -> the providers that may serve it, in order (available ones only).
_candidates_cache: dict[tuple[str, torch.device, Optional[str]], tuple[Provider, ...]] = {}
_forced: Optional[str] = None
# op -> (prefer(*args) -> the backend measured fastest for this call or None, a one-line summary).
_preferences: dict[str, tuple[Callable[..., Optional[str]], str]] = {}
# Called after the forced backend or a provider changes: compiled kernels that serve an op's CUDA key
# without asking Python per call mirror those choices (backends_cuda/providers_topk.py).
_listeners: list[Callable[[], None]] = []


def _parse_backend(value: Optional[str]) -> Optional[str]:
    if value in (None, "", "auto"):
        return None
    if value not in BACKENDS:
        raise DispatchError(f"{ENV_VAR}={value!r} is not one of {', '.join(BACKENDS)} (or 'auto')")
    return value


_forced = _parse_backend(os.environ.get(ENV_VAR))


def register_provider(p: Provider) -> None:
    """Add (or replace) one backend's implementation of one op; the choice caches are dropped."""
    if p.backend not in BACKENDS:
        raise ValueError(f"unknown backend {p.backend!r}")
    _providers.setdefault(p.op, {})[p.backend] = p
    _forget(p.op, p.backend)
    _notify()


def unregister_provider(op: str, backend: Optional[str] = None) -> None:
    """Remove one backend's provider of `op` (every provider of `op` when backend is None)."""
    if backend is None:
        _providers.pop(op, None)
    else:
        _providers.get(op, {}).pop(backend, None)
    _forget(op, backend)
    _notify()


def _forget(op: str, backend: Optional[str]) -> None:
    """Drop what was worked out about the providers a (un)registration replaced."""
    for key in [k for k in _available_cache if k[0] == op and backend in (None, k[1])]:
        del _available_cache[key]
    _candidates_cache.clear()


def on_change(fn: Callable[[], None]) -> None:
    """Call fn() now and after every change of the forced backend or of a provider."""
    _listeners.append(fn)
    fn()


def _notify() -> None:
    for fn in _listeners:
        fn()


def providers(op: str) -> dict[str, Provider]:
    """The registered providers of `op`, by backend name (the live table: do not modify it)."""
    return _providers.get(op, {})


def set_preference(op: str, prefer: Optional[Callable[..., Optional[str]]], summary: str = "") -> None:
    """Make `prefer(*args)` (the op's arguments in schema order) pick the backend tried first for a call
    in the automatic order; its None keeps the order. `summary` is what `python -m dsa_ops info` shows.
    prefer=None removes the op's rule."""
    if prefer is None:
        _preferences.pop(op, None)
    else:
        _preferences[op] = (prefer, summary)


def preferred_backend(op: str, args: tuple) -> Optional[str]:
    """The backend the op's measured rule names for these arguments (None: no rule, or the order)."""
    rule = _preferences.get(op)
    return rule[0](*args) if rule is not None else None


def forced_backend() -> Optional[str]:
    """The backend forced by DSA_OPS_BACKEND or use_backend (None: the automatic choice)."""
    return _forced


@contextlib.contextmanager
def use_backend(name: Optional[str]):
    """Force one backend inside a `with` block (None or "auto" restores automatic choice). Process-wide, not per
    thread: the C++ CUDA-key kernels read the same choice."""
    global _forced
    previous, _forced = _forced, _parse_backend(name)
    _notify()
    try:
        yield
    finally:
        _forced = previous
        _notify()


def availability(p: Provider, device: torch.device) -> Optional[str]:
    """Why `p` cannot run on `device` (None when it can); computed once per device."""
    key = (p.op, p.backend, device)
    if key not in _available_cache:
        try:
            _available_cache[key] = p.available(device)
        except Exception as e:  # a probe that breaks is a reason, not a crash
            _available_cache[key] = f"availability probe failed: {e}"
    return _available_cache[key]


def _device_of(args) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    raise DispatchError("no tensor argument")


def _order() -> tuple:
    return (_forced,) if _forced is not None else AUTO_ORDER


def _candidates(op: str, device: torch.device) -> tuple[Provider, ...]:
    table = providers(op)
    return tuple(p for p in (table.get(b) for b in _order()) if p is not None and availability(p, device) is None)


def select(op: str, args: tuple) -> Provider:
    """The provider that serves `op` for these arguments, or DispatchError listing why none did."""
    return select_on(op, _device_of(args), args)


def select_on(op: str, device: torch.device, args: tuple) -> Provider:
    """select() for callers that know the device (the op routers: their first argument's)."""
    key = (op, device, _forced)
    cands = _candidates_cache.get(key)
    if cands is None:
        cands = _candidates_cache[key] = _candidates(op, device)
    if _forced is None and op in _preferences:
        first = _preferences[op][0](*args)
        for p in cands:
            if p.backend == first and p.supports(*args) is None:
                return p
    for p in cands:
        if p.supports(*args) is None:
            return p
    raise _no_provider(op, args, device)


def _no_provider(op: str, args: tuple, device: torch.device) -> DispatchError:
    """The error for a call no provider serves, with every backend tried and why it declined."""
    table = providers(op)
    tried = []
    for backend in _order():
        p = table.get(backend)
        if p is None:
            tried.append(f"{backend}: no {backend} kernel for this op")
            continue
        why = availability(p, device) or p.supports(*args)
        tried.append(f"{backend}: {why}")
    how = f"forced by {ENV_VAR}/use_backend" if _forced else "automatic order " + " > ".join(AUTO_ORDER)
    return DispatchError(
        f"dsa.{op}: no provider serves this call on {device} ({how}):\n  "
        + "\n  ".join(tried)
        + f"\n(the exact reference runs on any device with {ENV_VAR}=reference)"
    )


def describe(device: Optional[torch.device] = None) -> list[tuple[str, str, str]]:
    """(op, chosen backend or '-', per-backend reasons) rows for `python -m dsa_ops info`."""
    rows = []
    for op in sorted(_providers):
        table = _providers[op]
        reasons, chosen = [], "-"
        order = (_forced,) if _forced else AUTO_ORDER
        for backend in BACKENDS:
            p = table.get(backend)
            if p is None:
                reasons.append(f"{backend}: missing")
                continue
            if device is None:
                why = "no GPU device"
            else:
                why = availability(p, device)
            if why is None and chosen == "-" and backend in order:
                chosen = backend
            reasons.append(f"{backend}: {'ok' if why is None else why}")
        if op in _preferences and not _forced:
            reasons.append(f"by shape: {_preferences[op][1]}")
        rows.append((op, chosen, "; ".join(reasons)))
    return rows
