"""Host-side argument validation: every failure names the argument and what was expected.

The hot ops' validators first try a fast path (the ``*_ok`` predicates at the end): a short conjunction
that is True only when every check of the full path would pass, for plain tensors (``type(t) is
torch.Tensor``: fakes, functional tensors and other subclasses always take the full path, so tracing
sees every check). When it says False, the full checks run and raise the usual error.
"""

from __future__ import annotations

import torch

INDEX_DTYPE = torch.int32
SCORE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


_Tensor = torch.Tensor
_INT32 = torch.int32


class DsaArgumentError(ValueError):
    """Raised for an argument an op cannot take; the message names the op and the argument."""


def fail(op: str, msg: str) -> None:
    raise DsaArgumentError(f"dsa.{op}: {msg}")


def check_tensor(op, name, t, *, dtypes=None, dim=None, device_like=None, optional=False):
    """Check one tensor argument's type, dtype, rank and device (cheap when all is well: this runs on
    every call of every op)."""
    if t is None:
        if not optional:
            fail(op, f"`{name}` is required, got None")
        return
    if not isinstance(t, torch.Tensor):
        fail(op, f"`{name}` must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype is not dtypes and (isinstance(dtypes, torch.dtype) or t.dtype not in dtypes):
        dtypes = (dtypes,) if isinstance(dtypes, torch.dtype) else tuple(dtypes)
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        fail(op, f"`{name}` must have dtype {want}, got {str(t.dtype).replace('torch.', '')}")
    if dim is not None and t.dim() != dim:
        fail(op, f"`{name}` must be {dim}-D, got shape {tuple(t.shape)}")
    if device_like is not None and t.device != device_like.device:
        fail(op, f"`{name}` is on {t.device}, expected {device_like.device} (same device as the first input)")


def check_shape(op, name, t, shape):
    """Check a tensor's shape; None in `shape` matches any size."""
    sizes = t.shape
    if len(sizes) == len(shape):
        for s, w in zip(sizes, shape):
            if w is not None and s != w:
                break
        else:
            return
    want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
    fail(op, f"`{name}` must have shape {want}, got {list(sizes)}")


def check_int(op, name, v, *, lo=None, hi=None, pow2=False):
    if isinstance(v, bool) or not isinstance(v, (int, torch.SymInt)):
        fail(op, f"`{name}` must be an int, got {type(v).__name__}")
    if lo is not None and v < lo:
        fail(op, f"`{name}` must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        fail(op, f"`{name}` must be <= {hi}, got {v}")
    if pow2 and (v <= 0 or (v & (v - 1)) != 0):
        fail(op, f"`{name}` must be a power of two, got {v}")


def check_flag(op, name, v):
    """A bool argument as a wrapper receives it: torch's argument parser would read None, 0, 1 or a tensor as one."""
    if v is not True and v is not False:
        fail(op, f"`{name}` must be a bool, got {type(v).__name__} {v!r}")


def check_given_int(op, name, v):
    """An int argument as a wrapper receives it (a SymInt under tracing): torch's argument parser would read True
    or a 0-d tensor as one."""
    if type(v) is not int and not isinstance(v, torch.SymInt):
        fail(op, f"`{name}` must be an int, got {type(v).__name__} {v!r}")


def check_unit_last_stride(op, name, t):
    if t.dim() > 0 and t.stride(-1) != 1 and t.shape[-1] > 1:
        fail(op, f"`{name}` must have unit stride in its last dimension, got strides {t.stride()}")


def _byte_span(t):
    """(first byte, one past the last) of a plain tensor's elements; None when empty or not a plain device tensor
    (fakes and meta tensors have no addresses: tracing skips the overlap checks)."""
    if type(t) is not _Tensor or t.is_meta:
        return None
    # data_ptr() is the first element's address (storage + offset); is_meta, nbytes of a contiguous tensor and
    # a plain loop otherwise, not device.type, untyped_storage() and sum(generator): check_out_alone over
    # sparse_attention's 7 tensors 28.1 -> 15.7 -> 8.1 us on the 2-core dev host (forms interleaved in one process).
    n = t.nbytes
    if n == 0:
        return None
    if t.is_contiguous():
        lo = t.data_ptr()
        return lo, lo + n
    reach = 1
    for s, st in zip(t.shape, t.stride()):
        reach += (s - 1) * st
    lo = t.data_ptr()
    return lo, lo + reach * t.element_size()


def check_out_alone(op, name, out, others, same_ok=()):
    """`out` must not overlap itself (a stride-0 or interleaved view) nor any tensor of `others` ((name, tensor)
    pairs, None skipped): the kernels write it while they read those. A tensor of `same_ok` may be `out` itself
    (the same elements: an in-place call), never a partial overlap."""
    reach = 0
    for st, s in sorted((st, s) for s, st in zip(out.shape, out.stride()) if s > 1):
        if st <= reach:
            fail(op, f"`{name}` has elements that share memory (shape {list(out.shape)}, strides {out.stride()})")
        reach += (s - 1) * st
    span = _byte_span(out)
    if span is None:
        return
    for in_place, pairs in ((False, others), (True, same_ok)):
        for other, t in pairs:
            ts = _byte_span(t) if t is not None else None
            if ts is None or ts[1] <= span[0] or span[1] <= ts[0]:
                continue
            if in_place and ts == span and t.stride() == out.stride() and t.shape == out.shape:
                continue
            fail(op, f"`{name}` overlaps `{other}` in memory: an out= buffer must not share memory with the inputs "
                     "or the other outputs")


def check_out(op, name, out, shape, dtype, like):
    """An `out=` buffer must match exactly: nothing is resized or cast silently."""
    check_tensor(op, name, out, dtypes=dtype, device_like=like)
    check_shape(op, name, out, shape)
    check_unit_last_stride(op, name, out)


# Fast-path predicates: True only when the matching checks above would pass; they never raise.


def pow2_ok(v) -> bool:
    """check_int(..., lo=1, pow2=True) passes (plain ints only)."""
    return type(v) is int and v >= 1 and (v & (v - 1)) == 0


def int32_rows_ok(t, rows, device) -> bool:
    """A plain int32 [rows] tensor on `device`: check_tensor(dtypes=int32, dim=1, device_like) and
    check_shape((rows,)) pass."""
    return type(t) is _Tensor and t.dtype is _INT32 and t.dim() == 1 and t.shape[0] == rows and t.device == device


def optional_int32_rows_ok(a, b, rows, device) -> bool:
    """int32_rows_ok for two optional tensors (None passes)."""
    return (a is None or int32_rows_ok(a, rows, device)) and (b is None or int32_rows_ok(b, rows, device))


def int32_table_ok(t, device) -> bool:
    """A plain int32 2-D tensor on `device` with unit last stride (check_tensor + check_unit_last_stride)."""
    return (type(t) is _Tensor and t.dtype is _INT32 and t.dim() == 2 and t.device == device
            and (t.stride(-1) == 1 or t.shape[-1] <= 1))


def out_ok(out, shape, device) -> bool:
    """check_out(op, name, out, shape, int32, like) passes, `like` being on `device`."""
    return (type(out) is _Tensor and out.dtype is _INT32 and out.device == device and out.shape == shape
            and (out.stride(-1) == 1 or out.shape[-1] <= 1))
