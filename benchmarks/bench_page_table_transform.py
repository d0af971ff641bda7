"""page_table_transform: every provider against plain torch and the memory floor (2 * R * k * 4 bytes)."""

import dsa_ops
import pytest
import torch
from dsa_ops import registry
from harness import host_overhead_us, record

pytestmark = pytest.mark.gpu
P = 64
CASES = [(16384, 2048), (65536, 2048), (150000, 512), (4096, 2048), (64, 2048)]


def torch_page_table_transform(idx, pt, rtb):
    """What models write today: gather the page, then page * P + offset, -1 kept."""
    page = pt[rtb.long()[:, None], (idx.clamp(min=0) // P).long()]
    return torch.where(idx < 0, -1, page * P + idx % P)


def _inputs(rows, k):
    g = torch.Generator(device="cuda").manual_seed(0)
    pages = 4096
    idx = torch.randint(-1, pages * P, (rows, k), device="cuda", dtype=torch.int32, generator=g)
    pt = torch.randint(0, 1 << 20, (8, pages), device="cuda", dtype=torch.int32, generator=g)
    rtb = torch.randint(0, 8, (rows,), device="cuda", dtype=torch.int32, generator=g)
    return idx, pt, rtb


@pytest.mark.parametrize("rows,k", CASES)
@pytest.mark.parametrize("provider", ["cuda", "triton", "hip"])
def test_page_table_transform(bench, benchmark, provider, rows, k):
    idx, pt, rtb = _inputs(rows, k)
    out = torch.empty_like(idx)
    fn = lambda: dsa_ops.page_table_transform(idx, pt, row_to_batch=rtb, page_size=P, out=out)  # noqa: E731
    with registry.use_backend(provider):
        try:
            fn()
        except registry.DispatchError as e:
            pytest.skip(str(e).splitlines()[1])
        assert torch.equal(out, torch_page_table_transform(idx, pt, rtb))
        us = bench.timer.graph_median_us(fn) if rows <= 64 else bench.timer.median_us(fn)
        host = host_overhead_us(fn)[0] if rows <= 64 else None  # (median of one batch: its mean)
        benchmark.pedantic(lambda: (fn(), torch.cuda.synchronize()), rounds=10, warmup_rounds=2)
    t_us = bench.timer.graph_median_us(lambda: torch_page_table_transform(idx, pt, rtb)) if rows <= 64 else \
        bench.timer.median_us(lambda: torch_page_table_transform(idx, pt, rtb))
    nbytes = 2 * rows * k * 4
    extra = {"host_overhead_us": round(host, 2)} if host is not None else {}
    extra["achieved_gbps"] = round(nbytes / (us * 1e-6) / 1e9, 1)
    extra["timing"] = "cuda-graph replay" if rows <= 64 else "cuda events, cold L2"
    bench.add(record("page_table_transform", provider, {"rows": rows, "k": k, "page_size": P}, us,
                     floor_us=bench.floor_us(nbytes), floor_kind="memory (read idx + write out)",
                     baselines={"torch": t_us}, **extra))
