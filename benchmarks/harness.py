"""GPU timing for the benchmarks: CUDA events, warm-up, median, cold L2, ceilings measured in-run.

Every figure a benchmark records carries the ratios DESIGN.md asks for: to plain torch, to the memory
floor (bytes over the device-copy bandwidth measured in the same run) and to peers where installed.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Callable

import torch

_L2_FLUSH_BYTES = 256 << 20  # several times the H200's 60 MB L2


class Timer:
    def __init__(self, device="cuda"):
        self.device = torch.device(device)
        # Flushed by reading, not writing: a write flush leaves ~60 MB of dirty lines whose write-back
        # would be charged to the timed kernel (measured: +14 us on a 86 us kernel).
        self._flush = torch.ones(_L2_FLUSH_BYTES // 4, dtype=torch.float32, device=self.device)
        self._flush_sink = torch.empty((), dtype=torch.float32, device=self.device)

    def flush_l2(self) -> None:
        """Evict L2 (enqueued on the current stream) by reading a buffer larger than it."""
        torch.amax(self._flush, dim=0, out=self._flush_sink)

    def median_us(self, fn: Callable, *, warmup: int = 5, iters: int = 30, cold_l2: bool = True) -> float:
        """Median device time of fn() over `iters` runs, each after an L2 flush (not timed)."""
        for _ in range(warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for s, e in zip(starts, ends):
            if cold_l2:
                self.flush_l2()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))

    def graph_median_us(self, fn: Callable, *, iters: int = 50, replays_per_sample: int = 20) -> float:
        """Median time of fn() by CUDA-graph replay: launch and Python costs do not hide the kernel."""
        return self.graph_medians_us([fn], iters=iters, replays_per_sample=replays_per_sample)[0]

    def graph_medians_us(self, fns: list, *, iters: int = 50, replays_per_sample: int = 20) -> list:
        """graph_median_us of each of fns, their samples interleaved (f0, f1, ..., f0, f1, ...): the clock
        and the host drift alike for all, so their ratios are the fairest a run gives."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for fn in fns:
                for _ in range(3):
                    fn()
        torch.cuda.current_stream().wait_stream(s)
        graphs = []
        for fn in fns:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(replays_per_sample):
                    fn()
            g.replay()
            graphs.append(g)
        torch.cuda.synchronize()

        def sample(g):
            def one() -> float:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                g.replay()
                b.record()
                b.synchronize()
                return a.elapsed_time(b) * 1e3 / replays_per_sample
            return one

        return interleaved_medians([sample(g) for g in graphs], iters)


def capture_graph(fn: Callable) -> "torch.cuda.CUDAGraph":
    """fn captured in a CUDA graph, after a warm-up call on a side stream (compiles and allocator pools stay
    out of the capture); time its `replay` with Timer.median_us, which flushes L2 before each call. The graph
    keeps `fn` alive: its kernels read the tensors `fn` holds by address (a dropped partial's tensors, freed and
    reused by the L2 flush, made FlashMLA's replays read garbage metadata and fault)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    g.captured_fn = fn
    return g


def interleaved_samples(samplers: list, iters: int) -> list:
    """`iters` calls of each sampler, called in turn (s0, s1, ..., s0, s1, ...): each sampler's values."""
    samples = [[] for _ in samplers]
    for _ in range(iters):
        for got, sampler in zip(samples, samplers):
            got.append(sampler())
    return samples


def interleaved_medians(samplers: list, iters: int) -> list:
    """Median of `iters` calls of each sampler, called in turn (s0, s1, ..., s0, s1, ...)."""
    return [statistics.median(got) for got in interleaved_samples(samplers, iters)]


def interleaved_times_us(timer: Timer, fns: dict, *, rounds: int, iters: int, warmup: int = 5) -> dict:
    """Each of fns' device time (us), keyed as fns: the median over `rounds` rounds, each round timing every fn in
    turn with timer.median_us (`warmup` calls, then the median of `iters`, each after an L2 flush). How a kernel
    and its peer are compared: clock drift during the run falls on all of them alike."""
    samplers = [functools.partial(timer.median_us, fn, warmup=warmup, iters=iters) for fn in fns.values()]
    return dict(zip(fns, interleaved_medians(samplers, rounds)))


def host_overhead_us(fn: Callable, calls: int = 2000, batches: int = 1) -> tuple[float, float]:
    """Per-call host time of fn(): (median, min) over batches, as host_overheads_us."""
    return host_overheads_us([fn], calls=calls, batches=batches)[0]


def host_batch_us(fn: Callable, calls: int) -> float:
    """Host time a call of `calls` back-to-back calls of fn() (us; no sync inside), synchronised after."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def host_overheads_us(fns: list, calls: int = 2000, batches: int = 1, warmup_s: float = 0.05) -> list:
    """Per-call host time of each of fns: wall time of back-to-back calls, no sync inside, in `batches`
    batches of calls / batches each (synchronised between batches), the fns' batches taken in turn so
    that a change of the host's pace meets all alike. Before them, `warmup_s` of the same batches: the
    first decode shape of a bench run, measured right after the many-row shapes, read 12.5 us a call
    where the next two read 9.0 (torch.add beside them 8.8 against 7.0: the host's own pace moved).
    Returns (median, min) for each fn over its batches' per-call means: the median is the figure, the
    min shows what a quiet host gives."""
    n = max(1, calls // batches)
    samplers = [lambda fn=fn: host_batch_us(fn, n) for fn in fns]
    end = time.perf_counter() + warmup_s
    while True:
        interleaved_samples(samplers, 1)
        if time.perf_counter() >= end:
            break
    return [(statistics.median(got), min(got)) for got in interleaved_samples(samplers, batches)]


def score_error(name: str, out: torch.Tensor, ref: torch.Tensor, fp8_mma: bool, failed: list) -> None:
    """Print an indexer run's worst error per row norm (scores inside the windows) against the tolerance
    of its mode, and whether -inf outside the windows is exact; append `name` to `failed` if either fails."""
    vis = torch.isfinite(ref)
    norm = torch.where(vis, ref, 0).double().norm(dim=1).clamp_min(1e-30)
    err = (torch.where(vis, (out.double() - ref.double()).abs(), 0).amax(dim=1) / norm).max().item()
    inf_ok = bool(torch.equal(out[~vis], ref[~vis]))
    tol = 2e-3 if fp8_mma else 1e-5
    ok = inf_ok and err <= tol
    print(f"{name}: max err / row norm {err:.3g} (tol {tol}), -inf outside windows exact: {inf_ok}",
          "ok" if ok else "FAIL")
    if not ok:
        failed.append(name)


def row_max_rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest over rows of max |out - ref| / max |ref| over the row's finite positions (inf when the -inf
    patterns differ): how far one indexer config's scores are from another's, in the default mode's terms."""
    fin = torch.isfinite(ref)
    if not torch.equal(fin, torch.isfinite(out)):
        return float("inf")
    diff = torch.where(fin, (out - ref).abs(), 0).amax(1)
    scale = torch.where(fin, ref.abs(), 0).amax(1).clamp_min(1e-30)
    return float((diff / scale).max())


def copy_bandwidth_gbps(timer: Timer, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=timer.device).random_(0, 255)
    dst = torch.empty_like(src)
    us = timer.median_us(lambda: dst.copy_(src), iters=20)
    return 2 * src.numel() / (us * 1e-6) / 1e9


def matmul_tflops(timer: Timer, dtype: torch.dtype, n: int = 8192) -> float:
    """Dense matmul throughput on random data: bf16 via torch.matmul, fp8 via torch._scaled_mm."""
    a = torch.randn(n, n, device=timer.device)
    b = torch.randn(n, n, device=timer.device)
    if dtype == torch.float8_e4m3fn:
        a8, b8 = a.to(dtype), b.to(dtype).t().contiguous().t()
        one = torch.ones((), device=timer.device)
        fn = lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
    else:
        a, b = a.to(dtype), b.to(dtype)
        fn = lambda: a @ b  # noqa: E731
    us = timer.median_us(fn, iters=10, cold_l2=False)
    return 2 * n**3 / (us * 1e-6) / 1e12


def record(op, provider, case, median_us, *, floor_us=None, floor_kind=None, baselines=None, **extra):
    """One result row in the DESIGN.md format."""
    row = {"op": op, "provider": provider, "case": case, "median_us": round(median_us, 3),
           "floor_us": None if floor_us is None else round(floor_us, 3), "floor_kind": floor_kind,
           "baselines": {k: round(v, 3) for k, v in (baselines or {}).items()}}
    row.update(extra)
    return row
