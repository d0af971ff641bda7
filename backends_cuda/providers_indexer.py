"""CUDA C++ provider of dsa.indexer_logits (kernels: include/dsa_cuda/sm90_indexer_logits_tma.cuh and
sm90_indexer_logits.cuh on Hopper, run on the H200; sm100_indexer_logits.cuh on the SM100 family, fp8
with precise=False only, compiled, not run).

On compute capability 10.x the tcgen05 kernel has never run on a GPU, so `supports` declines there unless
the cuda backend is forced (``dsa_ops.use_backend("cuda")`` or DSA_OPS_BACKEND=cuda).

Calls ``torch.ops.dsa_cuda.indexer_logits_out(q, kv, kv_scale, weights, ks, ke, clean, fp8_mma, config, out)``
with ``fp8_mma = not precise`` (the op's argument is the only switch the op uses). ``config`` picks the
kernel: 0 the launcher's choice (``resolve`` in kernels/indexer_logits.cu, the one place it is made), TMA
(1: TMA key tiles, wgmma with A from shared memory, 4 math warpgroups), TMA3 (2: the same with 3) or
CP_ASYNC (3: cp.async key tiles, A from registers, 2 math warpgroups). TMA and TMA3 take fp8 operands with
precise=False, kv rows that do not overlap and a contiguous, 16-byte aligned kv_scale (each stage's scales come
by TMA); TMA_F16 (4: TMA key tiles, 3 math warpgroups, A widened to fp16
in registers, scores bitwise CP_ASYNC's) takes fp8 operands with precise=True and kv rows that do not overlap.
The default runs TMA, TMA_F16 where they take the call, CP_ASYNC elsewhere.

fp8 operands: precise=False (the op's default) feeds e4m3 to the fp8 tensor cores: twice the fp16
rate, but Hopper keeps only ~14 mantissa bits while accumulating their products (the op's 1e-3 of the
row's largest |score|). precise=True widens e4m3 to fp16 in registers (exact) for fp16 MMAs with fp32
accumulation (1e-5 of the row norm). H100, 4096 x 32768, 64 heads, interleaved runs: 1900-1941 us fp8 (TMA;
DeepGEMM 2134-2193), 3238 us exact (TMA_F16). bf16 operands run bf16 MMAs in both modes.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import aligned16, capability, sm90_or_forced_sm100

OP = "indexer_logits"
_KERNEL = "indexer_logits_out"
_fn = None  # the loaded OpOverload, resolved on the first call
_TILE = 128  # keys of a pipeline stage
# IndexerLogitsParams::config: TMA key tiles with 4 / 3 math warpgroups, cp.async, TMA in the exact mode.
TMA, TMA3, CP_ASYNC, TMA_F16 = 1, 2, 3, 4


def run(q, kv, kv_scale, weights, ks, ke, clean, precise, *, config: int = 0, out=None):
    """The op's arguments in schema order (validated by the op), into `out` when given (else a new
    float32 [T, N] tensor); `config` 0 (the launcher's choice), TMA, TMA3, CP_ASYNC or TMA_F16 (tests and
    sweeps; the launcher refuses TMA, TMA3 and TMA_F16, by name, where they do not take the call)."""
    global _fn
    fn = _fn
    if fn is None:
        from . import op

        fn = _fn = op(_KERNEL, q.device)
    if out is None:
        out = torch.empty((q.shape[0], kv.shape[0]), dtype=torch.float32, device=q.device)
    fn(q, kv, kv_scale, weights, ks, ke, bool(clean), not precise, int(config), out)
    return out


def unsupported_arch(cap: tuple[int, int], forced: Optional[str]) -> Optional[str]:
    """Why the kernels do not serve compute capability `cap` (None when they do), `forced` the forced backend."""
    return sm90_or_forced_sm100(cap, forced, "CUDA indexer")


def unsupported_on_sm100(q, kv, precise) -> Optional[str]:
    """What the SM100 kernel does not take (None when it takes the call): fp8 operands with fp8 MMAs,
    kv rows and q heads that do not overlap (tensor maps of 128-byte rows)."""
    if q.dtype != torch.float8_e4m3fn or precise:
        return "the SM100 indexer kernel takes fp8 operands with precise=False only"
    if kv.stride(0) < 128 or q.stride(1) < 128:
        return "the SM100 indexer kernel needs kv rows and q heads at least 128 bytes apart (tensor maps)"
    return None


def supports(q, kv, kv_scale, weights, ks, ke, clean, precise) -> Optional[str]:
    from dsa_ops import registry

    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    cap = capability(index)
    if (why := unsupported_arch(cap, registry.forced_backend())) is not None:
        return why
    if cap[0] == 10 and (why := unsupported_on_sm100(q, kv, precise)) is not None:
        return why
    t, h, d = q.shape
    if h not in (32, 64):
        return f"{h} heads (the CUDA kernel takes 32 or 64)"
    if d != 128:
        return f"head dim {d} (the CUDA kernel takes 128)"
    # The math threads' -inf fill strides up to 512 keys past the last one in int32 (smxx_indexer.cuh).
    if kv.shape[0] > 2**31 - 1 - 8 * _TILE:
        return "2^31 - 1024 keys or more"
    if t >= 2**31 - 1:
        return "2^31 - 1 rows or more"
    if not aligned16(q, (q.stride(0), q.stride(1))):
        return "q's data or row/head strides are not 16-byte aligned"
    if not aligned16(kv, (kv.stride(0),)):
        return "kv's data or row stride is not 16-byte aligned"
    return None


def register() -> None:
    from dsa_ops import registry

    from . import available

    registry.register_provider(registry.Provider(OP, "cuda", run, supports, available))
