"""dsa.dequant_k_cache_paged: gather tokens of a paged fp8 MLA cache and dequantise them to bf16.

kv_cache is uint8 [num_blocks, P, 1, bytes_per_token]; the page stride is stride(0) (padded pages are
views), the inside of a page is contiguous. slots are physical ids page * P + offset; -1 or a slot past
the cache gives a zero row. Arithmetic: bf16(f32(x) * scale), bitwise.

Layouts:
- "v32" (656 bytes a token, token by token): 512 fp8 e4m3, 4 fp32 scales (one per 128), 64 bf16 rope.
  Output [n, 576].
- "v4" (584 bytes a token, split by field inside each page): P * 576 bytes of per-token (448 fp8, 64
  bf16 rope), then P * 8 bytes of per-token (7 ue8m0 scales, one per 64 values, 1 pad). e -> 2^(e-127).
  Output [n, 512].
"""

from __future__ import annotations

import torch

from .._checks import check_tensor, fail
from .._define import define_op

NAME = "dequant_k_cache_paged"
SCHEMA = "(Tensor kv_cache, Tensor slots, *, str layout) -> Tensor"
LAYOUTS = {  # layout: (bytes per token, output width)
    "v32": (656, 576),
    "v4": (584, 512),
}


def check_cache(op, kv_cache, layout):
    """Shared with sparse_mla_decode."""
    if layout not in LAYOUTS:
        fail(op, f"`layout` must be one of {sorted(LAYOUTS)}, got {layout!r}")
    bpt = LAYOUTS[layout][0]
    check_tensor(op, "kv_cache", kv_cache, dtypes=torch.uint8, dim=4)
    nb, p, one, b = kv_cache.shape
    if one != 1 or b != bpt:
        fail(op, f"`kv_cache` must have shape [num_blocks, P, 1, {bpt}] for layout {layout!r}, "
                 f"got {list(kv_cache.shape)}")
    if p == 0:
        fail(op, f"`kv_cache` pages must hold at least one token (P, dim 1, is 0): got {list(kv_cache.shape)}")
    if nb > 0 and not kv_cache[0].is_contiguous():
        fail(op, f"`kv_cache` pages must be contiguous inside, got strides {kv_cache.stride()}")
    if nb > 1 and kv_cache.stride(0) < p * bpt:
        fail(op, f"`kv_cache` page stride {kv_cache.stride(0)} is below P * {bpt} bytes (pages overlap)")


def validate(kv_cache, slots, layout):
    check_cache(NAME, kv_cache, layout)
    check_tensor(NAME, "slots", slots, dtypes=torch.int32, dim=1, device_like=kv_cache)


def _ue8m0_to_f32(e: torch.Tensor) -> torch.Tensor:
    """2^(e - 127) built from its bits: exact for every byte (e = 0 is the subnormal 2^-127)."""
    e = e.int()
    bits = torch.where(e == 0, torch.full_like(e, 1 << 22), e << 23)
    return bits.view(torch.float32)


def dequant_slots(kv_cache, slots, layout):
    """bf16 [n, width] rows of the given slots; zero rows for invalid slots. Any device."""
    bpt, width = LAYOUTS[layout]
    nb, p = kv_cache.shape[0], kv_cache.shape[1]
    n = slots.shape[0]
    dev = kv_cache.device
    out = torch.zeros((n, width), dtype=torch.bfloat16, device=dev)
    if n == 0 or nb == 0:
        return out
    s = slots.long()
    ok = (s >= 0) & (s < nb * p)
    s = torch.where(ok, s, torch.zeros_like(s))
    page, off = s // p, s % p
    # Each page as one row of bytes, honouring the page stride (a view: nothing is copied).
    pages = kv_cache.as_strided((nb, p * bpt), (kv_cache.stride(0), 1))

    def take(start, count):  # bytes [start, start + count) of each slot's page, start per slot
        return pages[page[:, None], start[:, None] + torch.arange(count, device=dev)[None, :]]

    if layout == "v32":
        tok = take(off * bpt, bpt)
        vals = tok[:, :512].contiguous().view(torch.float8_e4m3fn).float().view(n, 4, 128)
        scales = tok[:, 512:528].contiguous().view(torch.float32)
        deq = (vals * scales[:, :, None]).view(n, 512).to(torch.bfloat16)
        rope = tok[:, 528:656].contiguous().view(torch.bfloat16)
    else:
        tok = take(off * 576, 576)
        sc = take(p * 576 + off * 8, 7)
        vals = tok[:, :448].contiguous().view(torch.float8_e4m3fn).float().view(n, 7, 64)
        deq = (vals * _ue8m0_to_f32(sc)[:, :, None]).view(n, 448).to(torch.bfloat16)
        rope = tok[:, 448:576].contiguous().view(torch.bfloat16)
    rows = torch.cat([deq, rope], dim=1)
    return torch.where(ok[:, None], rows, out)


def reference(kv_cache, slots, layout):
    return dequant_slots(kv_cache, slots, layout)


def fake(kv_cache, slots, layout):
    return kv_cache.new_empty((slots.shape[0], LAYOUTS[layout][1]), dtype=torch.bfloat16)


OP = define_op(NAME, SCHEMA, validate=validate, reference=reference, fake=fake)


def dequant_k_cache_paged(kv_cache: torch.Tensor, slots: torch.Tensor, *, layout: str) -> torch.Tensor:
    """Gather and dequantise tokens of a paged fp8 MLA cache.

    Args:
        kv_cache: uint8 [num_blocks, P, 1, 656 ("v32") or 584 ("v4")]; any page stride >= P * bytes.
        slots: int32 [n] physical slots (page * P + offset); -1 or past the cache gives a zero row.
        layout: "v32" (output [n, 576]) or "v4" (output [n, 512]).

    Returns:
        bfloat16 [n, 576 or 512]: ``bf16(f32(x) * scale)`` values then the bf16 rope part.
    """
    return torch.ops.dsa.dequant_k_cache_paged(kv_cache, slots, layout=layout)
