"""The native HIP top-k (issue 5) on the H200, through the compat header: a correctness-scale timing
beside the CUDA provider on the same shapes (fp32 normal scores, k = 2048). Decode shapes are timed
by CUDA-graph replay, the others by CUDA events with a cold L2 (as bench_topk.py).
"""

import dsa_ops
import pytest
import torch
from dsa_ops import registry
from harness import record
from topk_cases import graph_timed, make_scores

pytestmark = pytest.mark.gpu
SHAPES = [(4096, 32768), (64, 131072), (1, 131072)]
K = 2048


def _time(bench, rows, fn):
    return bench.timer.graph_median_us(fn) if graph_timed(rows) else bench.timer.median_us(fn)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{n}" for r, n in SHAPES])
def test_topk_hip(bench, shape):
    rows, keys = shape
    scores = make_scores(rows, keys, "float32", "normal")
    ref = torch.sort(dsa_ops.ops._common.window_topk(scores, K), dim=1).values
    with registry.use_backend("hip"):
        fn = lambda: torch.ops.dsa.topk(scores, K)  # noqa: E731
        exact = bool(torch.equal(torch.sort(fn(), dim=1).values, ref))
        us = _time(bench, rows, fn)
    baselines = {}
    try:
        with registry.use_backend("cuda"):
            baselines["cuda"] = _time(bench, rows, lambda: torch.ops.dsa.topk(scores, K))
    except registry.DispatchError:
        pass
    case = dict(rows=rows, keys=keys, k=K, dtype="float32", distribution="normal")
    nbytes = rows * keys * 4 + rows * K * 4
    bench.add(record("topk", "hip", case, us, floor_us=bench.floor_us(nbytes),
                     floor_kind="memory (read scores once + write indices)", baselines=baselines, exact=exact,
                     timing="cuda-graph replay" if graph_timed(rows) else "cuda events, cold L2"))
    assert exact
