"""dsa.indexer_logits: DSA indexer scores (DeepGEMM's fp8_mqa_logits contract).

For ks[t] <= j < ke[t] (clipped to [0, N)):
    out[t, j] = sum_h weights[t, h] * relu(dot(q[t, h], kv[j]) * kv_scale[j])
and -inf elsewhere when `clean` (unspecified otherwise). Callers fold the q scales and the softmax
scale into `weights`.

`precise` picks the precision of fp8 operands (an op argument, never a global): False (default) runs
FP8 tensor-core MMAs as DeepGEMM's fp8_mqa_logits does, True widens fp8 exactly to fp16 for fp16 MMAs.
The reference is the same exact computation in both modes (the kernels' oracle); the modes differ in
the tolerance they meet against it (PRECISION).
"""

from __future__ import annotations

import torch

from .. import registry
from .._checks import check_flag, check_shape, check_tensor, check_unit_last_stride, fail
from .._define import define_op
from . import _indexer_choice

NAME = "indexer_logits"
SCHEMA = ("(Tensor q, Tensor kv, Tensor? kv_scale, Tensor weights, Tensor ks, Tensor ke, *, bool clean=True,"
          " bool precise=False) -> Tensor")
OPERAND_DTYPES = (torch.float8_e4m3fn, torch.bfloat16)
# Error bounds against the reference, per mode, for fp8 operands (bf16 operands: 1e-5 of the row norm in
# both modes). precise=False: |err| <= 1e-3 * max_j |ref[t, j]| over the row's window (Hopper's fp8 MMAs
# keep ~14 mantissa bits while accumulating; DeepGEMM and our fp8 paths measured 3e-4 to 4e-4).
# precise=True: |err| <= 1e-5 * ||ref[t, window]||_2 (fp16 MMAs of exactly widened fp8, fp32 accumulation).
PRECISION = {False: ("row max |score|", 1e-3), True: ("row norm", 1e-5)}
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


def check_precise(op, precise):
    """`precise` picks a kernel path on the GPU: a bool, never None or a tensor read as one."""
    if not isinstance(precise, bool):
        fail(op, f"`precise` must be a bool, got {type(precise).__name__} {precise!r}")


def validate(q, kv, kv_scale, weights, ks, ke, clean, precise):
    check_indexer_inputs(NAME, q, kv, kv_scale, weights, ks, ke)
    check_precise(NAME, precise)


def head_weighted_relu_scores(q32, kv32, kv_scale, weights):
    """sum_h w[t,h] * relu(dot(q[t,h], kv[j]) * s[j]) for fp32 operand copies: [T, N] fp32.

    Dots and the head sum are accumulated in float64; each dot and its product with s[j] are rounded to fp32
    once, as a kernel's epilogue rounds them. Where the head terms cancel (a row whose score is far below
    sum_h |w| relu(..)), that per-head rounding survives the sum: such a row differs from the exact real
    value, and from a kernel that applies s[j] after the head sum, by up to about 2^-24 of the cancelled terms
    (the GPU tests allow it through the condition bound, docs/design_indexer.md, ill-conditioned rows)."""
    dots = torch.einsum("thd,nd->thn", q32.double(), kv32.double()).float()
    if kv_scale is not None:
        dots = dots * kv_scale.float()[None, None, :]
    return torch.einsum("th,thn->tn", weights.double(), dots.clamp_min(0).double()).float()


def reference(q, kv, kv_scale, weights, ks, ke, clean, precise=False):
    """The scores from float64 sums of fp32-rounded per-head terms (head_weighted_relu_scores), the oracle of
    both precision modes."""
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


def fake(q, kv, kv_scale, weights, ks, ke, clean, precise):
    return q.new_empty((q.shape[0], kv.shape[0]), dtype=torch.float32)


OP = define_op(NAME, SCHEMA, validate=validate, reference=reference, fake=fake)
registry.set_preference(NAME, _indexer_choice.dense, _indexer_choice.DENSE_SUMMARY)


def indexer_logits(q, kv, kv_scale, weights, ks, ke, *, clean: bool = True, precise: bool = False) -> torch.Tensor:
    """DSA indexer scores of every query row against every key in its window.

    Args:
        q: [T, H, D] float8_e4m3fn or bfloat16 (unit last stride).
        kv: [N, D], same dtype. kv_scale: float32 [N] for fp8 keys, None for bf16.
        weights: float32 [T, H] (any strides): per-row head weights, q scales and softmax scale folded in.
        ks, ke: int32 [T]: row t sees keys ks[t] <= j < ke[t] (clipped to [0, N)).
        clean: write -inf outside the windows (otherwise those entries are unspecified).
        precise: the precision of fp8 operands. False (default, what serving engines run): FP8
            tensor-core MMAs as DeepGEMM's fp8_mqa_logits; every score within 1e-3 of its row's
            largest |score| of the exact fp32 result from the same fp8 operands (3e-4 to 4e-4
            measured). True: fp8 widened exactly to fp16, fp16 MMAs with fp32 accumulation; within
            1e-5 of the row's 2-norm, at ~1.4x the time (H200, 4096 x 32768 x 64 heads: 3047 ->
            4375 us on the CUDA kernel). bf16 operands: bf16 MMAs, fp32 accumulation, 1e-5 of the
            row norm in both modes.

    Returns:
        float32 [T, N]: ``sum_h weights[t, h] * relu(dot(q[t, h], kv[j]) * kv_scale[j])``.
    """
    check_precise(NAME, precise)  # torch's argument parser would read None or 0.0 as False
    check_flag(NAME, "clean", clean)
    return torch.ops.dsa.indexer_logits(q, kv, kv_scale, weights, ks, ke, clean=clean, precise=precise)
