"""Launch one sparse_mla_decode shape three times, our CUDA kernel (variant 0 or 3) or FlashMLA's, for `ncu`.

Inputs as benchmarks/bench_sparse_mla_decode.py builds them (requests of 65536 tokens on random pages, top-k
2048); FlashMLA from .peer/vllm (the benchmark's loader). E.g. the 128-CTA cell at the GPU's own clocks:

    ncu --clock-control none -k regex:'sparse_mla_decode_ws_kernel|splitkv' --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
        python3 tools/profile_sparse_mla_decode.py v3 v32 64 1 128

`v0` / `v3` force the kernel variant; `flashmla` runs sparse_decode_fwd with its metadata made once (its combine
kernel is a separate launch, which the regex above leaves out).
"""

from __future__ import annotations

import functools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_sparse_mla_decode as bm  # noqa: E402


def main(which: str, layout: str, heads: int, s_q: int, batch: int) -> None:
    cache = bm._pool(layout)
    q, idx = bm._inputs(batch, s_q, heads, layout=layout)
    scale = bm.D_QK[layout] ** -0.5
    if which == "flashmla":
        fm = bm._flashmla()
        if fm is None:
            raise SystemExit("FlashMLA not found in .peer/vllm")
        fn = bm.flashmla_decode(fm, q, cache, idx, scale)[1]
    elif which in ("v0", "v3"):
        from dsa_ops.backends.cuda import providers_sparse_mla_decode as pm

        fn = functools.partial(pm.launch, q, cache, idx, scale, layout, variant=int(which[1:]))
    else:
        raise SystemExit(f"unknown kernel {which!r}: v0, v3 or flashmla")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    print(f"{which} {layout} heads {heads} s_q {s_q} batch {batch}: done")


if __name__ == "__main__":
    if len(sys.argv) != 6:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]))
