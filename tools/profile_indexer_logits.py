"""Launch dense indexer_logits a few times, ours (CUDA or Triton) or DeepGEMM's, for `ncu`.

Inputs as benchmarks/bench_indexer_logits.py builds them (4096 rows, H 64, D 128, full windows). E.g.

    ncu --clock-control none -k regex:"indexer|mqa_logits" --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
        python3 tools/profile_indexer_logits.py cuda 32768

`cuda-tma` and `cuda-tma3` run the CUDA kernel's TMA variant with 4 and 3 math warpgroups
(providers_indexer.TMA, TMA3); `cuda` runs config 0, the launcher's choice (TMA); `cuda-precise` the exact mode
(precise=True, config 0: the launcher's choice, TMA_F16). `cuda:N` / `cuda-precise:N` force config N
(IndexerLogitsParams::config), e.g. a variant beside config 4 under ncu.
`deepgemm` needs .peer/deep_gemm (unpacked from .peer/deep_gemm.tar.xz).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_indexer_logits as b  # noqa: E402


def main(which: str, keys: int, heads: int = 64) -> None:
    q, kv, s, w, ks, ke = b._inputs(4096, keys, heads, b.FP8, "full")
    base, _, forced = which.partition(":")  # cuda-precise:7 -> cuda-precise, config 7
    if which == "deepgemm":
        dg, why = b.deep_gemm()
        if dg is None:
            raise SystemExit(why)
        fn = lambda: dg.fp8_fp4_mqa_logits(q, None, kv, s, w, ks, ke, keys, None)  # noqa: E731
    elif base in ("cuda", "cuda-tma", "cuda-tma3", "cuda-precise"):
        from dsa_ops.backends.cuda import providers_indexer as pi

        named = {"cuda": 0, "cuda-tma": pi.TMA, "cuda-tma3": pi.TMA3, "cuda-precise": 0}
        config = int(forced) if forced else named[base]
        precise = base == "cuda-precise"
        fn = lambda: pi.run(q, kv, s, w, ks, ke, True, precise, config=config)  # noqa: E731
    else:
        from dsa_ops.backends.triton import indexer_logits as il

        fn = lambda: il.launch(q, kv, s, w, ks, ke, True, False)  # noqa: E731
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
    print(f"{which} 4096 x {keys} H {heads}: done")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 64)
