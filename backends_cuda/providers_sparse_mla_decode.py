"""CUDA C++ provider of dsa.sparse_mla_decode (kernels: include/dsa_cuda/sm90_sparse_mla_decode.cuh and
sm90_sparse_mla_decode_ws.cuh on Hopper, run on the H200; sm100_sparse_mla_decode.cuh on the SM100 family,
compiled, not run).

Calls ``torch.ops.dsa_cuda.sparse_mla_decode_out(q, kv_cache, indices, topk_lens, attn_sink, softmax_scale,
v4, splits, out, lse, workspace, variant)``. SM90 kernels: variant 0 (every warp loads and computes; forced
only) and variant 3 (producer, QK and PV warpgroups), which `variant_for` picks on SM90 (SM100: variant 0, the
tcgen05 kernel). Variant 1, the first form of variant 3, and variant 4, variant 3 in clusters of two CTAs at 128
heads, are removed (docs/design_attention.md, "Variants tried").
One CTA is one query token x 64 heads x one split of its top-k positions and holds about 227 KiB of shared
memory, so one CTA runs per SM: when B * s_q * H / 64 CTAs fill less than one wave, the top-k axis
is cut into splits (split-KV) whose fp32 partials go to a workspace sized from the shapes (allocated here,
no host sync: CUDA-graph safe) and a combine kernel writes out and lse.

On compute capability 10.x the tcgen05 kernel has never run on a GPU, so `supports` declines there unless
the cuda backend is forced (``dsa_ops.use_backend("cuda")`` or the environment variable): an op does not
run unverified code unasked.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import aligned16, capability, route_following_registry, sm90_or_forced_sm100, sm_count

OP = "sparse_mla_decode"
_KERNEL = "sparse_mla_decode_out"
DV = 512
HEADS_PER_CTA = 64
TILE = 64  # selected positions a step
LAYOUTS = {"v32": (656, 576), "v4": (584, 512)}  # bytes a token, q head dim
# Each split keeps at least MIN_SPLIT_TOKENS positions, and the CTAs stay within half a wave unless that leaves a
# split more than FEW_TILES tiles: a split's partial ([64, 512] fp32, 128 KiB) is written and read back, so 128
# partials cost more than halving each split's tiles saves. H200, top-k 2048, v32, variant 1 (variant 3's first
# form), us by 2 / 4 / 8 / 16
# / 32 splits (CUDA-graph replay): b1 h64 74.5 / 45.1 / 31.2 / 25.8 / 28.1; b4 h64 73.7 / 44.4 / 31.3 / 27.5 /
# 42.8; b4 h128 73.9 / 44.9 / 32.0 / 36.2 / 55.6; b8 h64 74.5 / 45.0 / 33.0 / 36.9 / 56.2; b8 h128 73.6 / 45.6 /
# 38.6 / 58.2 / 102.5; b32 h64 74.7 / 51.8 / 67.1 / 100.2 / 155.8. So 64 CTAs of 4 tiles (32.0) beat 128 of 2
# (36.2), and 128 CTAs of 4 tiles (38.6) beat 64 of 8 (45.6). Variant 3 (H100, DSA_BENCH_SWEEP=1 python -m pytest
# benchmarks/bench_sparse_mla_decode.py -m gpu -s -k splits_sweep, interleaved rounds), us by 4 / 8 / 16 / 32
# splits: b1 h64 39.9 / 28.9 / 24.9 / 29.9; b4 h64 38.4 / 28.2 / 27.6 / 45.7; b4 h128 38.1 / 30.0 / 35.1 / 65.5; b8
# h128 40.3 / 37.2 / 62.4 / 121.0; b32 h64 (2 / 4 / 8) 64.5 / 50.5 / 71.2: the rule's count is the fastest at each
# (FlashMLA 23.1 / 23.7 / 25.5 / 33.3 / 50.7 beside).
MIN_SPLIT_TOKENS = 128
FEW_TILES = 4
MAX_SPLITS = 64
_fn = None  # the loaded OpOverload, resolved on the first call


def split_count(batch: int, s_q: int, heads: int, topk: int, sms: int = 132) -> int:
    """Splits of each (query token, 64-head block)'s top-k axis; 1 is the single pass. Shapes only.

    The most splits that keep the CTAs (one an SM) within half a wave of `sms`, or within the whole wave when
    half leaves a split more than FEW_TILES tiles; each split at least MIN_SPLIT_TOKENS positions, at most
    MAX_SPLITS, none empty."""
    ctas = max(1, batch * s_q * -(-heads // HEADS_PER_CTA))
    tiles = max(1, -(-topk // TILE))

    def within(cap: int) -> int:
        want = max(1, min(cap // ctas, topk // MIN_SPLIT_TOKENS, tiles, MAX_SPLITS))
        per = -(-tiles // want)
        return -(-tiles // per)

    splits = within(sms // 2)
    if -(-tiles // splits) > FEW_TILES:
        splits = within(sms)
    return splits


# The three-role kernel (its first form, variant 1, with FlashMLA's cache hints on its gather) on SM90 at every
# shape. H200, FlashMLA's shapes (tools/smoke_sparse_mla_decode.py --time, us variant 0 / 1): b128 h128 s_q2 v32
# 640.2 / 490.1, b32 h64 s_q1 59.9 / 51.5, batch 1-4 (8 splits) 32.7-34.0 / 30.4-32.2; faster at every measured
# shape, both layouts.
def variant_for(cap: tuple[int, int]) -> int:
    """The kernel variant on compute capability `cap`: 3 on SM90, 0 elsewhere (the SM100 family).

    H200, v32 / v4, CUDA-graph replay beside FlashMLA: variant 3 2-4.5% faster than its first form (1) at every batch
    32-128 cell (b128 h64 s_q1 v32 135.2 -> 130.9 us, b128 h128 s_q2 485.3 -> 463.8), within 0.5 us at batch 1
    and 4 (docs/design_attention.md)."""
    return 3 if cap[0] == 9 else 0


def workspace_floats(batch: int, s_q: int, heads: int, splits: int) -> int:
    """fp32 elements of the split-KV workspace (partial outputs, row maxima and sums); 0 for one split."""
    if splits <= 1:
        return 0
    return batch * s_q * -(-heads // HEADS_PER_CTA) * splits * HEADS_PER_CTA * (DV + 2)


def launch(q, kv_cache, indices, softmax_scale, layout="v32", topk_lens=None, attn_sink=None, *,
           split: Optional[bool] = None, splits: Optional[int] = None, out: Optional[torch.Tensor] = None,
           lse: Optional[torch.Tensor] = None, variant: Optional[int] = None):
    """Kernel form of dsa::sparse_mla_decode (arguments validated by the op): returns (out, lse).

    `split` forces a path (None: split_count's heuristic; True with a one-split heuristic takes 2 splits);
    `splits` sets the split count outright (sweeps). `out` (bf16 [B, s_q, H, 512], unit last stride) and
    `lse` (fp32 [B, H, s_q], contiguous) are written in place when given (tests poison them first).
    `variant`: None picks by arch (variant_for); 0 or 3 forces a kernel (3: SM90 only)."""
    global _fn
    fn = _fn
    if fn is None:
        from . import op

        fn = _fn = op(_KERNEL, q.device)
    b, s_q, h, _ = q.shape
    topk = indices.shape[2]
    if out is None:
        out = torch.empty((b, s_q, h, DV), dtype=torch.bfloat16, device=q.device)
    if lse is None:
        lse = torch.empty((b, h, s_q), dtype=torch.float32, device=q.device)
    if splits is None:
        splits = split_count(b, s_q, h, topk, sm_count(q.device.index))
        if split is False:
            splits = 1
        elif split is True and splits == 1:
            splits = min(2, max(1, -(-topk // TILE)))
    if variant is None:
        index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        variant = variant_for(capability(index))
    splits = int(splits)
    if splits < 1:
        raise ValueError(f"`splits` must be >= 1, got {splits}")
    ws = torch.empty((workspace_floats(b, s_q, h, splits),), dtype=torch.float32, device=q.device)
    fn(q, kv_cache, indices, topk_lens, attn_sink, float(softmax_scale), layout == "v4", splits, out, lse, ws,
       int(variant))
    return out, lse


def run(q, kv_cache, indices, softmax_scale, layout="v32", topk_lens=None, attn_sink=None):
    """The op's arguments in schema order (validated by the op): (out, lse)."""
    return launch(q, kv_cache, indices, softmax_scale, layout, topk_lens, attn_sink)


def unsupported_shape(q, kv_cache, indices, layout="v32", attn_sink=None) -> Optional[str]:
    """The device-independent part of `supports` (the kernel's limits), CPU-testable."""
    b, s_q, h, _ = q.shape
    if h == 0 or h % HEADS_PER_CTA:
        return f"{h} heads (the CUDA kernel takes a multiple of {HEADS_PER_CTA})"
    if indices.shape[2] >= 2**31 - 1 - 2 * TILE:
        return f"top-k {indices.shape[2]}: 2**31 - 129 or more positions"
    if b * s_q * (h // HEADS_PER_CTA) * MAX_SPLITS >= 2**31:
        return f"{b} x {s_q} tokens x {h // HEADS_PER_CTA} head blocks: too many CTAs"
    if q.stride(3) != 1 or not aligned16(q, (q.stride(0), q.stride(1), q.stride(2))):
        return "q's data or batch/token/head strides are not 16-byte aligned (or its last stride is not 1)"
    nb, page = kv_cache.shape[0], kv_cache.shape[1]
    if page > 2**20:
        return f"pages of {page} tokens (the CUDA kernel takes at most 2**20)"
    if kv_cache.data_ptr() % 16 or (nb > 1 and kv_cache.stride(0) % 16):
        return (f"kv_cache at byte offset {kv_cache.data_ptr() % 16} mod 16 with page stride {kv_cache.stride(0)}: "
                "the CUDA kernel needs both multiples of 16 (16-byte loads)")
    if attn_sink is not None and h > 1 and attn_sink.stride(0) != 1:
        return "attn_sink is not contiguous"
    return None


def unsupported_arch(cap: tuple[int, int], forced: Optional[str]) -> Optional[str]:
    """Why the kernels do not serve compute capability `cap` (None when they do), `forced` the forced backend."""
    return sm90_or_forced_sm100(cap, forced, "CUDA sparse MLA decode")


def supports(q, kv_cache, indices, softmax_scale, layout="v32", topk_lens=None, attn_sink=None) -> Optional[str]:
    from dsa_ops import registry

    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    return (unsupported_arch(capability(index), registry.forced_backend())
            or unsupported_shape(q, kv_cache, indices, layout, attn_sink))


def take_route(registry, ns, available) -> int:
    """After the library's load: the C++ CUDA-key kernel of the op (csrc/sparse_mla_decode_route.cpp) serves the
    devices this provider would, whenever the registry would pick it (route_following_registry); the mask now."""
    return route_following_registry(registry, available, OP, _registered.get(OP), unsupported_arch,
                                    ns.sparse_mla_decode_route_set.default)


_registered: dict = {}  # OP -> the provider register() added: what the C++ kernel stands in for


def register() -> None:
    from dsa_ops import registry

    from . import available

    _registered[OP] = registry.Provider(OP, "cuda", run, supports, available)
    registry.register_provider(_registered[OP])
