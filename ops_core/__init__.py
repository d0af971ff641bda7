"""dsa-ops: exact, fast GPU ops for DeepSeek-Sparse-Attention-style long-context inference.

Every op is a torch.library custom op, ``torch.ops.dsa.<name>``, with a fake, an exact reference
(CPU dispatch key, and callable on any device through ``dsa_ops.reference``) and device providers
chosen by ``dsa_ops.registry``.
"""

# Order matters: ops are defined first, then providers and references attach to them.
from . import ops as _ops  # noqa: F401  (defines every op)
from .ops import *  # noqa: F401,F403
from .registry import DispatchError, use_backend  # noqa: F401
from ._checks import DsaArgumentError  # noqa: F401
from . import _backends  # noqa: F401,E402  (registers device providers)
from . import reference  # noqa: F401,E402

__version__ = "0.1.0"

try:  # the Inductor fusion pass (dsa_ops.inductor); a failure to install it must not break the ops
    from .inductor import install as _install_inductor
except ImportError:
    _install_inductor = None
if _install_inductor is not None:
    _install_inductor()
