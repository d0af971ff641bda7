"""Dev tool (GPU): CUDA paged_indexer_logits configs timed in interleaved rounds beside DeepGEMM, on two kinds of
block tables: the benchmark's (every page distinct: memory-bound on an H100) and tables drawn from a pool of POOL
pages (L2-resident: the math bound, which the H200's faster memory exposes). fp8 mode, 64 requests x 65536
positions, the benchmark's inputs (benchmarks/bench_indexer_logits.py).

    NEXT_N=1 CONFIGS=223,225 python3 tools/ab_paged_indexer.py        # H 64 unless H=32; ROUNDS (5), POOL (2048)

Each config's scores are compared with the default config's first (bitwise, or the largest difference where both are
finite over the row's largest |score|, inf where the -inf patterns differ). Every round times each config and
DeepGEMM once in turn (a median of 20 calls each); the rounds' medians are printed with their range and the ratio to
DeepGEMM's on the same tables. The loaders' evict-first hint lowers their L2 hits on the pool, so there ours sit 7-9%
above the evict-normal math bound (benchmarks/results/h100_paged_evict_rings.log). DeepGEMM is left out when
.peer/deep_gemm is absent.
"""

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_indexer_logits as b  # noqa: E402
from dsa_ops.backends.cuda import providers_paged_indexer as ppi  # noqa: E402
from harness import Timer, row_max_rel_err  # noqa: E402

B, L = 64, 65536
NN = int(os.environ.get("NEXT_N", "1"))
H = int(os.environ.get("H", "64"))
POOL = int(os.environ.get("POOL", "2048"))
CONFIGS = [int(c) for c in os.environ.get("CONFIGS", "0").split(",")]

args = b._paged_inputs(B, NN, H, L)
q, cache, w, ctx, table = args
table_pool = b.pool_block_table(table, POOL)
dg, why = b.deep_gemm()
if dg is None:
    print(f"DeepGEMM left out: {why}")
else:
    ctx_dg, sms = b.deepgemm_paged_ctx(args)
out = torch.empty(B * NN, L, device="cuda")
fns = {}
for name, tb in (("distinct", table), (f"pool{POOL}", table_pool)):
    ref = ppi.run(q, cache, w, ctx, tb, L, True, False)
    for c in CONFIGS:
        f = lambda c=c, tb=tb: ppi.run(q, cache, w, ctx, tb, L, True, False, config=c, out=out)  # noqa: E731
        f()
        torch.cuda.synchronize()
        err = row_max_rel_err(out, ref)  # inf where the -inf patterns differ
        print(name, c, "bitwise default" if torch.equal(out, ref) else f"max err / row max vs default {err:.1e}")
        fns[f"{name} {c}"] = f
    if dg is not None:
        meta = dg.get_paged_mqa_logits_metadata(ctx_dg, 64, sms, None)
        fns[f"{name} dg"] = lambda tb=tb, meta=meta: dg.fp8_fp4_paged_mqa_logits(  # noqa: E731
            q, None, cache, w, ctx_dg, tb, meta, L, None)
for f in fns.values():
    f()
torch.cuda.synchronize()
timer = Timer()
got = {k: [] for k in fns}
for _ in range(int(os.environ.get("ROUNDS", "5"))):
    for k, f in fns.items():
        got[k].append(timer.median_us(f, warmup=2, iters=20))
for k, v in got.items():
    m = statistics.median(v)
    dg_key = k.split()[0] + " dg"
    ratio = f"  {m / statistics.median(got[dg_key]):.3f}x dg" if dg_key in got else ""
    print(f"H {H} next_n {NN} {k:18s} {m:7.1f} us [{min(v):.1f}-{max(v):.1f}]{ratio}")
