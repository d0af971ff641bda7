"""Adversarial score rows for the top-k ops: the distributions of DESIGN.md's Tests, in one place.

Used by the GPU tests (tests/test_gpu_topk.py, tests/test_gpu_topk_hip.py) and the benchmarks
(benchmarks/topk_cases.py), so a table row and a test case of one name hold the same kind of data.
"""

from __future__ import annotations

from typing import Optional

import torch

# name: what the rows hold (and what it tests)
TOPK_DISTRIBUTIONS = {
    "normal": "standard normal",
    "equal": "one value everywhere (every key ties)",
    "zeros": "all 0.0",
    "mostly_zero": "relu(normal - 2.5): a 0.0 plateau with a few winners",
    "ties": "integers 0..7: heavy ties at the k-th value",
    "narrow": "uniform [1.0, 1.245): one exponent, few mantissa bits apart",
    "big": "normal * 1e6: beyond the fp16 range",
    "nan_inf": "normal with 10% NaN, 3% +inf, 7% -inf, 5% -NaN and 5% -0.0",
    "signed_zero": "mostly +0.0 and -0.0 (equal under the ranking), a few values either side",
    "walk": "random walks (cumulative sums): smooth rows, the top k in a few stretches",
}


def topk_scores(distribution: str, rows: int, width: int, dtype: torch.dtype = torch.float32,
                generator: Optional[torch.Generator] = None, device="cuda") -> torch.Tensor:
    """[rows, width] scores of `distribution` (a key of TOPK_DISTRIBUTIONS), drawn with `generator`
    (which must live on `device`), generated in fp32 and cast to `dtype`."""
    shape = (rows, width)

    def normal():
        return torch.randn(shape, device=device, generator=generator)

    def uniform():
        return torch.rand(shape, device=device, generator=generator)

    if distribution == "normal":
        x = normal()
    elif distribution == "equal":
        x = torch.full(shape, 0.6875, device=device)
    elif distribution == "zeros":
        x = torch.zeros(shape, device=device)
    elif distribution == "mostly_zero":
        x = torch.relu(normal() - 2.5)
    elif distribution == "ties":
        x = torch.randint(0, 8, shape, device=device, generator=generator).float()
    elif distribution == "narrow":
        x = 1.0 + 0.245 * uniform()
    elif distribution == "big":
        x = normal() * 1e6
    elif distribution == "nan_inf":
        x, u = normal(), uniform()
        x = torch.where(u < 0.1, torch.full_like(x, float("nan")), x)
        x = torch.where((u >= 0.1) & (u < 0.13), torch.full_like(x, float("inf")), x)
        x = torch.where((u >= 0.13) & (u < 0.2), torch.full_like(x, -float("inf")), x)
        x = torch.where((u >= 0.2) & (u < 0.25), -torch.full_like(x, float("nan")), x)
        x = torch.where((u >= 0.25) & (u < 0.3), torch.full_like(x, -0.0), x)
    elif distribution == "signed_zero":
        u = uniform()
        x = torch.where(u < 0.5, torch.full_like(u, -0.0), torch.zeros_like(u))
        x = torch.where(u > 0.995, u, x)
        x = torch.where(u < 0.003, -u, x)
    elif distribution == "walk":
        x = normal().cumsum(dim=1)
    else:
        raise ValueError(f"unknown distribution {distribution!r}; known: {', '.join(TOPK_DISTRIBUTIONS)}")
    return x.to(dtype)


# Keys per sampled run of the CUDA filter kernel (kSampleRun in backends_cuda/kernels/topk_filter.cu).
FILTER_SAMPLE_RUN = 16


def filter_sample_positions(n: int, samples: int, run: int = FILTER_SAMPLE_RUN) -> torch.Tensor:
    """Offsets in a window of n keys that the CUDA filter kernel samples for its threshold: `samples`
    keys in samples / run evenly spaced runs of `run` consecutive keys, run r at r * ((n - run) //
    runs) (the kernel's shift by log2(runs)). For rows built to mislead the sampled threshold."""
    runs = samples // run
    assert runs > 0 and runs & (runs - 1) == 0 and samples % run == 0, (samples, run)
    i = torch.arange(samples)
    return (i // run) * ((n - run) // runs) + i % run


def filter_retry_rows(width: int = 70000, samples: int = 2048, seed: int = 11) -> torch.Tensor:
    """Two float32 rows (CPU) on which the CUDA filter kernel's first sampled threshold misses, because
    its sampled runs (filter_sample_positions) overstate the top of the row. Row 0: 100 samples are
    high (3.x) and the rest of the row low ([0, 0.9)) but for 2500 unsampled keys near 1.0, so the first
    aim leaves about 100 candidates, fewer than k (1500 or 2048), and the wider second attempt reaches
    the low samples and takes the keys near 1.0 too. Row 1: every sampled key is high, so both attempts
    miss and the exact fallback finishes the row. (tests/test_topk_filter_model.py checks this on the
    kernel's model; the GPU tests and tools/sanitize_small.py run the kernel on them.)"""
    at = filter_sample_positions(width, samples)
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(2, width, generator=g) * 0.9
    sampled = torch.zeros(width, dtype=torch.bool)
    sampled[at] = True
    free = (~sampled).nonzero().flatten()
    near_one = free[torch.randperm(len(free), generator=g)[:2500]]
    x[0, near_one] = 1.0 + 0.01 * torch.rand(2500, generator=g)
    x[0, at[torch.randperm(samples, generator=g)[:100]]] = 3.0 + torch.rand(100, generator=g)
    x[1, at] = 3.0 + torch.rand(samples, generator=g)
    return x
