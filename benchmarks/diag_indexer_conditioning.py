"""For the rows where the CUDA indexer misses 1e-5 x row norm: how ill-conditioned they are.

Prints, per failing row of the T70000-N300-H32 hostile GPU test case, the window length, the score, and
the condition sum_h |w[t,h]| * |relu(dot * s)| (the size of the terms that cancel), for the CUDA kernel
(2 warpgroups) and the Triton kernel on the same inputs.
"""

import sys

import torch

sys.path.insert(0, "tests")
from dsa_ops.backends.cuda import providers_indexer as pi  # noqa: E402
from dsa_ops.backends.triton import indexer_logits as il  # noqa: E402
from dsa_ops.ops.indexer_logits import reference  # noqa: E402
from test_gpu_indexer_logits import FP8, _dense  # noqa: E402

for seed in (0, 1, 2):
    args = _dense(70000, 300, 32, FP8, "hostile", seed=seed)
    q, kv, s, w, ks, ke = args
    ref = reference(*args, True)
    vis = torch.isfinite(ref)
    norm = torch.where(vis, ref, 0).double().norm(dim=1)
    dots = torch.einsum("thd,nd->thn", q.float().double(), kv.float().double()).float() * s
    cond = torch.einsum("th,thn->tn", w.double().abs(), dots.clamp_min(0).double())
    for name, out in (("cuda", pi.run(*args, True)), ("triton", il.launch(*args, True))):
        err = torch.where(vis, (out.double() - ref.double()).abs(), 0)
        ratio = err.amax(1) / (1e-5 * norm).clamp_min(1e-300)
        bad = (ratio > 1).nonzero().flatten().tolist()
        print(f"seed {seed} {name}: {len(bad)} rows over 1e-5 x row norm, worst ratio {ratio.max():.2f}")
        for r in bad[:5]:
            n_vis = int(vis[r].sum())
            c = cond[r][vis[r]].max().item()
            e_rel_cond = (err[r].max() / cond[r][vis[r]].max()).item()
            print(f"   row {r}: {n_vis} visible keys, row norm {norm[r]:.3g}, max err {err[r].max():.3g}, "
                  f"terms up to sum|w relu| = {c:.3g} (err / that = {e_rel_cond:.2g})")
