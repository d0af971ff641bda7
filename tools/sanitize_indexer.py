"""Runs the CUDA indexer_logits kernel once per mode on small shapes (and its other kernels: configs 1 and 2 with
fp8 MMAs, config 3 in the exact mode), then
the Triton one (kv widened in the loop and once before the kernel, with negative scales; bf16), and checks
each against the reference.

Plain: a quick smoke test that prints each mode's error (max |out - ref| / row norm). Under
compute-sanitizer (memcheck, racecheck) it is the small shape the sanitizer walks:

    compute-sanitizer --tool memcheck --error-exitcode 9 python tools/sanitize_indexer.py [tail]

With `tail`, only the TMA kernels' split tail (a few thousand rows: racecheck takes minutes over all of it).
"""

import os
import sys

import torch
from dsa_ops.backends.cuda import providers_indexer as pi
from dsa_ops.backends.triton import indexer_logits as il
from dsa_ops.ops.indexer_logits import reference

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from harness import score_error  # noqa: E402

FP8 = torch.float8_e4m3fn
g = torch.Generator(device="cuda").manual_seed(0)
failed = []


def inputs(h, dtype, signed_scales=False, t=37):
    n, d = 1000, 128  # t and n neither a multiple of the row block nor of the key tile
    q = (torch.randn(t, h, d, device="cuda", generator=g) * 2).to(dtype)
    kv = (torch.randn(n, d, device="cuda", generator=g) * 2).to(dtype)
    s = (torch.rand(n, device="cuda", generator=g) + 0.25) if dtype == FP8 else None
    if s is not None and signed_scales:  # both signs and zeros
        s = s * (torch.arange(n, device="cuda") % 3 - 1)
    w = torch.randn(t, h, device="cuda", generator=g)
    ks = torch.randint(-100, n, (t,), device="cuda", generator=g, dtype=torch.int32)
    ke = ks + torch.randint(-10, n, (t,), device="cuda", generator=g, dtype=torch.int32)
    return q, kv, s, w, ks, ke


tail_only = sys.argv[1:] == ["tail"]
if not tail_only:
    for h in (64, 32):
        for dtype, precise in ((FP8, True), (FP8, False), (torch.bfloat16, True)):
            args = inputs(h, dtype)
            q, kv, _, _, ks, ke = args
            ks[0], ke[0] = 0, kv.shape[0]
            ks[1], ke[1] = 5, 5
            out = torch.full((q.shape[0], kv.shape[0]), 12345.0, device="cuda")
            pi.run(*args, True, precise, out=out)
            score_error(f"cuda H{h} {str(dtype).split('.')[-1]} precise={precise}", out, reference(*args, True),
                        dtype == FP8 and not precise, failed)
    # The non-default kernels of each fp8 mode, signed scales: TMA / TMA3 (fp8 MMAs), CP_ASYNC (exact mode; the default
    # there is TMA_F16).
    for h, config, precise in ((64, pi.TMA, False), (32, pi.TMA, False), (64, pi.TMA3, False), (32, pi.TMA3, False),
                               (64, pi.CP_ASYNC, True), (32, pi.CP_ASYNC, True)):
        args = inputs(h, FP8, signed_scales=True)
        out = torch.full((args[0].shape[0], args[1].shape[0]), 12345.0, device="cuda")
        pi.run(*args, True, precise, config=config, out=out)
        score_error(f"cuda H{h} float8_e4m3fn precise={precise} config={config}", out, reference(*args, True),
                    not precise, failed)
# The TMA kernels' split tail (TailSplitCursor): 8.5 rounds of one-chunk items on this GPU, every TMA config.
sms = torch.cuda.get_device_properties(0).multi_processor_count
for h, config, precise in ((64, pi.TMA, False), (32, pi.TMA3, False), (64, pi.TMA_F16, True)):
    args = inputs(h, FP8, t=(128 // h) * (8 * sms + sms // 2))
    args[4].clamp_(max=744)  # windows of 256 keys or more: short ones cancel in fp8 sums past this check's bound
    args[5].copy_(torch.maximum(args[5], args[4] + 256))
    out = torch.full((args[0].shape[0], args[1].shape[0]), 12345.0, device="cuda")
    pi.run(*args, True, precise, config=config, out=out)
    score_error(f"cuda H{h} split tail precise={precise} config={config}", out, reference(*args, True),
                not precise, failed)
if not tail_only:
    for h in (64, 32):
        for dtype, widen_from in ((FP8, 1 << 62), (FP8, 0), (torch.bfloat16, 0)):
            args = inputs(h, dtype, signed_scales=True)
            out = torch.full((args[0].shape[0], args[1].shape[0]), 12345.0, device="cuda")
            il.WIDEN_MIN_HEAD_ROWS = widen_from
            il.launch(*args, True, True, out=out)
            # (bf16: no widening)
            label = "" if dtype != FP8 else " widened once" if widen_from == 0 else " in the loop"
            score_error(f"triton H{h} {str(dtype).split('.')[-1]}{label}", out, reference(*args, True), False, failed)
torch.cuda.synchronize()
print("FAILED:" if failed else "all ok", *failed)
sys.exit(1 if failed else 0)
