"""dsa.sparse_mla_decode: FlashMLA's sparse decode over a paged fp8 MLA cache.

q [B, s_q, H, 576] bf16 for "v32" ([.., 512] for "v4"); kv_cache as dsa.dequant_k_cache_paged;
indices [B, s_q, topk] physical slots; positions j >= topk_lens[b] and invalid slots are skipped.
Keys are the dequantised rows; values are their first 512 columns (v32) or the whole 512 (v4).
Returns out bf16 [B, s_q, H, 512] and the natural-log lse fp32 [B, H, s_q]; a row with no valid
token gives out 0 and lse +inf. attn_sink [H] only rescales out by exp(lse) / (exp(lse) + exp(sink)).
H is 64 or 128 in the contract (what the CUDA kernels take); the reference and the Triton kernel also take
other head counts (e.g. 16 or 32 heads a GPU under tensor parallelism), an extension beyond it.
"""

from __future__ import annotations

import torch

from .. import _route
from .._checks import check_shape, check_tensor, fail
from .._define import define_op, given
from .dequant_k_cache_paged import LAYOUTS, check_cache, dequant_slots

NAME = "sparse_mla_decode"
SCHEMA = ("(Tensor q, Tensor kv_cache, Tensor indices, *, float softmax_scale, str layout=\"v32\", "
          "Tensor? topk_lens=None, Tensor? attn_sink=None) -> (Tensor, Tensor)")
DV = 512


def validate(q, kv_cache, indices, softmax_scale, layout, topk_lens, attn_sink):
    check_cache(NAME, kv_cache, layout)
    check_tensor(NAME, "q", q, dtypes=torch.bfloat16, dim=4, device_like=kv_cache)
    b, s_q, h, d = q.shape
    if d != LAYOUTS[layout][1]:
        fail(NAME, f"`q` head dim must be {LAYOUTS[layout][1]} for layout {layout!r}, got {d}")
    check_tensor(NAME, "indices", indices, dtypes=torch.int32, dim=3, device_like=kv_cache)
    check_shape(NAME, "indices", indices, (b, s_q, None))
    check_tensor(NAME, "topk_lens", topk_lens, dtypes=torch.int32, dim=1, device_like=kv_cache, optional=True)
    if topk_lens is not None:
        check_shape(NAME, "topk_lens", topk_lens, (b,))
    check_tensor(NAME, "attn_sink", attn_sink, dtypes=torch.float32, dim=1, device_like=kv_cache, optional=True)
    if attn_sink is not None:
        check_shape(NAME, "attn_sink", attn_sink, (h,))


def reference(q, kv_cache, indices, softmax_scale, layout, topk_lens, attn_sink):
    b, s_q, h, d = q.shape
    topk = indices.shape[2]
    nslots = kv_cache.shape[0] * kv_cache.shape[1]
    out = torch.zeros((b, s_q, h, DV), dtype=torch.bfloat16, device=q.device)
    lse = torch.full((b, h, s_q), float("inf"), dtype=torch.float32, device=q.device)
    if topk == 0:
        return out, lse
    j = torch.arange(topk, device=q.device)
    for r in range(b):
        slots = indices[r].long()  # [s_q, topk]
        ok = (slots >= 0) & (slots < nslots)
        if topk_lens is not None:
            ok &= j[None, :] < topk_lens[r].long()
        kv = dequant_slots(kv_cache, torch.where(ok, slots, -1).flatten().int(), layout).float()
        kv = kv.view(s_q, topk, d)
        v = kv[..., :DV]
        s = torch.einsum("qhd,qnd->qhn", q[r].float(), kv) * softmax_scale
        s = torch.where(ok[:, None, :], s, torch.full_like(s, float("-inf")))
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(s - m)
        denom = e.sum(dim=-1, keepdim=True)
        o = torch.einsum("qhn,qnd->qhd", e, v) / torch.where(denom > 0, denom, torch.ones_like(denom))
        row_lse = torch.where(denom > 0, m + torch.log(denom), torch.full_like(denom, float("inf"))).squeeze(-1)
        if attn_sink is not None:
            # exp(lse) / (exp(lse) + exp(sink)) = 1 / (1 + exp(sink - lse)); a row without a token (lse +inf)
            # keeps its 0, also for a sink of +inf, where sink - lse would be inf - inf.
            scale = torch.where(denom.squeeze(-1) > 0, 1 + torch.exp(attn_sink[None, :] - row_lse), 1.0)
            o = o / scale[..., None]
        out[r] = o.to(torch.bfloat16)
        lse[r] = row_lse.transpose(0, 1)
    return out, lse


def fake(q, kv_cache, indices, softmax_scale, layout, topk_lens, attn_sink):
    b, s_q, h, _ = q.shape
    return q.new_empty((b, s_q, h, DV)), q.new_empty((b, h, s_q), dtype=torch.float32)


OP = define_op(NAME, SCHEMA, validate=validate, reference=reference, fake=fake, compiled_cuda=True)


def sparse_mla_decode(q, kv_cache, indices, *, softmax_scale: float, layout: str = "v32", topk_lens=None,
                      attn_sink=None):
    """Sparse MLA decode attention (FlashMLA's sparse decode contract).

    Args:
        q: bfloat16 [B, s_q, H, 576] ("v32") or [B, s_q, H, 512] ("v4").
        kv_cache: uint8 paged cache, see :func:`dsa_ops.dequant_k_cache_paged`.
        indices: int32 [B, s_q, topk] physical slots (-1: none).
        softmax_scale: score scale. layout: "v32" or "v4".
        topk_lens: int32 [B]; positions j >= topk_lens[b] are ignored.
        attn_sink: float32 [H]; rescales out by exp(lse) / (exp(lse) + exp(sink)).

    Returns:
        (bfloat16 [B, s_q, H, 512] output, float32 [B, H, s_q] natural-log lse; +inf where no token).
    """
    try:
        return torch.ops.dsa.sparse_mla_decode(q, kv_cache, indices, softmax_scale=softmax_scale, layout=layout,
                                               **given(topk_lens=topk_lens, attn_sink=attn_sink))
    except RuntimeError as e:  # the router's own error behind the CUDA kernel's copy (see _route)
        raise _route.original(e) from None
