"""Inputs and checks shared by the sparse_mla_decode kernel tests (interpreter and GPU).

make_case builds a paged cache whose every byte starts as 0xFF (an e4m3 NaN, an fp32 NaN scale, a bf16
NaN): only the slots the case uses get real tokens, so a read of any other slot, of a page's padding or
of a position past topk_lens shows as NaN. Valid slots are drawn from the used set; invalid positions
take -1, INT_MIN, INT_MAX, the slot count, the slot count + 7 and -2, and positions at or past
topk_lens[b] point at NaN slots. oracle() is the contract in float64 on the dequantised rows (the
reference's arithmetic, without the final bf16 rounding); compare() applies the stated tolerances.
"""

from __future__ import annotations

from typing import Optional

import torch
from dsa_ops.ops.dequant_k_cache_paged import dequant_slots

BPT = {"v32": 656, "v4": 584}
DIM = {"v32": 576, "v4": 512}
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def make_cache(layout: str, num_blocks: int, page: int, used: torch.Tensor, g: torch.Generator,
               pad: int = 0, subnormal_scale: bool = False) -> torch.Tensor:
    """uint8 [num_blocks, page, 1, bpt] (a view with page stride page * bpt + pad when pad > 0), 0xFF
    everywhere except the tokens of the slots in `used` (quantised N(0, 1) values, bf16 rope values)."""
    bpt = BPT[layout]
    raw = torch.full((num_blocks, page * bpt + pad), 0xFF, dtype=torch.uint8)
    n = used.numel()
    # Tokens as a model writes them: N(0, 1) values quantised with per-group amax scales (FlashMLA's form).
    x = torch.randn(n, 512, generator=g)
    rope = (torch.randn(n, 64, generator=g) * 0.5).to(torch.bfloat16).view(torch.uint8)
    page_of, off = used // page, used % page
    if layout == "v32":
        grp = x.view(n, 4, 128)
        scales = grp.abs().amax(-1).clamp_min(1e-4) / 448.0
        codes = (grp / scales[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).view(n, 512)
        tok = torch.cat([codes, scales.view(torch.uint8), rope], dim=1)  # [n, 656]
        raw[:, :page * bpt].view(num_blocks, page, bpt)[page_of, off] = tok
    else:
        grp = x[:, :448].reshape(n, 7, 64)
        e = torch.ceil(torch.log2(grp.abs().amax(-1).clamp_min(1e-4) / 448.0)).int() + 127  # ue8m0 bytes
        codes = (grp / torch.exp2((e - 127).float())[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        data = torch.cat([codes.view(torch.uint8).view(n, 448), rope], dim=1)  # [n, 576]
        sc = torch.full((n, 8), 0xFF, dtype=torch.uint8)  # the pad byte stays 0xFF: it is never a scale
        sc[:, :7] = e.to(torch.uint8)
        if subnormal_scale:
            sc[0, :7] = 0  # 2^-127: the subnormal scale
        raw[:, :page * 576].view(num_blocks, page, 576)[page_of, off] = data
        raw[:, page * 576:page * 584].view(num_blocks, page, 8)[page_of, off] = sc
    return raw[:, :page * bpt].view(num_blocks, page, 1, bpt)


def make_case(layout: str, batch: int, s_q: int, heads: int, topk: int, *, page: int = 16,
              num_blocks: int = 8, seed: int = 0, lens: Optional[list] = None, sink: bool = True,
              pad: int = 0, invalid_every: int = 5, device="cpu", q_scale: float = 1.0):
    """(q, cache, indices, topk_lens, attn_sink) on `device`; see the module docstring."""
    g = torch.Generator().manual_seed(seed)
    nslots = num_blocks * page
    perm = torch.randperm(nslots, generator=g)
    used = perm[: max(1, (3 * nslots) // 4)]
    unused = perm[used.numel():]
    cache = make_cache(layout, num_blocks, page, used, g, pad=pad, subnormal_scale=layout == "v4")
    q = (torch.randn(batch, s_q, heads, DIM[layout], generator=g) * q_scale).to(torch.bfloat16)
    idx = used[torch.randint(0, used.numel(), (batch, s_q, topk), generator=g)].int()
    bad = torch.tensor([-1, INT_MIN, INT_MAX, nslots, nslots + 7, -2], dtype=torch.int32)
    if invalid_every:
        flat = idx.view(-1)
        pos = torch.arange(0, flat.numel(), invalid_every)
        flat[pos] = bad[torch.arange(pos.numel()) % bad.numel()]
    lens_t = None
    if lens is not None:
        lens_t = torch.tensor(lens, dtype=torch.int32)
        if unused.numel():
            for b in range(batch):  # positions at or past the length point at NaN slots
                start = max(0, min(int(lens_t[b]), topk))
                fill = unused[torch.randint(0, unused.numel(), (s_q, topk - start), generator=g)]
                idx[b, :, start:] = fill.int()
    sink_t = torch.randn(heads, generator=g) * 2 if sink else None
    to = lambda x: None if x is None else x.to(device)  # noqa: E731
    return to(q), cache.to(device) if pad == 0 else _to_padded(cache, device), to(idx), to(lens_t), to(sink_t)


def make_code_sweep(layout: str, tokens: int = 64, device="cpu"):
    """(q, cache, idx): one page of `tokens` tokens that together hold every finite e4m3 code under scales from
    the subnormal 2^-127 (v4 ue8m0 0; v32 fp32 scales down to 2^-135) to just under bf16 overflow, q zero, and
    query row t selecting token t alone (its other top-k positions -1). Each output row is then its token's
    dequantised V times a weight of exactly 1, so it checks the kernel's dequant bitwise against dequant_slots."""
    g = torch.Generator().manual_seed(7)
    finite = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    n_fp8 = 448 if layout == "v4" else 512
    reps = -(-n_fp8 // finite.numel())
    codes = torch.stack([finite.roll(7 * t).repeat(reps)[:n_fp8] for t in range(tokens)])  # [tokens, n_fp8]
    rope = (torch.randn(tokens, 64, generator=g) * 0.5).to(torch.bfloat16).view(torch.uint8)
    if layout == "v4":
        # ue8m0 0 .. 245 (448 * 2^(245 - 127) < bf16 max), spread over the tokens' 7 groups
        e = (torch.arange(tokens * 7) * 245 // (tokens * 7 - 1)).view(tokens, 7).to(torch.uint8)
        sc = torch.cat([e, torch.full((tokens, 1), 0xFF, dtype=torch.uint8)], dim=1)
        page = torch.cat([torch.cat([codes, rope], dim=1).flatten(), sc.flatten()])
    else:
        # fp32 scales with random mantissas, exponents -135 (subnormal) .. 118: s < 2^119, so 448 s < 1.75 * 2^127,
        # finite in bf16
        ex = torch.linspace(-135, 118, tokens * 4).view(tokens, 4)
        scales = (torch.exp2(ex.double()) * (1 + torch.rand(tokens, 4, generator=g, dtype=torch.float64))).float()
        page = torch.cat([codes, scales.view(torch.uint8), rope], dim=1).flatten()
    cache = page.view(1, tokens, 1, BPT[layout])
    q = torch.zeros(tokens, 1, 64, DIM[layout], dtype=torch.bfloat16)
    idx = torch.full((tokens, 1, 64), -1, dtype=torch.int32)
    idx[torch.arange(tokens), 0, torch.arange(tokens) % 64] = torch.arange(tokens, dtype=torch.int32)
    return q.to(device), cache.to(device), idx.to(device)


def code_sweep_mismatch(out, lse, cache, layout: str) -> Optional[str]:
    """None when a make_code_sweep run's rows are bit for bit their tokens' dequantised V (dequant_slots; +0 and
    -0 equal) and every lse is exactly 0, else what differs."""
    n = out.shape[0]
    v = dequant_slots(cache, torch.arange(n, dtype=torch.int32, device=out.device), layout)[:, :512]
    want = v[:, None, None, :].expand_as(out)
    same = (out.view(torch.int16) == want.view(torch.int16)) | (out.float() == want.float())
    if not bool(same.all()):
        return f"{int((~same).sum())} values differ; first at {(~same).nonzero()[0].tolist()}"
    if not bool((lse == 0).all()):
        return f"lse not 0: {lse.flatten()[:4].tolist()}"
    return None


def _to_padded(cache: torch.Tensor, device) -> torch.Tensor:
    """The padded view moved to `device` with its page stride kept."""
    nb, p, _, bpt = cache.shape
    base = cache.as_strided((nb, cache.stride(0)), (cache.stride(0), 1)).to(device)
    return base[:, :p * bpt].view(nb, p, 1, bpt)


def oracle(q, cache, idx, softmax_scale, layout, lens=None, sink=None):
    """(out float64 [B, s_q, H, 512], lse float64 [B, H, s_q], vmax float64 [B, s_q, 512]): the contract on
    the dequantised rows; vmax is each column's largest |V| over the query token's valid tokens."""
    b, s_q, h, d = q.shape
    topk = idx.shape[2]
    nslots = cache.shape[0] * cache.shape[1]
    out = torch.zeros((b, s_q, h, 512), dtype=torch.float64, device=q.device)
    lse = torch.full((b, h, s_q), float("inf"), dtype=torch.float64, device=q.device)
    vmax = torch.zeros((b, s_q, 512), dtype=torch.float64, device=q.device)
    if topk == 0:
        return out, lse, vmax
    j = torch.arange(topk, device=q.device)
    for r in range(b):
        sl = idx[r].long()
        ok = (sl >= 0) & (sl < nslots)
        if lens is not None:
            ok &= j[None, :] < int(lens[r])
        kv = dequant_slots(cache, torch.where(ok, sl, -1).flatten().int(), layout).double().view(s_q, topk, d)
        s = torch.einsum("qhd,qnd->qhn", q[r].double(), kv) * softmax_scale
        s = s.masked_fill(~ok[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)  # -inf where no token
        has = torch.isfinite(row_lse)
        p = torch.where(has[..., None], torch.exp(s - torch.where(has, row_lse, 0)[..., None]), 0)
        o = torch.einsum("qhn,qnd->qhd", p, kv[..., :512])
        row_lse = torch.where(has, row_lse, float("inf"))
        if sink is not None:
            o = o / (1 + torch.exp(sink.double()[None, :] - row_lse))[..., None]
        out[r] = o
        lse[r] = row_lse.transpose(0, 1)
        vmax[r] = kv[..., :512].abs().amax(dim=1)  # invalid tokens are zero rows
    return out, lse, vmax


def compare(out, lse, ref_out, ref_lse, vmax) -> Optional[str]:
    """None when out and lse meet the tolerances, else what failed.

    out (bf16) per element within 1e-3 absolute or 2/128 relative of the float64 oracle, or within the
    bound of the kernel's bf16 probabilities (FlashMLA's PV precision): each normalised weight off by at
    most 2^-9 relative moves an output element by at most 2^-9 of its column's largest |V|, plus 2^-9 of
    the element for the output's own rounding (near-zero elements of short rows need it: top-k 128 gave
    errors up to 3e-3 where |V| reaches 3). And 1 - cosine below 1e-5 per (b, i, head) row; rows without
    a token exactly 0. lse within 1e-5 relative (of max(|lse|, 1)), +inf exactly where the oracle has no
    token. Nothing NaN."""
    o = out.double()
    if torch.isnan(o).any() or torch.isnan(lse).any():
        return f"NaN in out ({int(torch.isnan(o).sum())}) or lse ({int(torch.isnan(lse).sum())})"
    err = (o - ref_out).abs()
    p_bound = 2.0**-9 * (vmax[:, :, None, :] + ref_out.abs())
    bad = err > torch.maximum(torch.clamp(ref_out.abs() * (2 / 128), min=1e-3), p_bound)
    if bad.any():
        return f"out: {int(bad.sum())} elements off, max abs err {err.max().item():.3g}"
    none = torch.isinf(ref_lse)  # [B, H, s_q]
    if not torch.equal(torch.isinf(lse) & (lse > 0), none):
        return f"lse +inf at {int((torch.isinf(lse) & (lse > 0)).sum())} rows, the oracle at {int(none.sum())}"
    fin = ~none
    lerr = ((lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1))[fin]
    if lerr.numel() and lerr.max() > 1e-5:
        return f"lse: max relative err {lerr.max().item():.3g}"
    rows_none = none.permute(0, 2, 1)  # [B, s_q, H]
    if (o[rows_none] != 0).any():
        return "a row without a token is not 0"
    a, r = o[~rows_none], ref_out[~rows_none]
    nz = r.norm(dim=-1) > 0
    if nz.any():
        cos = torch.nn.functional.cosine_similarity(a[nz], r[nz], dim=-1)
        if (1 - cos).max() > 1e-5:
            return f"1 - cosine {(1 - cos).max().item():.3g}"
    return None
