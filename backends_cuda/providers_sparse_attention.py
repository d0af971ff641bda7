"""CUDA C++ provider of dsa.sparse_attention for fp8 e4m3 caches (kernel:
include/dsa_cuda/smxx_sparse_attention.cuh; runs on Hopper, the H200; compiled for the SM100 family, not run).

Calls ``torch.ops.dsa_cuda.sparse_attention_out(q, k_cache, v_cache, indices, block_table, token_to_req,
softmax_scale, k_scale, v_scale, splits, whole, cta_warps, out, workspace)``. A unit is one query row x one KV
head x one split of its top-k positions. With one split and at most one unit an SM, a CTA has 16 warps (one an
SM, 200 KiB of shared memory) that share the unit's steps; otherwise a CTA has 4 warps (53 KiB, 4 CTAs an SM)
and takes one unit, or with one split of 24 steps or more several in turn (a persistent grid). (128 registers a
thread either way.) When rows x KV heads are fewer
than SPLIT_CTAS, the top-k axis is cut into splits whose fp32 partials go to a workspace sized from the
shapes (allocated here, no host sync: CUDA-graph safe) and a combine kernel writes out. A split tail (`whole`
items unsplit, the rest split) serves the items past one wave of the persistent grid (`split_plan`). The op's automatic
choice (ops_core/ops/sparse_attention.py, `prefer`) sends the fewest rows to the Triton kernel's split-K path.

Serves fp8 caches with head dim 128 and up to 16 query heads per KV head; bf16 caches are declined with the
reason (the Triton kernel runs them at the memory rate). On compute capability 10.x the kernel has never run
on a GPU, so `supports` declines there unless the cuda backend is forced.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import aligned16, capability, route_following_registry, sm_count

OP = "sparse_attention"
_KERNEL = "sparse_attention_out"
D = 128
MAX_GROUP = 16  # query heads per KV head: the MMA's M
STEP = 16  # tokens a warp step
WARPS = 4
# Split while (row, KV head) CTAs are fewer than SPLIT_CTAS, into at most MAX_SPLITS: H200 sweep (24 q / 2 KV
# heads, top-k 2048, cold-L2 graph replay, `DSA_BENCH_SWEEP=1 pytest benchmarks/bench_sparse_attention.py -k
# cuda_splits_sweep`, d63bf07), us by splits 1 / 2 / 4 / 8: 1 row 37.8 / 27.2 / 21.6 / 19.6 (16: 20.8, 32: 25.6);
# 16 rows 38.5 / 29.2 / 23.8 / 28.7 (3: 24.9); 32 rows 38.8 / 30.2 / 32.5 / 44.3; 64 rows 40.3 / 41.2 / 51.8 / 77.3;
# 128 rows 55.4 / 68.6 / 93.9 / 140.9. Splits pay below one CTA an SM (64 rows x 2 KV heads), cost above it.
SPLIT_CTAS = 128
MAX_SPLITS = 8
CTAS_PER_SM = 4  # the kernel's occupancy: a persistent grid's slots are 4 an SM
MULTI_UNIT_MIN_STEPS = 24  # the kernel's kMultiUnitMinSteps: fewer steps, one CTA a unit (no persistent grid)
# Split tail: when the items past one wave of slots are at most TAIL_MAX_SHARE of a wave, the first wave's
# items run unsplit (one CTA each) and the rest are cut into TAIL_SPLITS units that the block scheduler hands to
# the slots the first wave frees; the persistent grid would run those few second units nearly alone. Tail sweep
# (`DSA_BENCH_SWEEP=1 pytest benchmarks/bench_sparse_attention.py -k cta_sweep`, its `w4` and `slots4` columns),
# persistent -> 4 splits, us:
# H200 300 rows 109.9 -> 99.3, 400 126.9 -> 132.8; H100 270 138.3 -> 118.3, 300 139.4 -> 129.1, 330 144.5 ->
# 141.3, 360 155.5 -> 152.4, 400 162.3 -> 170.5 (docs/design_attention.md).
TAIL_SPLITS = 4
TAIL_MAX_SHARE = 0.25
# One wave of items, from WIDE_MIN_ITEMS up to one an SM: one split, which the launcher runs in CTAs of 16 warps
# (one an SM, a unit's steps over all 16). H200, 24 q / 2 KV heads, top-k 2048 (`DSA_BENCH_SWEEP=1 pytest
# benchmarks/bench_sparse_attention.py -k cta_sweep`), us, 16 warps against the 4-warp plan: 64 rows 29.8
# against 39.4 (one split) / 35.3 (2), 32 rows 26.6 against 29.7 (2 splits) / 27.2 (4); 16 rows 26.4 / 23.3 (2
# splits) against 21.8 (4 splits, 4 warps): below 64 items the 4-warp splits stay. Past one wave 16-warp CTAs
# lose (400 rows 155.6 against 128.7 us; docs/design_attention.md).
WIDE_MIN_ITEMS = 64
_fn = None  # the loaded OpOverload, resolved on the first call


def split_count(rows: int, kv_heads: int, topk: int) -> int:
    """Splits of each (row, KV head)'s top-k axis; 1 is the single pass. Shapes only (measured on the H200's
    132 SMs)."""
    items = max(1, rows * kv_heads)
    steps = max(1, -(-topk // STEP))
    want = max(1, min(-(-SPLIT_CTAS // items), steps // WARPS, MAX_SPLITS))
    per = -(-steps // want)
    return -(-steps // per)


def split_plan(rows: int, kv_heads: int, topk: int, sms: int) -> tuple[int, int]:
    """(splits, whole): splits of each (row, KV head)'s top-k axis and, with a split tail, the leading items
    that run unsplit (0: every item split alike). Shapes and the SM count only."""
    items, slots = rows * kv_heads, sms * CTAS_PER_SM
    if WIDE_MIN_ITEMS <= items <= sms:
        return 1, 0
    splits = split_count(rows, kv_heads, topk)
    persistent = splits == 1 and -(-topk // STEP) >= MULTI_UNIT_MIN_STEPS
    if TAIL_SPLITS and persistent and 0 < items - slots <= TAIL_MAX_SHARE * slots:
        return TAIL_SPLITS, slots
    return splits, 0


def workspace_floats(rows: int, kv_heads: int, splits: int, whole: int = 0) -> int:
    """fp32 elements of the split workspace (partial outputs, maxima and sums of the split items); 0 for one
    split."""
    return 0 if splits <= 1 else (rows * kv_heads - min(whole, rows * kv_heads)) * splits * MAX_GROUP * (D + 2)


def launch(q, k_cache, v_cache, indices, block_table, token_to_req, softmax_scale, k_scale, v_scale, out, *,
           splits: Optional[int] = None, whole: int = 0, warps: int = 0):
    """Kernel form of dsa::sparse_attention.out (arguments validated by the op); `splits` forces a split count
    (and `whole` the unsplit items of a split tail), `warps` the warps a CTA (4 or 16; 0: the launcher's rule)."""
    if (splits is not None and int(splits) < 1) or int(whole) < 0 or warps not in (0, 4, 16):
        raise ValueError(f"`splits` must be >= 1, `whole` >= 0 and `warps` 0, 4 or 16, got {splits}, {whole}, {warps}")
    global _fn
    fn = _fn
    if fn is None:
        from . import op

        fn = _fn = op(_KERNEL, q.device)
    t = q.shape[0]
    hkv = k_cache.shape[2]
    if splits is None:
        splits, whole = split_plan(t, hkv, indices.shape[1], sm_count(q.device.index))
    splits, whole = int(splits), int(whole)
    ws = torch.empty((workspace_floats(t, hkv, splits, whole),), dtype=torch.float32, device=q.device)
    fn(q, k_cache, v_cache, indices, block_table, token_to_req, float(softmax_scale), float(k_scale), float(v_scale),
       splits, whole, int(warps), out, ws)


def unsupported_shape(q, k_cache, v_cache, indices, block_table) -> Optional[str]:
    """The device-independent part of `supports` (the kernel's limits), CPU-testable."""
    if k_cache.dtype != torch.float8_e4m3fn:
        return (f"{k_cache.dtype} cache: the CUDA kernel takes fp8 e4m3 caches (the Triton kernel runs bf16 caches "
                "at the memory rate)")
    t, hq, d = q.shape
    nb, page, hkv, dv = v_cache.shape
    if d != D or dv != D:
        return f"head dims {d} / {dv} (the CUDA kernel takes 128 / 128)"
    if hkv == 0 or hq % hkv or hq // hkv > MAX_GROUP:
        return f"{hq} query heads over {hkv} KV heads (the CUDA kernel takes 1 to {MAX_GROUP} a KV head)"
    if indices.shape[1] >= 2**30:
        return f"top-k {indices.shape[1]}: 2**30 or more"
    if nb >= 2**31 or block_table.shape[0] >= 2**31 or block_table.shape[1] * page >= 2**31:
        return "block ids or request-relative positions past int32"
    if t * hkv * MAX_SPLITS >= 2**31:
        return f"{t} rows x {hkv} KV heads: too many CTAs"
    if q.stride(2) != 1 or not aligned16(q, (q.stride(0), q.stride(1))):
        return "q's data or row/head strides are not 16-byte aligned (or its last stride is not 1)"
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not aligned16(c, c.stride()[:3]):
            return f"{name}'s data or block/token/head strides are not 16-byte aligned (16-byte copies)"
    return None


def unsupported_arch(cap: tuple[int, int], forced: Optional[str]) -> Optional[str]:
    """Why the kernel does not serve compute capability `cap` (None when it does), `forced` the forced backend."""
    major, minor = cap
    if major == 9 or (major == 10 and forced == "cuda"):
        return None
    if major == 10:
        return (f"compute capability {major}.{minor}: the CUDA sparse attention kernel is compiled for sm_100a / "
                "sm_107a, not run; it serves only when the cuda backend is forced")
    return f"compute capability {major}.{minor}: the CUDA sparse attention kernel is built for 9.x and 10.x"


def supports(q, k_cache, v_cache, indices, block_table, token_to_req, softmax_scale, k_scale, v_scale,
             out=None) -> Optional[str]:
    from dsa_ops import registry

    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    return (unsupported_arch(capability(index), registry.forced_backend())
            or unsupported_shape(q, k_cache, v_cache, indices, block_table))


def take_route(registry, ns, available) -> int:
    """After the library's load: the C++ CUDA-key kernel of the op (csrc/sparse_attention_route.cpp) serves the
    devices this provider would, whenever the registry would pick it (route_following_registry); the mask now."""
    return route_following_registry(registry, available, OP, _registered.get(OP), unsupported_arch,
                                    ns.sparse_attention_route_set.default)


_registered: dict = {}  # OP -> the provider register() added: what the C++ kernels stand in for


def register() -> None:
    from dsa_ops import registry

    from . import available

    _registered[OP] = registry.Provider(OP, "cuda", launch, supports, available)
    registry.register_provider(_registered[OP])
