"""Reference building blocks shared by several ops: the ranking key, windows and page mapping.

Plain torch, device-agnostic: the same code is the CPU reference and, on a GPU, the oracle that the
GPU tests compare kernels against at full size.
"""

from __future__ import annotations

import torch

INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)


def ordered_key(scores: torch.Tensor, nan_first: bool = False) -> torch.Tensor:
    """int32 key whose signed order is the ranking order of the (fp32-exact) scores.

    Larger score ranks first; +0.0 equals -0.0; every NaN ranks below -inf, or above +inf with
    `nan_first` (torch.topk's order); all NaNs are equal.
    """
    x = scores.float()
    x = torch.where(x == 0, torch.zeros_like(x), x)  # -0.0 -> +0.0
    bits = x.view(torch.int32)
    key = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # negative floats: reverse their order
    nan_key = INT32_MAX if nan_first else -(2**31) + 1  # above +inf (0x7F800000) or below -inf
    return torch.where(torch.isnan(x), torch.full_like(key, nan_key), key)


def windows(rows: int, width: int, lengths, row_starts, device):
    """Clipped window [lo, hi) per row as int64, plus the start that relative indices count from."""
    start = row_starts.long() if row_starts is not None else torch.zeros(rows, dtype=torch.long, device=device)
    if lengths is None:
        length = width - start
    else:
        length = lengths.long()
    length = length.clamp(min=0)
    lo = start.clamp(0, width)
    hi = (start + length).clamp(0, width)
    hi = torch.maximum(hi, lo)
    return lo, hi, start


def window_topk(scores: torch.Tensor, k: int, lengths=None, row_starts=None, nan_first: bool = False) -> torch.Tensor:
    """Exact top-k of each row's window: int32 [R, k], indices relative to the row start, ascending,
    then -1 padding. Ranking: larger first, ties to the smaller index, NaN last (first with
    `nan_first`; NaNs tie among themselves), +0.0 == -0.0."""
    rows, width = scores.shape
    dev = scores.device
    out = torch.full((rows, k), -1, dtype=torch.int32, device=dev)
    if rows == 0 or width == 0:
        return out
    lo, hi, start = windows(rows, width, lengths, row_starts, dev)
    col = torch.arange(width, device=dev)
    # Unique int64 composite: ranking key in the high word, reversed column in the low word.
    comp = (ordered_key(scores, nan_first).long() << 32) | (0xFFFFFFFF - col)
    inside = (col[None, :] >= lo[:, None]) & (col[None, :] < hi[:, None])
    comp = torch.where(inside, comp, torch.full_like(comp, INT64_MIN))
    kk = min(k, width)
    vals, idx = torch.topk(comp, kk, dim=1, largest=True, sorted=False)
    picked = vals != INT64_MIN
    rel = torch.where(picked, idx - start[:, None], torch.full_like(idx, 2**62))
    rel, _ = torch.sort(rel, dim=1)
    rel = torch.where(rel == 2**62, torch.full_like(rel, -1), rel)
    out[:, :kk] = rel.to(torch.int32)
    return out


def map_through_page_table(idx, page_table, row_to_batch, page_table_row_starts, page_size):
    """out[r, j] = page_table[b, ps + i // P] * P + i % P, or -1 where i < 0, the batch row or page
    slot is outside the table, the page entry is negative, or the slot id does not fit in int32."""
    rows, k = idx.shape
    nb, max_pages = page_table.shape
    dev = idx.device
    if rows == 0 or k == 0:
        return torch.empty((rows, k), dtype=torch.int32, device=dev)
    r = torch.arange(rows, device=dev)
    b = row_to_batch.long() if row_to_batch is not None else r
    ps = page_table_row_starts.long() if page_table_row_starts is not None else torch.zeros_like(r)
    i = idx.long()
    slot = ps[:, None] + torch.div(i, page_size, rounding_mode="floor")
    ok = (i >= 0) & (b[:, None] >= 0) & (b[:, None] < nb) & (slot >= 0) & (slot < max_pages)
    if nb == 0 or max_pages == 0:
        return torch.full((rows, k), -1, dtype=torch.int32, device=dev)
    page = page_table[b.clamp(0, nb - 1)[:, None], slot.clamp(0, max_pages - 1)].long()
    # page * P + i % P fits in int32 exactly when page <= (2^31 - 1) >> log2(P) (P a power of two); testing the
    # page first keeps the product from wrapping int64 for page sizes up to 2^62.
    max_page = INT32_MAX >> min(page_size.bit_length() - 1, 31)
    ok &= (page >= 0) & (page <= max_page)
    phys = page.clamp(0, max_page) * page_size + torch.remainder(i, page_size)
    return torch.where(ok, phys, torch.full_like(phys, -1)).to(torch.int32)
