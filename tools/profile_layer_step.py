"""Where the DSA decode layer step's time goes: our step (benchmarks/bench_layer_step.py's inputs) captured whole
and each op captured alone, replayed under torch.profiler; prints every kernel of one replay with its start (from
the replay's first kernel), duration and the gap before it, and the graph replay times (harness.Timer: CUDA events,
median, an L2 flush before each).

    python3 tools/profile_layer_step.py [BATCH S_Q]      # default 64 2
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_layer_step as bls  # noqa: E402
from harness import Timer, capture_graph  # noqa: E402


def kernels_of_replays(timer: Timer, graph, replays: int = 3) -> list:
    """[(name, start us, duration us)] of the last replay's kernels (torch's own, the L2 flush, left out), in start
    order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            timer.flush_l2()
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
    events = [e for e in prof.events()
              if e.device_type == torch.autograd.DeviceType.CUDA and "at::native" not in e.name]
    events.sort(key=lambda e: e.time_range.start)
    per = len(events) // replays
    last = events[-per:] if per else []
    t0 = last[0].time_range.start if last else 0
    return [(e.name, e.time_range.start - t0, e.time_range.end - e.time_range.start) for e in last]


def show(label: str, ks: list) -> None:
    print(f"\n{label}: {len(ks)} kernels")
    end = 0.0
    for name, start, dur in ks:
        print(f"  {start:9.1f} +{dur:8.1f} us  gap {start - end:6.1f}  {name[:110]}")
        end = max(end, start + dur)
    if ks:
        print(f"  span {end:.1f} us, kernel time {sum(d for _, _, d in ks):.1f} us")


def main(batch: int = 64, s_q: int = 2) -> None:
    from dsa_ops import demo

    x = bls._layer(batch, s_q)
    calls = []

    def rec(name, a, kw):
        calls.append((name, a, kw))
        return getattr(torch.ops.dsa, name)(*a, **kw)

    demo.layer_step(x, rec)
    fns = {"whole": lambda: demo.layer_step(x)}
    for name, a, kw in calls:
        op = getattr(torch.ops.dsa, name)
        fns[name] = lambda f=op, a=a, kw=kw: f(*a, **kw)
    graphs = {name: capture_graph(fn) for name, fn in fns.items()}
    timer = Timer()
    for name, g in graphs.items():
        print(f"{name}: graph replay median {timer.median_us(g.replay, iters=20):.1f} us")
    for name, g in graphs.items():
        show(f"{name} (batch {batch}, s_q {s_q})", kernels_of_replays(timer, g))


if __name__ == "__main__":
    main(*(int(v) for v in sys.argv[1:3]))
