"""Runs the CUDA paged_indexer_logits kernel a few times at the benchmark's decode size, for ncu:

    ncu -k regex:paged_indexer_logits_kernel --launch-skip 2 --launch-count 1 \\
        python tools/profile_paged.py CONFIG [NEXT_N]

CONFIG is providers_paged_indexer.make_config's int (0: the defaults; 224: 3 math warpgroups fed by a
producer warpgroup, balanced, bulk). 64 requests x 65536 positions, H 64, fp8 mode.
"""

import os
import sys

import torch
from dsa_ops.backends.cuda import providers_paged_indexer as ppi

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_indexer_logits import _paged_inputs  # noqa: E402

config = int(sys.argv[1])
next_n = int(sys.argv[2]) if len(sys.argv) > 2 else 2
b, h, L = 64, 64, 65536
args = _paged_inputs(b, next_n, h, L)
out = torch.empty(b * next_n, L, dtype=torch.float32, device="cuda")
for _ in range(4):
    ppi.run(*args, L, True, False, config=config, out=out)
torch.cuda.synchronize()
print(f"config {config} next_n {next_n}: ok")
