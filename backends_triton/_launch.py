"""First-launch log shared by the Triton kernels: a JIT compile (or a disk-cache load) inside a serving step
or a CUDA-graph capture is a stall users must be able to see, so the first launch of each specialisation in
the process is timed and logged (logger `dsa_ops`)."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("dsa_ops")


class FirstLaunchLog:
    """`run` launches a kernel; the first launch of each `key` is timed and logged. `seen` holds the keys
    launched so far (a warm-up reports the ones it added)."""

    def __init__(self, op: str):
        self.op = op
        self.seen: set = set()

    def run(self, kernel, grid, key, args, kwargs) -> None:
        if key in self.seen:
            kernel[grid](*args, **kwargs)
            return
        t = time.perf_counter()
        kernel[grid](*args, **kwargs)
        self.seen.add(key)
        log.info("dsa_ops triton %s: first launch of %s took %.1f ms (JIT compile or cache load)",
                 self.op, key, (time.perf_counter() - t) * 1e3)
