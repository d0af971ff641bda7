"""`python -m dsa_ops info`: which provider serves each op on this machine, and why."""

from __future__ import annotations

import torch

from . import registry


def main(argv=()) -> int:
    import dsa_ops  # noqa: F401  (defines ops, registers providers)

    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    print(f"dsa_ops {dsa_ops.__version__}  torch {torch.__version__}  "
          f"cuda {torch.version.cuda}  hip {torch.version.hip}")
    if dev is None:
        print("device: none (CPU tensors run the exact reference; GPU providers listed as unavailable)")
    else:
        p = torch.cuda.get_device_properties(dev)
        print(f"device: {p.name}, capability {p.major}.{p.minor}, {p.multi_processor_count} SMs")
    forced = registry.forced_backend()
    print(f"backend: {'forced to ' + forced if forced else 'automatic'} ({registry.ENV_VAR}); order on GPU: "
          + " > ".join(registry.AUTO_ORDER) + "; CPU: reference")
    rows = registry.describe(dev)
    w = max(len(r[0]) for r in rows)
    print(f"\n{'op'.ljust(w)}  {'GPU provider':12}  backends")
    for op, chosen, reasons in rows:
        print(f"{op.ljust(w)}  {chosen:12}  {reasons}")
    print(f"\n{len(rows)} ops")
    return 0
