"""The CUDA sparse_attention kernel's time against the number of query rows, around the persistent grid's wave
edges (528 units a wave on 132 SMs: 264 rows of 2 KV heads), on the GPU machine.

Inputs as benchmarks/bench_sparse_attention.py builds them (fp8 cache, 24 / 2 heads, top-k 2048 of 65536-token
requests); each row count is timed by CUDA-graph replay with a cold L2 (benchmarks/harness.py), one line:

    python3 tools/rows_sparse_attention.py [ROWS ...]
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_sparse_attention as b  # noqa: E402
from harness import Timer, capture_graph  # noqa: E402

ROWS = (132, 264, 265, 280, 300, 330, 360, 400, 450, 528, 529, 600, 792)


def main(rows_list) -> None:
    from dsa_ops.backends.cuda import providers_sparse_attention as cu

    timer = Timer()
    kc, vc = b._pool("fp8")
    got = []
    for rows in rows_list:
        q, idx, bt, t2r = b._inputs(rows)
        out = torch.empty((rows, b.HQ, b.D), dtype=torch.bfloat16, device="cuda")
        g = capture_graph(lambda: cu.launch(q, kc, vc, idx, bt, t2r, b.SCALE, 1.0, 1.0, out))  # noqa: B023
        got.append((rows, round(timer.median_us(g.replay, iters=30), 1)))
    print(f"{torch.cuda.get_device_name()}: rows -> us: {got}")


if __name__ == "__main__":
    main([int(r) for r in sys.argv[1:]] or ROWS)
