"""Test-only fixes for four Triton 3.6 interpreter (TRITON_INTERPRET=1) bugs; GPU code is unaffected.

1. Under numpy >= 2.3 a runtime scalar used as a loop bound (``tl.range(a, b)`` with a, b computed in
   the kernel) fails: the interpreter keeps scalars as 1-element arrays and its ``__index__`` calls
   ``int()`` on them, which numpy now rejects. Fixed by taking the single element.
2. ``tl.dot`` on bfloat16 operands multiplies the raw uint16 bit patterns (the interpreter stores bf16
   as uint16 and only converts 8-bit floats before the matmul). Fixed by widening bf16 to fp32 first
   (exact), which is what the hardware's fp32-accumulating bf16 MMA computes.
3. ``x.to(tl.bfloat16)`` of an fp32 tensor truncates the mantissa; the GPU's conversion rounds to
   nearest even (as torch's does). Fixed by rounding to nearest even (NaN stays NaN).
4. Widening e4m3 (``x.to(tl.float16)`` and the like) turns the NaN codes 0x7f / 0xff into +-480; the
   GPU's conversion gives NaN. Fixed by writing NaN at those codes.

Import this module after setting TRITON_INTERPRET=1 and before launching kernels.
"""

from __future__ import annotations

import numpy as np
import triton.language as tl
import triton.runtime.interpreter as _ti

_orig_patch = _ti._patch_lang_tensor


def _patch_lang_tensor(tensor, scope):
    _orig_patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


_ti._patch_lang_tensor = _patch_lang_tensor

_orig_dot = _ti.InterpreterBuilder.create_dot


def _widen_bf16(x):
    if x.dtype == tl.bfloat16:
        return _ti.TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
    return x


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    return _orig_dot(self, _widen_bf16(a), _widen_bf16(b), d, input_precision, max_num_imprecise_acc)


_ti.InterpreterBuilder.create_dot = _create_dot


_orig_cast = _ti.InterpreterBuilder.cast_impl


def _cast_impl(self, src, dst_type):
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        u = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
        r = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        r = np.where(np.isnan(src.data), ((u >> 16) | 0x40).astype(np.uint16), r)
        return _ti.TensorHandle(r, tl.bfloat16)
    return _orig_cast(self, src, dst_type)


_ti.InterpreterBuilder.cast_impl = _cast_impl


_orig_fp_to_fp = _ti.InterpreterBuilder.create_fp_to_fp


def _create_fp_to_fp(self, src, dst_type, rounding_mode):
    """4. e4m3 codes 0x7f / 0xff widen to +-480 (the generic bit conversion has no e4m3 NaN); the GPU gives NaN."""
    out = _orig_fp_to_fp(self, src, dst_type, rounding_mode)
    if src.dtype.scalar == tl.float8e4nv and dst_type.scalar in (tl.float16, tl.bfloat16, tl.float32):
        nan = (np.asarray(src.data) & np.uint8(0x7F)) == np.uint8(0x7F)
        if np.any(nan):
            data = out.data.copy()
            f = data.view(np.uint16) if dst_type.scalar == tl.bfloat16 else data
            f[nan] = np.uint16(0x7FC0) if dst_type.scalar == tl.bfloat16 else np.nan
            out = _ti.TensorHandle(data, out.dtype)
    return out


_ti.InterpreterBuilder.create_fp_to_fp = _create_fp_to_fp
