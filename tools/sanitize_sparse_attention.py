"""The CUDA sparse_attention kernel (fp8 caches) on small hostile shapes (NaN-filled unused pages, invalid
indices, padding rows, top-k off the step), single pass, split and split-tail paths, each result checked against the
reference: the script compute-sanitizer (memcheck, racecheck) walks for this kernel.

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
# The last case has more (row, KV head) items than the H200's 528 CTA slots: CTAs take several units.
for rows, hq, hkv, page, topk in ((7, 24, 2, 64, 300), (5, 16, 1, 16, 77), (3, 8, 8, 48, 40), (280, 24, 2, 64, 400)):
    case = cases.make_case(rows, hq, hkv, 128, 128, page=page, num_blocks=40, num_reqs=3, max_pages=8, topk=topk,
                           dtype=cases.FP8, seed=rows, device="cuda")
    ref = reference(*case, *scales)
    for splits, whole in ((1, 0), (3, 0), (3, rows * hkv // 2)):  # single pass, split, split tail
        out = torch.full_like(ref, float("nan"))
        cu.launch(*case, *scales, out, splits=splits, whole=whole)
        bad = cases.compare(out, ref)
        print(f"rows {rows} heads {hq}/{hkv} page {page} topk {topk} splits {splits} whole {whole}: {bad or 'ok'}")
        ok &= bad is None
torch.cuda.synchronize()
print("all ok" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
