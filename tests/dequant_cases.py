"""Adversarial inputs for dequant_k_cache_paged, shared by the interpreter and the GPU tests.

Caches are random bytes (so e4m3 NaN codes 0x7f / 0xff, subnormals, NaN / inf / subnormal fp32 scales
and NaN bf16 rope payloads all occur) laid out as views with any page stride and base offset, with the
v4 scale bytes cycling through every value 0..255 and a few tokens forced to the edge cases. Slot lists
mix valid slots with -1, INT_MIN, INT_MAX, the slot count and the slots around it.
"""

from __future__ import annotations

import torch

LAYOUTS = {"v32": (656, 576), "v4": (584, 512)}
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def make_cache(layout, num_blocks, page_size, *, pad=0, offset=0, seed=0, device="cpu"):
    """uint8 [num_blocks, page_size, 1, bytes] over random bytes: page stride page_size * bytes + pad,
    first page `offset` bytes into its storage (offset % 16 != 0 or pad % 16 != 0: the unaligned path)."""
    bpt = LAYOUTS[layout][0]
    stride = page_size * bpt + pad
    g = torch.Generator(device=device).manual_seed(seed)
    raw = torch.randint(0, 256, (offset + num_blocks * stride,), generator=g, dtype=torch.uint8, device=device)
    cache = raw.as_strided((num_blocks, page_size, 1, bpt), (stride, bpt, bpt, 1), offset)
    pages = raw.as_strided((num_blocks, page_size * bpt), (stride, 1), offset)  # the same bytes, one row a page
    if layout == "v4":
        sc = pages[:, page_size * 576:].view(num_blocks, page_size, 8)
        every = torch.arange(num_blocks * page_size * 7, device=device) % 256  # every ue8m0 byte, cycling
        sc[:, :, :7] = every.view(num_blocks, page_size, 7).to(torch.uint8)
    _force_edges(layout, pages, page_size, device)
    return cache


def _force_edges(layout, pages, page_size, device):
    """Tokens 0-5 of page 0: all e4m3 NaN (0x7f, 0xff), all zero, min subnormals (0x01, 0x81), max
    (0x7e); v32 token scales: a NaN with payload, +inf, the smallest subnormal, -0.0; v4: scale bytes 0
    (2^-127), 255 (+inf), 127."""
    codes = [0x7F, 0xFF, 0x00, 0x01, 0x81, 0x7E]
    for t, c in enumerate(codes[:page_size]):
        if layout == "v4":
            pages[0, t * 576:t * 576 + 448] = c
            pages[0, page_size * 576 + t * 8:page_size * 576 + t * 8 + 7] = torch.tensor(
                [0, 255, 127, 0, 255, 1, 254], dtype=torch.uint8, device=device)
        else:
            pages[0, t * 656:t * 656 + 512] = c
            bits = torch.tensor([0x7FA00001, 0x7F800000, 0x00000001, -(2**31)], dtype=torch.int32, device=device)
            pages[0, t * 656 + 512:t * 656 + 528] = bits.view(torch.uint8)


def make_slots(num_blocks, page_size, n, *, seed=0, device="cpu"):
    """int32 [n]: random slots in [-2, num_blocks * page_size + 2) with the edge values at the front."""
    total = num_blocks * page_size
    g = torch.Generator(device=device).manual_seed(seed + 1)
    s = torch.randint(-2, total + 2, (n,), generator=g, dtype=torch.int64, device=device)
    edges = [-1, INT32_MIN, INT32_MAX, total, total + 1, total - 1, 0, 1, 2, 3, 4, 5]
    k = min(n, len(edges))
    s[:k] = torch.tensor(edges[:k], dtype=torch.int64, device=device)
    return s.clamp(INT32_MIN, INT32_MAX).to(torch.int32)


def poisoned_out(n, layout, device="cpu"):
    """A NaN-filled output buffer: a row the kernel does not write shows."""
    return torch.full((n, LAYOUTS[layout][1]), float("nan"), dtype=torch.bfloat16, device=device)


def bit_mismatch(out, ref) -> str:
    """'' when out and ref are bitwise equal, else where they first differ."""
    if out.shape != ref.shape:
        return f"shape {list(out.shape)} != {list(ref.shape)}"
    a, b = out.view(torch.int16), ref.view(torch.int16)
    bad = (a != b).nonzero()
    if bad.numel() == 0:
        return ""
    i, j = bad[0].tolist()
    return (f"{bad.shape[0]} of {a.numel()} values differ; first [{i}, {j}]: "
            f"0x{a[i, j].item() & 0xFFFF:04x} vs reference 0x{b[i, j].item() & 0xFFFF:04x}")
