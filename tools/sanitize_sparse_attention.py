"""The CUDA sparse_attention kernel (fp8 caches) on small hostile shapes (NaN-filled unused pages, invalid
indices, padding rows, top-k off the step), single pass (CTAs of 4 and 16 warps), split and split-tail paths, each
result checked against the reference: the script compute-sanitizer (memcheck, racecheck) walks for this kernel.

    compute-sanitizer --tool memcheck --error-exitcode 9 python tools/sanitize_sparse_attention.py
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import sparse_attention_cases as cases  # noqa: E402
from dsa_ops.backends.cuda import providers_sparse_attention as cu  # noqa: E402
from dsa_ops.ops.sparse_attention import reference  # noqa: E402

scales = (128**-0.5, 0.7, 1.9)
ok = True
# (rows, hq, hkv, page, topk, max_pages). The 280-row case has more (row, KV head) items than the H200's 528 slots
# of 4-warp CTAs: CTAs take several units. The 140-row one runs 16-warp CTAs in two waves.
for rows, hq, hkv, page, topk, mp in ((7, 24, 2, 64, 300, 8), (5, 16, 1, 16, 77, 8), (3, 8, 8, 48, 40, 8),
                                      (280, 24, 2, 64, 400, 8), (140, 8, 1, 64, 1536, 32)):
    case = cases.make_case(rows, hq, hkv, 128, 128, page=page, num_blocks=40, num_reqs=3, max_pages=mp, topk=topk,
                           dtype=cases.FP8, seed=rows, device="cuda")
    ref = reference(*case, *scales)
    # single pass (4- and 16-warp CTAs), split, split tail
    for splits, whole, warps in ((1, 0, 4), (1, 0, 16), (3, 0, 4), (3, rows * hkv // 2, 4)):
        out = torch.full_like(ref, float("nan"))
        cu.launch(*case, *scales, out, splits=splits, whole=whole, warps=warps)
        bad = cases.compare(out, ref)
        print(f"rows {rows} heads {hq}/{hkv} page {page} topk {topk} splits {splits} whole {whole} warps {warps}: "
              f"{bad or 'ok'}")
        ok &= bad is None
torch.cuda.synchronize()
print("all ok" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
