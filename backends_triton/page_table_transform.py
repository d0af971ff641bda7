"""page_table_transform in Triton: request-relative token indices -> physical KV slots.

Same contract as ``dsa_ops.ops._common.map_through_page_table``. One flat 1-D grid over the R*k
elements in blocks of BLOCK (so any number of rows works: nothing rides on a 65535-limited grid axis).
Every element is loaded and stored by the one program that owns it, so ``out`` may alias ``indices``.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ._launch import cdiv, unit_last_stride

BLOCK = 1024  # 4 warps x 32 lanes x 8 int32: two 16-byte vectors per lane
INT32_MAX = 2**31 - 1


@triton.jit
def page_table_transform_kernel(
    indices_ptr,  # int32 [R*k], contiguous
    page_table_ptr,  # int32 [B, max_pages], unit last stride
    row_to_batch_ptr,  # int32 [R] (unused unless HAS_ROW_TO_BATCH)
    row_starts_ptr,  # int32 [R] (unused unless HAS_ROW_STARTS)
    out_ptr,  # int32 [R*k], contiguous; may be indices_ptr
    numel,
    k,
    num_batches,
    max_pages,
    page_table_stride,
    log2_page_size,
    HAS_ROW_TO_BATCH: tl.constexpr,
    HAS_ROW_STARTS: tl.constexpr,
    INDEX_64: tl.constexpr,  # offsets need 64 bits (numel near or past 2**31)
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if INDEX_64:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
    live = offs < numel
    i = tl.load(indices_ptr + offs, mask=live, other=-1).to(tl.int64)
    row = offs // k  # int32 division unless INDEX_64: the expensive op here, kept narrow when it can be
    if HAS_ROW_TO_BATCH:
        b = tl.load(row_to_batch_ptr + row, mask=live, other=-1).to(tl.int64)
    else:
        b = row.to(tl.int64)
    if HAS_ROW_STARTS:
        ps = tl.load(row_starts_ptr + row, mask=live, other=0).to(tl.int64)
    else:
        ps = tl.zeros_like(i)
    # Everything in int64: ps + i // P and page * P + i % P can leave int32 for hostile tables.
    i_safe = tl.maximum(i, 0)  # i < 0 is rejected below; shift a non-negative value only
    page_of_i = i_safe >> log2_page_size
    slot = ps + page_of_i
    ok = live & (i >= 0) & (b >= 0) & (b < num_batches) & (slot >= 0) & (slot < max_pages)
    # Nothing outside the table is read: the load is masked by every bound above.
    page = tl.load(page_table_ptr + b * page_table_stride + slot, mask=ok, other=-1).to(tl.int64)
    # page * P + i % P fits in int32 exactly when page <= (2^31 - 1) >> log2(P): test the page before shifting
    # it, so the shift cannot wrap int64 for page sizes up to 2^62.
    max_page = 2147483647 >> tl.minimum(log2_page_size, 31)
    ok = ok & (page >= 0) & (page <= max_page)
    page = tl.where(ok, page, 0)
    phys = (page << log2_page_size) + (i_safe - (page_of_i << log2_page_size))
    tl.store(out_ptr + offs, tl.where(ok, phys, -1).to(tl.int32), mask=live)


def launch(indices, page_table, row_to_batch, page_table_row_starts, page_size, out, *, wrap=None):
    """Kernel form of dsa::page_table_transform.out (arguments already validated by the op).

    `wrap` is torch.library.wrap_triton inside the triton_op (so Inductor can trace the kernel);
    the provider calls this directly to keep the dispatcher off the per-call path.
    """
    numel = indices.numel()
    if numel == 0:
        return
    page_table, row_to_batch, page_table_row_starts = (
        unit_last_stride(x) for x in (page_table, row_to_batch, page_table_row_starts))
    k = indices.shape[1]
    nb, max_pages = page_table.shape
    kernel = page_table_transform_kernel if wrap is None else wrap(page_table_transform_kernel)
    grid = (cdiv(numel, BLOCK),)
    kernel[grid](
        indices,
        page_table,
        row_to_batch if row_to_batch is not None else indices,  # any valid pointer; never read
        page_table_row_starts if page_table_row_starts is not None else indices,
        out,
        numel,
        k,
        nb,
        max_pages,
        page_table.stride(0),
        int(page_size).bit_length() - 1,  # a power of two (checked by the op); int() pins a SymInt
        HAS_ROW_TO_BATCH=row_to_batch is not None,
        HAS_ROW_STARTS=page_table_row_starts is not None,
        INDEX_64=numel > INT32_MAX - BLOCK,
        BLOCK=BLOCK,
    )


@torch.library.triton_op("dsa_triton::page_table_transform_out", mutates_args={"out"})
def page_table_transform_out(
    indices: torch.Tensor,
    page_table: torch.Tensor,
    row_to_batch: Optional[torch.Tensor],
    page_table_row_starts: Optional[torch.Tensor],
    page_size: int,
    out: torch.Tensor,
) -> None:
    launch(indices, page_table, row_to_batch, page_table_row_starts, page_size, out,
           wrap=torch.library.wrap_triton)


def supports(indices, page_table, row_to_batch, page_table_row_starts, page_size, out) -> Optional[str]:
    # The op has validated dtypes, shapes and contiguity; every such call is served.
    return None


# For the compile gates (ops_core/gates.py): the kernel as the provider launches it most often.
# (name, jit_fn, signature, constexprs[, int args divisible by 16]): pointers are taken as 16-byte
# aligned, and the listed ints as multiples of 16, as Triton specializes them at launch (R*k usually
# is), so the gate sees the 16-byte vector loads and stores of the common case.
GATE_KERNELS = [
    (
        "page_table_transform",
        page_table_transform_kernel,
        {
            "indices_ptr": "*i32", "page_table_ptr": "*i32", "row_to_batch_ptr": "*i32",
            "row_starts_ptr": "*i32", "out_ptr": "*i32", "numel": "i32", "k": "i32",
            "num_batches": "i32", "max_pages": "i32", "page_table_stride": "i32", "log2_page_size": "i32",
            "HAS_ROW_TO_BATCH": "constexpr", "HAS_ROW_STARTS": "constexpr", "INDEX_64": "constexpr",
            "BLOCK": "constexpr",
        },
        {"HAS_ROW_TO_BATCH": True, "HAS_ROW_STARTS": True, "INDEX_64": False, "BLOCK": BLOCK},
        ["numel"],
    ),
]
