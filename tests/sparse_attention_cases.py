"""Adversarial inputs for dsa.sparse_attention, shared by the interpreter and GPU tests.

Pages that no block table references are filled with NaN (fp8 code 0x7f / 0xff, bf16 NaN), so a read
of a token the kernel should have skipped shows in the output. Block tables are random permutations
of the pool with invalid entries (-1, num_blocks, INT32_MAX); indices mix -1, INT32_MIN, INT32_MAX,
positions past the block table, duplicates and in-range positions; some rows have no valid index,
some are padding rows (token_to_req -1) or name a request past the table.
"""

from __future__ import annotations

import torch

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FP8 = torch.float8_e4m3fn

# The GPU tests' shapes: (rows, hq, hkv, d, dv, page, num_blocks, num_reqs, max_pages, topk).
SHAPES = {
    "decode1": (1, 24, 2, 128, 128, 64, 1200, 1, 1024, 2048),
    "verify5": (5, 24, 2, 128, 128, 64, 700, 3, 200, 2048),
    "rows37": (37, 24, 2, 128, 128, 64, 700, 8, 64, 2048),
    "rows400": (400, 24, 2, 128, 128, 64, 4000, 50, 64, 2048),
    "rows8192": (8192, 24, 2, 128, 128, 64, 600, 64, 8, 256),
    "ragged-topk": (70, 24, 2, 128, 128, 64, 300, 4, 40, 1000),
}


def make_case(rows, hq, hkv, d, dv, *, page, num_blocks, num_reqs, max_pages, topk, dtype, seed=0,
              device="cpu", hostile=True, cache_layout="plain"):
    """(q, k_cache, v_cache, indices, block_table, token_to_req) on `device`.

    cache_layout "plain": contiguous [num_blocks, P, Hkv, D]; "vllm": K and V views of one
    [num_blocks, Hkv, P, D + Dv] buffer (strided, as vLLM allocates it)."""
    g = torch.Generator().manual_seed(seed)

    def ints(lo, hi, shape):
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(torch.int32)

    if cache_layout == "vllm":
        buf = torch.randn((num_blocks, hkv, page, d + dv), generator=g) * 1.5
    else:
        kf = torch.randn((num_blocks, page, hkv, d), generator=g) * 1.5
        vf = torch.randn((num_blocks, page, hkv, dv), generator=g) * 1.5

    used = torch.randperm(num_blocks, generator=g)[: num_reqs * max_pages]
    bt = torch.full((num_reqs * max_pages,), -1, dtype=torch.int32)
    bt[: used.numel()] = used.to(torch.int32)
    bt = bt.view(num_reqs, max_pages).clone()
    if hostile:
        flat = bt.view(-1)
        bad = ints(0, 8, flat.shape) == 0
        choice = ints(0, 3, flat.shape)
        flat[bad & (choice == 0)] = -1
        flat[bad & (choice == 1)] = num_blocks
        flat[bad & (choice == 2)] = INT32_MAX
    referenced = torch.zeros(num_blocks, dtype=torch.bool)
    ok = (bt >= 0) & (bt < num_blocks)
    referenced[bt[ok].long()] = True
    if cache_layout == "vllm":
        buf[~referenced] = float("nan")
        buf = buf.to(dtype).transpose(1, 2)
        kc, vc = buf[..., :d], buf[..., d:]
    else:
        kf[~referenced] = float("nan")
        vf[~referenced] = float("nan")
        kc, vc = kf.to(dtype), vf.to(dtype)

    span = max_pages * page
    idx = ints(0, span, (rows, topk))
    t2r = ints(0, num_reqs, (rows,))
    if hostile:
        r = ints(0, 10, (rows, topk))
        idx[r == 0] = -1
        idx[r == 1] = INT32_MIN
        idx[r == 2] = INT32_MAX
        idx[r == 3] = span + ints(0, 3 * page, (rows, topk))[r == 3]  # past the block table
        idx[r == 4] = -ints(2, 1000, (rows, topk))[r == 4]
        if topk > 1:
            idx[:, -1] = idx[:, 0]  # a duplicate counts twice
        if rows > 1:
            idx[1] = -1  # no valid index
        if rows > 2:
            t2r[2] = -1  # padding row
        if rows > 3:
            t2r[3] = num_reqs  # a request past the table
        if rows > 4:
            idx[4] = INT32_MAX
    q = torch.randn((rows, hq, d), generator=g).to(torch.bfloat16)
    out = (q, kc, vc, idx, bt, t2r)
    return tuple(x.to(device) for x in out)


def compare(out: torch.Tensor, ref: torch.Tensor, rtol: float = 2e-2, min_cos: float = 0.999):
    """None when out matches ref: per (row, head), max |out - ref| <= rtol * max |ref|, cosine
    similarity >= min_cos, and exactly 0 where ref is 0; else a description of the first mismatch. A non-finite
    reference is a mismatch too (NaN compares false, so it would pass every bound below)."""
    o, r = out.float(), ref.float()
    if not torch.isfinite(r).all():
        bad = (~torch.isfinite(r)).nonzero()[:3].tolist()
        return f"non-finite reference at {bad}"
    if not torch.isfinite(o).all():
        bad = (~torch.isfinite(o)).nonzero()[:3].tolist()
        return f"non-finite output at {bad}"
    zero = (r == 0).all(dim=-1)
    if not (o[zero] == 0).all():
        return f"{int((o[zero] != 0).any(dim=-1).sum())} (row, head) pairs should be 0 and are not"
    scale = r.abs().amax(dim=-1, keepdim=True)
    err = (o - r).abs().amax(dim=-1, keepdim=True)
    rel_bad = (err > rtol * scale + 1e-30) & ~zero[..., None]
    if rel_bad.any():
        i = rel_bad.nonzero()[0].tolist()[:2]
        return f"max error {err[tuple(i)].item():.3g} > {rtol} x {scale[tuple(i)].item():.3g} at (row, head) {i}"
    cos = torch.nn.functional.cosine_similarity(o, r, dim=-1)
    cos_bad = (cos < min_cos) & ~zero
    if cos_bad.any():
        i = cos_bad.nonzero()[0].tolist()
        return f"cosine similarity {cos[tuple(i)].item():.5f} < {min_cos} at (row, head) {i}"
    return None


def every_code_cases(device):
    """Two fp8 cases of 9 rows (top-k 300, pages of 64), no invalid index: K and V bytes run through every e4m3
    code but NaN (subnormals, +-0, +-448), then the same with NaN codes in three valid tokens' K and V (rows 0,
    3, 4). Returns (finite case, NaN case), each (q, k_cache, v_cache, indices, block_table, token_to_req)."""
    q, kc, vc, idx, bt, t2r = make_case(9, 24, 2, 128, 128, page=64, num_blocks=40, num_reqs=3, max_pages=8,
                                        topk=300, dtype=FP8, seed=21, hostile=False)
    kb = (torch.arange(kc.numel()) % 256).to(torch.uint8).view(kc.shape)
    vb = ((torch.arange(vc.numel()) * 7 + 3) % 256).to(torch.uint8).view(vc.shape)
    for b in (kb, vb):
        b[b == 0x7F] = 0x7E
        b[b == 0xFF] = 0xFE
    finite = tuple(x.to(device) for x in (q, kb.clone().view(FP8), vb.clone().view(FP8), idx, bt, t2r))

    def slot(r, j):
        pos = int(idx[r, j])
        return int(bt[int(t2r[r]), pos // 64]), pos % 64

    vb[slot(0, 0)][1, 3] = 0x7F
    vb[slot(4, 5)][0, 100] = 0xFF
    kb[slot(3, 2)][0, 5] = 0x7F
    return finite, tuple(x.to(device) for x in (q, kb.view(FP8), vb.view(FP8), idx, bt, t2r))

