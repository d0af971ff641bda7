"""Runs the CUDA paged_indexer_logits kernel once per (H, next_n, mode) on small shapes and checks it
against the reference. The block table past each context is poisoned (-1, huge, INT32_MIN) and some
visible pages point outside the cache, so a stray lookup or read shows under the sanitizer:

    compute-sanitizer --tool memcheck --error-exitcode 9 python tools/sanitize_paged.py [H NEXT_N]

H and NEXT_N narrow the run to one head count and next_n (e.g. `64 2`: the loader-TMA configs among them).
"""

import os
import sys

import torch
from dsa_ops.backends.cuda import providers_paged_indexer as ppi
from dsa_ops.ops.paged_indexer_logits import reference

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from harness import score_error  # noqa: E402

FP8 = torch.float8_e4m3fn
g = torch.Generator(device="cuda").manual_seed(0)
failed = []
only = tuple(int(x) for x in sys.argv[1:3])
for h in (64, 32):
    for next_n in (1, 2, 3):
        if only and (h, next_n) != only:
            continue
        for precise in (True, False):
            b, d, nb, mb, L = 5, 128, 30, 12, 700
            ctx = torch.tensor([700, 1, 0, 129, 64], dtype=torch.int32, device="cuda")
            q = (torch.randn(b, next_n, h, d, device="cuda", generator=g) * 2).to(FP8)
            vals = (torch.randn(nb, 64 * d, device="cuda", generator=g) * 2).to(FP8).view(torch.uint8)
            sc = (torch.rand(nb, 64, device="cuda", generator=g) + 0.25).view(torch.uint8)
            cache = torch.cat([vals, sc], 1).reshape(nb, 64, 1, d + 4)
            w = torch.randn(b * next_n, h, device="cuda", generator=g)
            table = torch.randint(0, nb, (b, mb), device="cuda", generator=g, dtype=torch.int32)
            for r in range(b):
                pages = -(-int(ctx[r]) // 64)
                table[r, pages:] = torch.tensor([-1, 2**31 - 1, -(2**31)], device="cuda").repeat(mb)[: mb - pages]
            table[0, 3] = nb  # a visible page outside the cache: -inf, never read
            ref = reference(q, cache, w, ctx, table, L, True)
            for config in ppi.variants(next_n, h, precise):  # every schedule x loader x warpgroups offered
                out = torch.full((b * next_n, L), 12345.0, device="cuda")
                ppi.run(q, cache, w, ctx, table, L, True, precise, config=config, out=out)
                score_error(f"H{h} next_n {next_n} precise={precise} config {config}", out, ref, not precise, failed)
torch.cuda.synchronize()
print("FAILED:" if failed else "all ok", *failed)
sys.exit(1 if failed else 0)
