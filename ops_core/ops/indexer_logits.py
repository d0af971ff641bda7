"""dsa.indexer_logits: DSA indexer scores (DeepGEMM's fp8_mqa_logits contract).

For ks[t] <= j < ke[t] (clipped to [0, N)):
    out[t, j] = sum_h weights[t, h] * relu(dot(q[t, h], kv[j]) * kv_scale[j])
and -inf elsewhere when `clean` (unspecified otherwise). Callers fold the q scales and the softmax
scale into `weights`.
"""

from __future__ import annotations

import torch

from .._checks import check_shape, check_tensor, check_unit_last_stride, fail
from .._define import define_op

NAME = "indexer_logits"
SCHEMA = ("(Tensor q, Tensor kv, Tensor? kv_scale, Tensor weights, Tensor ks, Tensor ke, *, bool clean=True)"
          " -> Tensor")
OPERAND_DTYPES = (torch.float8_e4m3fn, torch.bfloat16)
_CHUNK_ELEMS = 1 << 26  # rows * heads * keys per reference chunk (~512 MB of float64)


def check_indexer_inputs(op, q, kv, kv_scale, weights, ks, ke):
    """Shared with indexer_topk."""
    check_tensor(op, "q", q, dtypes=OPERAND_DTYPES, dim=3)
    check_unit_last_stride(op, "q", q)
    t, h, d = q.shape
    check_tensor(op, "kv", kv, dtypes=q.dtype, dim=2, device_like=q)
    check_unit_last_stride(op, "kv", kv)
    check_shape(op, "kv", kv, (None, d))
    if q.dtype == torch.float8_e4m3fn:
        check_tensor(op, "kv_scale", kv_scale, dtypes=torch.float32, dim=1, device_like=q)
        check_shape(op, "kv_scale", kv_scale, (kv.shape[0],))
    elif kv_scale is not None:
        fail(op, "`kv_scale` must be None for bfloat16 operands (it scales fp8 keys only)")
    check_tensor(op, "weights", weights, dtypes=torch.float32, dim=2, device_like=q)
    check_shape(op, "weights", weights, (t, h))
    for name, w in (("ks", ks), ("ke", ke)):
        check_tensor(op, name, w, dtypes=torch.int32, dim=1, device_like=q)
        check_shape(op, name, w, (t,))


def validate(q, kv, kv_scale, weights, ks, ke, clean):
    check_indexer_inputs(NAME, q, kv, kv_scale, weights, ks, ke)


def head_weighted_relu_scores(q32, kv32, kv_scale, weights):
    """sum_h w[t,h] * relu(dot(q[t,h], kv[j]) * s[j]) for fp32 operand copies: [T, N] fp32.

    Dots and the head sum are accumulated in float64, so the reference is at least as accurate as any
    fp32-accumulating kernel; the products are rounded to fp32 where the contract says fp32."""
    dots = torch.einsum("thd,nd->thn", q32.double(), kv32.double()).float()
    if kv_scale is not None:
        dots = dots * kv_scale.float()[None, None, :]
    return torch.einsum("th,thn->tn", weights.double(), dots.clamp_min(0).double()).float()


def reference(q, kv, kv_scale, weights, ks, ke, clean):
    t, h, _ = q.shape
    n = kv.shape[0]
    out = torch.full((t, n), float("-inf"), dtype=torch.float32, device=q.device)
    if t == 0 or n == 0:
        return out
    q32, kv32 = q.float(), kv.float()
    lo = ks.long().clamp(0, n)
    hi = torch.maximum(ke.long().clamp(0, n), lo)
    col = torch.arange(n, device=q.device)
    step = max(1, _CHUNK_ELEMS // max(1, h * n))
    for r0 in range(0, t, step):
        r1 = min(t, r0 + step)
        s = head_weighted_relu_scores(q32[r0:r1], kv32, kv_scale, weights[r0:r1])
        inside = (col[None, :] >= lo[r0:r1, None]) & (col[None, :] < hi[r0:r1, None])
        out[r0:r1] = torch.where(inside, s, out[r0:r1])
    return out


def fake(q, kv, kv_scale, weights, ks, ke, clean):
    return q.new_empty((q.shape[0], kv.shape[0]), dtype=torch.float32)


OP = define_op(NAME, SCHEMA, validate=validate, reference=reference, fake=fake)


def indexer_logits(q, kv, kv_scale, weights, ks, ke, *, clean: bool = True) -> torch.Tensor:
    """DSA indexer scores of every query row against every key in its window.

    Args:
        q: [T, H, D] float8_e4m3fn or bfloat16 (unit last stride).
        kv: [N, D], same dtype. kv_scale: float32 [N] for fp8 keys, None for bf16.
        weights: float32 [T, H] (any strides): per-row head weights, q scales and softmax scale folded in.
        ks, ke: int32 [T]: row t sees keys ks[t] <= j < ke[t] (clipped to [0, N)).
        clean: write -inf outside the windows (otherwise those entries are unspecified).

    Returns:
        float32 [T, N]: ``sum_h weights[t, h] * relu(dot(q[t, h], kv[j]) * kv_scale[j])``.
    """
    return torch.ops.dsa.indexer_logits(q, kv, kv_scale, weights, ks, ke, clean=clean)
