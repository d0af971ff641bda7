"""Registers each backend's providers. Importing a backend is cheap: nothing compiles at import."""

import importlib
import logging

log = logging.getLogger("dsa_ops")

for _name in ("cuda", "rocm", "triton"):
    try:
        _mod = importlib.import_module(f"dsa_ops.backends.{_name}")
    except ImportError as e:  # e.g. triton not installed: its providers are simply absent
        log.info("dsa_ops: backend %s not registered: %s", _name, e)
        continue
    if hasattr(_mod, "register"):
        _mod.register()
