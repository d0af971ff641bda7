"""CUDA C++ provider of dsa.paged_indexer_logits (kernel: include/dsa_cuda/sm90_paged_indexer_logits.cuh,
Hopper only; the scoring core is indexer_logits' own, sm90_indexer_core.cuh).

Calls ``torch.ops.dsa_cuda.paged_indexer_logits_out(q, kv_cache, weights, context_lens, block_table,
max_context_len, clean, fp8_mma, config, out)`` with ``fp8_mma = not precise``; ``config`` picks the
kernel variant (`make_config`), 0 the launcher's defaults (``resolve`` in kernels/paged_indexer_logits.cu,
the one place they are chosen; `default_config` names them for the tests, which check that the two agree).
Every variant gives the same scores bit for bit, but loader TMA's: its MMAs read
the keys from shared memory in natural D order (the others permute D in A and Q alike), so its fp8 MMAs
accumulate the products in another grouping, within the fp8 mode's bound.

precise=False (the op's default) feeds e4m3 to the fp8 tensor cores (2x the rate, ~14-bit accumulation
inside the MMA); precise=True widens it to fp16 in registers (exact) for fp16 MMAs with fp32
accumulation. H200, 64 requests x 65536 positions, fp8: next_n 1 138.6 us with balanced schedule, bulk
loader and 3 math warpgroups against 162.3 with chunks, cp.async and 3; next_n 2 (MMA N = 128) 182.4 us with
3 math warpgroups fed by a producer warpgroup against 212.8 with 2. At N <= 64 the default is 4 math
warpgroups fed by a producer warpgroup (H100, next_n 1: 195.7 against 196.9 us with 3 on distinct pages,
117.1 against 131.1 on L2-resident ones); at N = 128 in the fp8 mode 4 math warpgroups with loader TMA (H100,
next_n 2: 203.0 against 205.3 us with 3 and the bulk loader on distinct pages, 150.8 against 162.5 on
L2-resident ones).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import aligned16, route_following_registry, sm90_only

OP = "paged_indexer_logits"
_KERNEL = "paged_indexer_logits_out"
# Page loaders and schedules of `make_config` (PagedIndexerLogitsParams::config). TMA: each page's values one
# TMA box into 128-byte-swizzled rows, which the MMAs read as A from shared memory (no A fragments in
# registers); with a producer warpgroup at MMA N = 128 in the fp8 mode only (`tma_offered`).
CP_ASYNC, BULK, TMA = 1, 2, 3
CHUNKS, BALANCED = 1, 2
# The warpgroups field's 4: 3 math warpgroups fed by a producer warpgroup (setmaxnreg 40 / 152), offered at
# MMA N = 128 only (`producer_warpgroup_offered`), the default there; 5: 4 math warpgroups fed by a producer
# warpgroup (setmaxnreg 32 / 112), offered at N <= 64 (`four_warpgroups_offered`), the default there, and at
# N = 128 with loader TMA.
PRODUCER_WG = 4
FOUR_WGS = 5
_fn = None  # the loaded OpOverload, resolved on the first call
_TILE = 128
BLOCK = 64


def make_config(math_warpgroups: int = 0, loader: int = 0, schedule: int = 0) -> int:
    """The kernel's config int: math warpgroups per CTA (2 or 3, see `three_warpgroups_fit`; PRODUCER_WG:
    3 fed by a producer warpgroup, see `producer_warpgroup_offered`; FOUR_WGS: 4 fed by a producer
    warpgroup, see `four_warpgroups_offered`), page loader (CP_ASYNC, BULK or TMA, see `tma_offered`) and
    schedule (CHUNKS or BALANCED); 0 leaves a field to the launcher's default (`default_config`)."""
    if math_warpgroups not in (0, 2, 3, PRODUCER_WG, FOUR_WGS):
        raise ValueError(f"math_warpgroups must be 0, 2, 3, PRODUCER_WG (4) or FOUR_WGS (5), got {math_warpgroups}")
    if loader not in (0, CP_ASYNC, BULK, TMA):
        raise ValueError(f"loader must be 0, CP_ASYNC (1), BULK (2) or TMA (3), got {loader}")
    if schedule not in (0, CHUNKS, BALANCED):
        raise ValueError(f"schedule must be 0, CHUNKS (1) or BALANCED (2), got {schedule}")
    return math_warpgroups + 10 * loader + 100 * schedule


def rows_per_item(heads: int, next_n: int) -> int:
    """Tokens per item (the launcher's rows_per_item): MMA N = rows x heads <= 128."""
    rows = 1
    while rows < 128 // heads and rows < next_n:
        rows *= 2
    return rows


def three_warpgroups_fit(heads: int, next_n: int) -> bool:
    """Whether the launcher offers 3 math warpgroups: at MMA N = rows x heads <= 64 (416 threads get 128
    registers a thread, too few for N = 128's 64 accumulators with the weights in registers)."""
    return heads * rows_per_item(heads, next_n) <= 64


def producer_warpgroup_offered(heads: int, next_n: int) -> bool:
    """Whether the launcher offers PRODUCER_WG (3 math warpgroups fed by a producer warpgroup, setmaxnreg
    giving the math threads 152 registers): at MMA N = rows x heads = 128 only, where 3 warpgroups with a
    producer warp do not fit; the launcher's default there."""
    return heads * rows_per_item(heads, next_n) == 128


def four_warpgroups_offered(heads: int, next_n: int) -> bool:
    """Whether the launcher offers FOUR_WGS (4 math warpgroups fed by a producer warpgroup, setmaxnreg giving
    the math threads 112 registers): at MMA N = rows x heads <= 64 only (N = 128's 64 accumulators and 32
    weights do not fit 112)."""
    return heads * rows_per_item(heads, next_n) <= 64


def tma_offered(heads: int, next_n: int, precise: bool) -> bool:
    """Whether the launcher offers loader TMA (with PRODUCER_WG or FOUR_WGS): at MMA N = 128 in the fp8 mode
    only."""
    return producer_warpgroup_offered(heads, next_n) and not precise


def default_config(heads: int, next_n: int, precise: bool) -> int:
    """The explicit config the launcher's default (config 0) runs for a shape and mode, as `resolve` in
    kernels/paged_indexer_logits.cu chooses it (a GPU test checks the two agree bitwise): balanced; FOUR_WGS and
    BULK at MMA N <= 64; at N = 128 FOUR_WGS and TMA in the fp8 mode, PRODUCER_WG and BULK in the exact mode."""
    if heads * rows_per_item(heads, next_n) <= 64:
        return make_config(FOUR_WGS, BULK, BALANCED)
    return make_config(PRODUCER_WG, BULK, BALANCED) if precise else make_config(FOUR_WGS, TMA, BALANCED)


def natural_order(config: int, heads: int, next_n: int, precise: bool) -> bool:
    """Whether `config` runs loader TMA for the shape (its default loader resolved as the launcher does): its MMAs
    read the keys in natural D order, so its scores are bitwise those of the other TMA configs, not the others'."""
    loader = config // 10 % 10
    if loader == 0:
        producer_wg = config % 10 in (0, PRODUCER_WG, FOUR_WGS)
        loader = TMA if producer_wg and tma_offered(heads, next_n, precise) else BULK
    return loader == TMA


def variants(next_n: int, heads: int = 64, precise: bool = False) -> list[int]:
    """Every distinct explicit config the launcher takes for a shape and mode."""
    return [make_config(g, ld, sc) for sc in (CHUNKS, BALANCED) for ld in (CP_ASYNC, BULK, TMA)
            for g in (2, 3, PRODUCER_WG, FOUR_WGS)
            if (ld != TMA and (g == 2 or (g == 3 and three_warpgroups_fit(heads, next_n))
                               or (g == PRODUCER_WG and producer_warpgroup_offered(heads, next_n))
                               or (g == FOUR_WGS and four_warpgroups_offered(heads, next_n))))
            or (ld == TMA and g in (PRODUCER_WG, FOUR_WGS) and tma_offered(heads, next_n, precise))]


def run(q, kv_cache, weights, context_lens, block_table, max_context_len, clean, precise, *,
        config: int = 0, out=None):
    """The op's arguments in schema order (validated by the op); `config` (make_config) for sweeps and
    tests, 0 for the defaults."""
    global _fn
    fn = _fn
    if fn is None:
        from . import op

        fn = _fn = op(_KERNEL, q.device)
    if out is None:
        out = torch.empty((q.shape[0] * q.shape[1], max_context_len), dtype=torch.float32, device=q.device)
    fn(q, kv_cache, weights, context_lens, block_table, int(max_context_len), bool(clean), not precise,
       int(config), out)
    return out


def unsupported_shape(q, kv_cache, max_context_len) -> Optional[str]:
    """The device-independent part of `supports` (the kernel's limits), CPU-testable."""
    b, next_n, h, d = q.shape
    if h not in (32, 64):
        return f"{h} heads (the CUDA paged kernel takes 32 or 64)"
    if d != 128:
        return f"head dim {d} (the CUDA paged kernel takes 128)"
    # The math threads' -inf fill strides up to 512 keys past the last one in int32 (smxx_indexer.cuh).
    if max_context_len > 2**31 - 1 - 8 * _TILE:
        return "max_context_len of 2^31 - 1024 or more"
    if kv_cache.shape[0] >= 2**31 - 1:
        return "2^31 - 1 cache blocks or more"
    if next_n > 1024 or b * next_n >= 2**28:
        return f"next_n {next_n} > 1024 or 2^28 query rows or more"
    if b * next_n * -(-max_context_len // _TILE) >= 2**35:
        return "2^35 128-position output tiles or more"
    # 16-byte copies of q rows and of cache blocks.
    if not aligned16(q, (q.stride(0), q.stride(1), q.stride(2))):
        return "q's data or batch/token/head strides are not 16-byte aligned"
    if kv_cache.shape[0] > 0 and not aligned16(kv_cache, (kv_cache.stride(0),)):
        return f"kv_cache's data or block stride ({kv_cache.stride(0)} bytes) is not 16-byte aligned"
    return None


def supports(q, kv_cache, weights, context_lens, block_table, max_context_len, clean, precise) -> Optional[str]:
    return sm90_only(q, "CUDA paged indexer") or unsupported_shape(q, kv_cache, max_context_len)


def unsupported_arch(cap: tuple[int, int], forced: Optional[str]) -> Optional[str]:
    """Why the kernels do not serve compute capability `cap` (None on SM90; wgmma, no SM100 variant yet)."""
    return None if cap[0] == 9 else f"compute capability {cap[0]}.{cap[1]}: the CUDA paged indexer kernel is SM90-only"


def take_route(registry, ns, available) -> int:
    """After the library's load: the C++ CUDA-key kernel of the op (csrc/paged_indexer_logits_route.cpp) serves the
    devices this provider would, whenever the registry would pick it (route_following_registry); the mask now."""
    return route_following_registry(registry, available, OP, _registered.get(OP), unsupported_arch,
                                    ns.paged_indexer_logits_route_set.default)


_registered: dict = {}  # OP -> the provider register() added: what the C++ kernel stands in for


def register() -> None:
    from dsa_ops import registry

    from . import available

    _registered[OP] = registry.Provider(OP, "cuda", run, supports, available)
    registry.register_provider(_registered[OP])
