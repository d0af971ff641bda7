"""dsa.sparse_attention: grouped-query attention of each query row over its selected tokens only.

q [T, Hq, D] bf16; k_cache, v_cache [num_blocks, P, Hkv, D / Dv] fp8 e4m3 or bf16; indices [T, topk]
request-relative positions (-1 padded); block_table [num_requests, max_pages]; token_to_req [T] (-1
marks a padding row of a captured graph: its output is zeros). Query head h reads kv head
h // (Hq / Hkv). Scores softmax_scale * q . (k * k_scale), softmax in fp32, values v * v_scale.
Invalid tokens (negative, page slot outside the table, page id outside the cache) are skipped; a row
with no valid token gives 0. Duplicate indices count once each.
"""

from __future__ import annotations

import logging

import torch

from .. import _route, registry
from .._checks import check_out, check_out_alone, check_shape, check_tensor, check_unit_last_stride, fail
from .._define import OutForm, define_op

NAME = "sparse_attention"
_ARGS = ("(Tensor q, Tensor k_cache, Tensor v_cache, Tensor indices, Tensor block_table, Tensor token_to_req, "
         "*, float softmax_scale, float k_scale=1.0, float v_scale=1.0")
CACHE_DTYPES = (torch.float8_e4m3fn, torch.bfloat16)
_CHUNK = 32  # query rows per reference step
_log = logging.getLogger("dsa_ops")
_Tensor, _BF16, _FP8, _INT32 = torch.Tensor, torch.bfloat16, torch.float8_e4m3fn, torch.int32


def _args_ok(q, k_cache, v_cache, indices, block_table, token_to_req) -> bool:
    """Every check of `validate` passes (plain tensors only; never raises): the per-call fast path."""
    if not (type(q) is _Tensor and type(k_cache) is _Tensor and type(v_cache) is _Tensor and type(indices) is _Tensor
            and type(block_table) is _Tensor and type(token_to_req) is _Tensor):
        return False
    dev = q.device
    kd = k_cache.dtype
    if not (q.dtype is _BF16 and (kd is _FP8 or kd is _BF16) and v_cache.dtype is kd and indices.dtype is _INT32
            and block_table.dtype is _INT32 and token_to_req.dtype is _INT32):
        return False
    if not (q.dim() == 3 and k_cache.dim() == 4 and v_cache.dim() == 4 and indices.dim() == 2
            and block_table.dim() == 2 and token_to_req.dim() == 1):
        return False
    if not (k_cache.device == dev and v_cache.device == dev and indices.device == dev and block_table.device == dev
            and token_to_req.device == dev):
        return False
    t, hq, d = q.shape
    nb, p, hkv, kdim = k_cache.shape
    vs = v_cache.shape
    return (kdim == d and vs[0] == nb and vs[1] == p and vs[2] == hkv and p > 0 and hkv > 0 and hq % hkv == 0
            and k_cache.stride(3) == 1 and (v_cache.stride(3) == 1 or vs[3] <= 1)
            and indices.shape[0] == t and token_to_req.shape[0] == t)


def validate(q, k_cache, v_cache, indices, block_table, token_to_req, softmax_scale, k_scale, v_scale):
    if _args_ok(q, k_cache, v_cache, indices, block_table, token_to_req):
        return
    check_tensor(NAME, "q", q, dtypes=torch.bfloat16, dim=3)
    t, hq, d = q.shape
    check_tensor(NAME, "k_cache", k_cache, dtypes=CACHE_DTYPES, dim=4, device_like=q)
    check_tensor(NAME, "v_cache", v_cache, dtypes=k_cache.dtype, dim=4, device_like=q)
    nb, p, hkv, _ = k_cache.shape
    check_shape(NAME, "k_cache", k_cache, (None, None, None, d))
    check_shape(NAME, "v_cache", v_cache, (nb, p, hkv, None))
    check_unit_last_stride(NAME, "k_cache", k_cache)
    check_unit_last_stride(NAME, "v_cache", v_cache)
    if p == 0:
        fail(NAME, f"`k_cache` pages must hold at least one token (P, dim 1, is 0): got {list(k_cache.shape)}")
    if hkv == 0 or hq % hkv != 0:
        fail(NAME, f"query heads ({hq}) must be a multiple of kv heads ({hkv})")
    check_tensor(NAME, "indices", indices, dtypes=torch.int32, dim=2, device_like=q)
    check_shape(NAME, "indices", indices, (t, None))
    check_tensor(NAME, "block_table", block_table, dtypes=torch.int32, dim=2, device_like=q)
    check_tensor(NAME, "token_to_req", token_to_req, dtypes=torch.int32, dim=1, device_like=q)
    check_shape(NAME, "token_to_req", token_to_req, (t,))


def reference(q, k_cache, v_cache, indices, block_table, token_to_req, softmax_scale, k_scale, v_scale):
    t, hq, d = q.shape
    nb, p, hkv, dv = v_cache.shape
    nreq, max_pages = block_table.shape
    out = torch.zeros((t, hq, dv), dtype=torch.bfloat16, device=q.device)
    if t == 0 or indices.shape[1] == 0 or nb == 0 or nreq == 0 or max_pages == 0:
        return out
    g = hq // hkv
    for r0 in range(0, t, _CHUNK):
        r1 = min(t, r0 + _CHUNK)
        req = token_to_req[r0:r1].long()
        req_ok = (req >= 0) & (req < nreq)
        pos = indices[r0:r1].long()
        slot = torch.div(pos, p, rounding_mode="floor")
        ok = req_ok[:, None] & (pos >= 0) & (slot < max_pages)
        page = block_table[req.clamp(0, nreq - 1)[:, None], slot.clamp(0, max_pages - 1)].long()
        ok &= (page >= 0) & (page < nb)
        pg, off = page.clamp(0, nb - 1), torch.remainder(pos, p)
        # An invalid token's gathered row (a clamped page, possibly unused and NaN) is zeroed, not only masked
        # out of the softmax: 0 * NaN would reach the output through P V.
        valid = ok[:, :, None, None]
        k = torch.where(valid, k_cache[pg, off].float() * k_scale, 0.0)  # [t, topk, hkv, d]
        v = torch.where(valid, v_cache[pg, off].float() * v_scale, 0.0)
        qg = q[r0:r1].float().view(r1 - r0, hkv, g, d)
        s = torch.einsum("tkgd,tnkd->tkgn", qg, k) * softmax_scale
        s = torch.where(ok[:, None, None, :], s, torch.full_like(s, float("-inf")))
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(s - m)
        denom = e.sum(dim=-1, keepdim=True)
        o = torch.einsum("tkgn,tnkd->tkgd", e, v) / torch.where(denom > 0, denom, torch.ones_like(denom))
        out[r0:r1] = o.reshape(r1 - r0, hq, dv).to(torch.bfloat16)
    return out


def fake(q, k_cache, v_cache, *_):
    return q.new_empty((q.shape[0], q.shape[1], v_cache.shape[3]), dtype=torch.bfloat16)


def _alloc(q, k_cache, v_cache, *_):
    return (torch.empty((q.shape[0], q.shape[1], v_cache.shape[3]), dtype=torch.bfloat16, device=q.device),)


def _check_outs(*a):
    q, v_cache, out = a[0], a[2], a[-1]
    shape = (q.shape[0], q.shape[1], v_cache.shape[3])
    if not (type(out) is _Tensor and out.dtype is _BF16 and out.device == q.device and out.shape == shape
            and (out.stride(2) == 1 or shape[2] <= 1)):
        check_out(NAME, "out", out, shape, torch.bfloat16, q)
    names = ("q", "k_cache", "v_cache", "indices", "block_table", "token_to_req")
    check_out_alone(NAME, "out", out, tuple(zip(names, a[:6])))


def _reference_out(*a):
    a[-1].copy_(reference(*a[:-1]))


OP = define_op(
    NAME,
    _ARGS + ") -> Tensor",
    validate=validate,
    reference=reference,
    fake=fake,
    out=OutForm(_ARGS + ", Tensor(a!) out) -> ()", 1, _alloc, _reference_out, _check_outs),
    compiled_cuda=True,
)

# Which GPU provider serves a call (the automatic order puts CUDA first; it serves fp8 caches only).
# In a CUDA-graph capture, by GPU time: H200, 24 q / 2 KV heads, top-k 2048 of 65536-token requests, fp8,
# cold-L2 graph replay (benchmarks/bench_sparse_attention.py), us CUDA / Triton: 1 row 18.2 / 11.6, 16 rows
# 23.4 / 21.2, 64 rows 40.7 / 49.7, 400 rows 128.7 / 193.9, 1600 rows 437.5 / 675.4. Triton's split-K path wins
# below 64 rows x KV heads; from 64 the CUDA kernel runs one split in 16-warp CTAs (H100, same benchmark: 32 rows
# 28.6 against Triton's 32.3, 64 rows 36.6 against 50.2).
# Outside a capture, by host time, which an eager call of these rows waits on (H100, the op's host time a call
# of back-to-back calls, 1 / 16 / 64 rows; `test_sparse_attention_op`): CUDA 55.6 / 51.7 / 48.3 us against vLLM's
# wrapper 86.6 / 84.9 / 92.6; our Triton launcher alone costs 82 us (two launches of 34 and 7 arguments). So CUDA
# there, and in a capture Triton only for a specialisation already compiled (`warmup`): no JIT inside a capture.
TRITON_MAX_PROGRAMS = 63
PREFER_SUMMARY = (f"in a CUDA-graph capture, triton while rows x KV heads <= {TRITON_MAX_PROGRAMS} (its split-K path) "
                  "once warmed up; else the order")
_capturing = torch.cuda.is_current_stream_capturing


def _triton_split_compiled(q, k_cache, v_cache) -> bool:
    try:
        from ..backends.triton import sparse_attention as sa
    except ImportError:  # no Triton: its provider is unavailable anyway
        return False
    return sa.split_compiled(q, k_cache, v_cache)


def prefer(q, k_cache, v_cache, *_):
    """The backend measured fastest for these arguments (None: the automatic order)."""
    if q.shape[0] * k_cache.shape[2] > TRITON_MAX_PROGRAMS or not _capturing():
        return None
    if _triton_split_compiled(q, k_cache, v_cache):
        return "triton"
    _log.info("dsa_ops sparse_attention: a graph captures %d rows x %d KV heads before Triton's split-K kernel was "
              "compiled for them; the CUDA kernel serves (backends.triton.sparse_attention.warmup compiles it)",
              q.shape[0], k_cache.shape[2])
    return None


registry.set_preference(NAME, prefer, PREFER_SUMMARY)


def sparse_attention(q, k_cache, v_cache, indices, block_table, token_to_req, *, softmax_scale: float,
                     k_scale: float = 1.0, v_scale: float = 1.0, out=None) -> torch.Tensor:
    """Sparse grouped-query attention over the tokens each query row selected.

    Args:
        q: bfloat16 [T, Hq, D]. k_cache / v_cache: [num_blocks, P, Hkv, D / Dv], fp8 e4m3 or bf16.
        indices: int32 [T, topk] request-relative token positions, -1 padded.
        block_table: int32 [num_requests, max_pages]. token_to_req: int32 [T] (-1: padding row).
        softmax_scale, k_scale, v_scale: score scale and cache dequantisation scales.
        out: optional bfloat16 [T, Hq, Dv] buffer.

    Returns:
        bfloat16 [T, Hq, Dv]; zeros for rows with no valid token or token_to_req -1.
    """
    args = (q, k_cache, v_cache, indices, block_table, token_to_req)
    kw = dict(softmax_scale=softmax_scale, k_scale=k_scale, v_scale=v_scale)
    try:
        if out is None:
            return torch.ops.dsa.sparse_attention(*args, **kw)
        torch.ops.dsa.sparse_attention.out(*args, **kw, out=out)
    except RuntimeError as e:  # the router's own error behind the CUDA kernel's copy (see _route)
        raise _route.original(e) from None
    return out
