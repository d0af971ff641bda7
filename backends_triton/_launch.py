"""First-launch log shared by the Triton kernels: a JIT compile (or a disk-cache load) inside a serving step
or a CUDA-graph capture is a stall users must be able to see, so the first launch of each specialisation in
the process is timed and logged (logger `dsa_ops`)."""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch
import triton

log = logging.getLogger("dsa_ops")


def cdiv(a, b):
    """ceil(a / b) for the launchers' grid and split arithmetic. Triton 3.6's `triton.cdiv` and
    `triton.next_power_of_2` are constexpr functions: 3.8 us a host call on the dev CPU (six of them were 23 of
    the 55 us of Python in a sparse_attention launch), against nanoseconds for the integer expression."""
    return (a + b - 1) // b


def next_pow2(n):
    """The least power of two >= n, for n >= 1 (see cdiv); symbolic sizes go to Triton's own form."""
    return 1 << (n - 1).bit_length() if type(n) is int else triton.next_power_of_2(n)


def unit_last_stride(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """x with a unit last stride: the kernels take row strides but index the last dimension (and 1-D
    metadata such as row_to_batch, slots or topk_lens) by position. A copy only where the op accepted a
    strided or expanded view."""
    if x is None or x.dim() == 0 or x.shape[-1] <= 1 or x.stride(-1) == 1:
        return x
    return x.contiguous()


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
