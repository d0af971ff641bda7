"""Probe where the filter top-k kernel's time goes (H200): medians of CUDA-event timings over shapes
and k, next to a plain read of the same bytes. Dev tool: `python benchmarks/probe_topk.py`."""

import dsa_ops  # noqa: F401  (registers torch.ops.dsa)
import torch


def t(fn, it=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(it):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    for rows, n in ((264, 32768), (1056, 32768), (4096, 32768), (264, 131072), (4096, 8192), (4096, 4096)):
        x = torch.randn(rows, n, device="cuda")
        line = f"{rows}x{n}: read {t(lambda x=x: x.sum(dim=1)):.1f} us"
        for k in (1, 64, 512, 2048):
            line += f" | k={k} {t(lambda x=x, k=k: torch.ops.dsa.topk(x, k)):.1f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
