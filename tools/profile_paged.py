"""Runs the CUDA paged_indexer_logits kernel (or DeepGEMM's, from .peer/) a few times at the benchmark's decode
size, for ncu:

    ncu -k regex:paged_indexer_logits_kernel --launch-skip 2 --launch-count 1 \\
        python tools/profile_paged.py CONFIG [NEXT_N]
    ncu -k regex:paged_mqa_logits --launch-skip 3 --launch-count 1 python tools/profile_paged.py deepgemm [NEXT_N]

(skip 3: the regex may match DeepGEMM's metadata kernel too; either way a logits launch is profiled).

CONFIG is providers_paged_indexer.make_config's int (0: the defaults; 224: 3 math warpgroups fed by a
producer warpgroup, balanced, bulk); `deepgemm`: DeepGEMM's fp8_fp4_paged_mqa_logits on the same inputs (its
schedule metadata made once, before the launches). 64 requests x 65536 positions, H 64, fp8 mode.

POOL=N (environment): the block tables drawn from the first N pages (N = 2048: 17 MB, L2-resident), which takes
memory out of the way on an H100 and leaves the math bound that the H200's faster memory exposes (H100, next_n
2, the same tables timed beside DeepGEMM: 224 / the 4-warpgroup prototype of 6745a64 / DeepGEMM 161.4 / 143.2 /
131.1 us there, against 206.5 / 211.9 / 203.3 on distinct pages). The
bulk loader's evict-first hint lowers its L2 hits there (63.6% against 92.5% for the TMA loader), so compare
loaders on distinct pages.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_indexer_logits import _paged_inputs, deep_gemm, deepgemm_paged_ctx, pool_block_table  # noqa: E402

which = sys.argv[1]
next_n = int(sys.argv[2]) if len(sys.argv) > 2 else 2
b, h, L = 64, 64, 65536
args = _paged_inputs(b, next_n, h, L)
pool = int(os.environ.get("POOL", "0"))
if pool:
    args = (*args[:4], pool_block_table(args[4], pool))
if which == "deepgemm":
    dg, why = deep_gemm()
    if dg is None:
        raise SystemExit(f"deepgemm: {why}")
    q, cache, w, _, table = args
    ctx_dg, sms = deepgemm_paged_ctx(args)
    meta = dg.get_paged_mqa_logits_metadata(ctx_dg, 64, sms, None)
    for _ in range(4):
        dg.fp8_fp4_paged_mqa_logits(q, None, cache, w, ctx_dg, table, meta, L, None)
else:
    from dsa_ops.backends.cuda import providers_paged_indexer as ppi

    out = torch.empty(b * next_n, L, dtype=torch.float32, device="cuda")
    for _ in range(4):
        ppi.run(*args, L, True, False, config=int(which), out=out)
torch.cuda.synchronize()
print(f"{which} next_n {next_n}: ok")
