"""GPU tests of the CUDA C++ and native HIP providers of dsa.page_table_transform.

Each case forces one provider (`dsa_ops.use_backend`) and compares it bitwise with the reference
(`map_through_page_table`, run on the GPU), with outputs poisoned before the call. On the H200 the hip
provider is the HIP source built by nvcc through the compat header. Run with `pytest -m gpu`.
"""

from __future__ import annotations

import dsa_ops
import pytest
import torch
from dsa_ops import registry
from dsa_ops.ops._common import map_through_page_table

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (run `pytest -m gpu` on the H200)"),
]

OP = "page_table_transform"
SENTINEL = -123456789  # never a valid output (outputs are -1 or >= 0)
INT32_MAX = 2**31 - 1


def _skip_if_unservable(backend: str) -> None:
    if backend == "cuda" and torch.version.hip is not None:
        pytest.skip("the CUDA C++ provider needs an NVIDIA GPU")
    if backend == "hip" and torch.version.hip is not None:
        arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
        if arch != "gfx950":
            pytest.skip(f"the native HIP provider is built for gfx950, this GPU is {arch}")


@pytest.fixture(params=["cuda", "hip"])
def backend(request):
    _skip_if_unservable(request.param)
    with dsa_ops.use_backend(request.param):
        yield request.param


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _randint(g, lo, hi, shape) -> torch.Tensor:
    return torch.randint(lo, hi, shape, generator=g, device="cuda", dtype=torch.int64).to(torch.int32)


def _check(backend, indices, page_table, *, row_to_batch=None, starts=None, page_size=64, out=None,
           in_place=False):
    """Run the forced provider with a poisoned (or in-place) out, and the functional form; compare both."""
    want = map_through_page_table(indices.clone(), page_table, row_to_batch, starts, page_size)
    kwargs = dict(row_to_batch=row_to_batch, page_table_row_starts=starts, page_size=page_size)

    if indices.numel():  # the provider that serves must be the forced one
        args = (indices, page_table, row_to_batch, starts, page_size, indices)
        assert registry.select(OP, args).backend == backend

    got = dsa_ops.page_table_transform(indices.clone(), page_table, **kwargs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)

    if in_place:
        target = indices
    else:
        target = out if out is not None else torch.empty_like(indices)
        target.fill_(SENTINEL)
    res = dsa_ops.page_table_transform(indices, page_table, out=target, **kwargs)
    assert res is target
    torch.cuda.synchronize()
    assert not (target == SENTINEL).any(), "some outputs were not written"
    torch.testing.assert_close(target, want, rtol=0, atol=0)


def _indices(g, rows, k, max_index, *, minus_one_frac=0.2, negative=True):
    idx = _randint(g, 0, max(1, max_index), (rows, k))
    mask = torch.rand((rows, k), generator=g, device="cuda") < minus_one_frac
    idx = torch.where(mask, torch.full_like(idx, -1), idx)
    if negative:  # other negative values are invalid too, not only -1
        neg = torch.rand((rows, k), generator=g, device="cuda") < 0.05
        idx = torch.where(neg, _randint(g, -(2**31), -1, (rows, k)), idx)
    return idx


def _page_table(g, batches, max_pages, *, hostile=False, page_size=64):
    pt = _randint(g, 0, 1 << 16, (batches, max_pages))
    if hostile:
        r = torch.rand(pt.shape, generator=g, device="cuda")
        pt = torch.where(r < 0.15, _randint(g, -(2**31), 0, pt.shape), pt)  # negative entries
        # Entries whose slot id page * P + offset overflows int32 (and some just below the limit).
        lim = INT32_MAX // page_size
        near = _randint(g, max(0, lim - 2), lim + 1, pt.shape)
        far = _randint(g, lim, INT32_MAX, pt.shape) if lim < INT32_MAX else near
        pt = torch.where((r >= 0.15) & (r < 0.3), near, pt)
        pt = torch.where((r >= 0.3) & (r < 0.45), far, pt)
    return pt


@pytest.mark.parametrize("page_size", [1, 16, 64, 128])
@pytest.mark.parametrize("with_batch", [False, True])
@pytest.mark.parametrize("with_starts", [False, True])
def test_random(backend, page_size, with_batch, with_starts):
    g = _gen(page_size * 4 + with_batch * 2 + with_starts)
    rows, k, batches, max_pages = 37, 64, 7, 20
    idx = _indices(g, rows, k, (max_pages + 2) * page_size)
    pt = _page_table(g, batches if with_batch else rows, max_pages)
    rtb = _randint(g, 0, batches, (rows,)) if with_batch else None
    starts = _randint(g, 0, 4, (rows,)) if with_starts else None
    _check(backend, idx, pt, row_to_batch=rtb, starts=starts, page_size=page_size)


@pytest.mark.parametrize("page_size", [1, 16, 64, 128, 2**20, 2**31])
def test_hostile(backend, page_size):
    """Negative and overflowing page entries, out-of-range pages, batch rows and row starts."""
    g = _gen(1000 + page_size % 997)
    rows, k, batches, max_pages = 513, 40, 9, 33
    idx = _indices(g, rows, k, min(INT32_MAX, (max_pages + 5) * page_size))
    # Some huge valid indices too: their page number alone is far past the table.
    idx[:, :3] = _randint(g, INT32_MAX - 1000, INT32_MAX, (rows, 3))
    pt = _page_table(g, batches, max_pages, hostile=True, page_size=page_size)
    rtb = _randint(g, -3, batches + 3, (rows,))
    rtb[:4] = torch.tensor([-(2**31), INT32_MAX, batches, -1], dtype=torch.int32, device="cuda")
    starts = _randint(g, -5, max_pages + 5, (rows,))
    starts[4:8] = torch.tensor([-(2**31), INT32_MAX, INT32_MAX - 1, max_pages], dtype=torch.int32,
                               device="cuda")
    _check(backend, idx, pt, row_to_batch=rtb, starts=starts, page_size=page_size)
    _check(backend, idx, pt, row_to_batch=rtb, page_size=page_size)
    _check(backend, idx, pt[:1].expand(rows, max_pages).contiguous(), starts=starts, page_size=page_size)


def test_many_rows(backend):
    """150000 rows: more than a 65535-limited grid axis could hold."""
    g = _gen(7)
    rows, k, batches, max_pages, page_size = 150000, 8, 1024, 64, 64
    idx = _indices(g, rows, k, max_pages * page_size)
    pt = _page_table(g, batches, max_pages)
    rtb = _randint(g, 0, batches, (rows,))
    starts = _randint(g, 0, 8, (rows,))
    _check(backend, idx, pt, row_to_batch=rtb, starts=starts, page_size=page_size)
    _check(backend, idx, pt[:1].expand(rows, max_pages).contiguous()[:rows], page_size=page_size)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 7, 2047])
def test_k_not_multiple_of_four(backend, k):
    """Quads of 4 elements cross row boundaries; each element must use its own row's mapping."""
    g = _gen(k)
    rows, batches, max_pages, page_size = 333 if k < 100 else 41, 6, 40, 16
    idx = _indices(g, rows, k, max_pages * page_size)
    pt = _page_table(g, batches, max_pages, hostile=True, page_size=page_size)
    rtb = _randint(g, -1, batches + 1, (rows,))
    starts = _randint(g, -2, 10, (rows,))
    _check(backend, idx, pt, row_to_batch=rtb, starts=starts, page_size=page_size)


@pytest.mark.parametrize("k", [4, 5, 64])
@pytest.mark.parametrize("where", ["indices", "out", "both"])
def test_misaligned_storage(backend, k, where):
    """Views at element offset 1 of a larger buffer: not 16-byte aligned, so the scalar path runs."""
    g = _gen(50 + k)
    rows, batches, max_pages, page_size = 301, 5, 30, 64
    src = _indices(g, rows, k, max_pages * page_size)
    if where in ("indices", "both"):
        buf = torch.empty(rows * k + 1, dtype=torch.int32, device="cuda")
        buf[1:].copy_(src.view(-1))
        idx = buf[1:].view(rows, k)
        assert idx.data_ptr() % 16 != 0
    else:
        idx = src
    out = None
    if where in ("out", "both"):
        obuf = torch.empty(rows * k + 1, dtype=torch.int32, device="cuda")
        out = obuf[1:].view(rows, k)
    pt = _page_table(g, batches, max_pages)
    rtb = _randint(g, 0, batches, (rows,))
    _check(backend, idx, pt, row_to_batch=rtb, page_size=page_size, out=out)


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("k", [3, 2048])
def test_in_place(backend, offset, k):
    g = _gen(90 + offset + k)
    rows, batches, max_pages, page_size = 129, 4, 50, 64
    buf = torch.empty(rows * k + offset, dtype=torch.int32, device="cuda")
    idx = buf[offset:].view(rows, k)
    idx.copy_(_indices(g, rows, k, max_pages * page_size))
    pt = _page_table(g, batches, max_pages, hostile=True)
    rtb = _randint(g, -1, batches + 1, (rows,))
    starts = _randint(g, -1, 3, (rows,))
    _check(backend, idx, pt, row_to_batch=rtb, starts=starts, page_size=page_size, in_place=True)


def test_page_table_row_stride(backend):
    """A page table with a non-unit row stride (a column slice of a wider table, and every other row)."""
    g = _gen(123)
    rows, k, batches, max_pages, page_size = 200, 33, 12, 25, 16
    wide = _page_table(g, batches * 2, max_pages + 7, hostile=True, page_size=page_size)
    idx = _indices(g, rows, k, (max_pages + 3) * page_size)
    rtb = _randint(g, -1, batches + 1, (rows,))
    for pt in (wide[:batches, :max_pages], wide[::2, 3 : 3 + max_pages]):
        assert pt.stride(1) == 1 and pt.stride(0) != pt.shape[1]
        _check(backend, idx, pt, row_to_batch=rtb, page_size=page_size)


def test_strided_row_metadata(backend):
    """row_to_batch and page_table_row_starts as non-contiguous views (the op allows any stride)."""
    g = _gen(321)
    rows, k, batches, max_pages, page_size = 150, 16, 8, 20, 64
    idx = _indices(g, rows, k, max_pages * page_size)
    pt = _page_table(g, batches, max_pages)
    meta = _randint(g, 0, batches, (rows, 3))
    rtb, starts = meta[:, 0], meta[:, 2].remainder(3)
    assert rtb.stride(0) == 3
    _check(backend, idx, pt, row_to_batch=rtb, starts=starts, page_size=page_size)


def test_empty_shapes(backend):
    g = _gen(5)
    pt = _page_table(g, 4, 8)
    for rows, k in ((0, 8), (8, 0), (0, 0)):
        idx = torch.zeros(rows, k, dtype=torch.int32, device="cuda")
        _check(backend, idx, pt, page_size=64)
    # A table with no rows or no columns: every index maps to -1 and nothing is read.
    idx = _indices(g, 20, 9, 500)
    for empty in (pt[:0], pt[:, :0]):
        _check(backend, idx, empty, row_to_batch=_randint(g, 0, 4, (20,)), page_size=64)


def test_side_stream_and_dependent_launches(backend):
    """Runs on the current stream, and back-to-back launches in place, each reading the previous one's
    output (the CUDA provider launches with PDL on SM90+), see the finished result."""
    g = _gen(77)
    rows, k, batches, max_pages, page_size = 4096, 256, 16, 64, 16
    idx = _indices(g, rows, k, max_pages * page_size, minus_one_frac=0.05)
    pt1 = _page_table(g, batches, max_pages).remainder(max_pages)  # pass-1 outputs index pt2's columns
    pt2 = _page_table(g, batches, max_pages * page_size)
    rtb = _randint(g, 0, batches, (rows,))
    want = map_through_page_table(map_through_page_table(idx, pt1, rtb, None, page_size), pt2, rtb, None, 1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    results = []
    with torch.cuda.stream(side):
        for _ in range(3):
            a = idx.clone()
            dsa_ops.page_table_transform(a, pt1, row_to_batch=rtb, page_size=page_size, out=a)
            dsa_ops.page_table_transform(a, pt2, row_to_batch=rtb, page_size=1, out=a)
            results.append(a)
    side.synchronize()
    for a in results:
        torch.testing.assert_close(a, want, rtol=0, atol=0)


def test_cuda_graph_capture(backend):
    g = _gen(88)
    rows, k, batches, max_pages, page_size = 257, 64, 8, 32, 64
    idx = _indices(g, rows, k, max_pages * page_size)
    pt = _page_table(g, batches, max_pages, hostile=True)
    rtb = _randint(g, -1, batches + 1, (rows,))
    out = torch.empty_like(idx)
    dsa_ops.page_table_transform(idx, pt, row_to_batch=rtb, page_size=page_size, out=out)  # builds, warms up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dsa_ops.page_table_transform(idx, pt, row_to_batch=rtb, page_size=page_size, out=out)
    new_idx = _indices(g, rows, k, max_pages * page_size)
    idx.copy_(new_idx)
    out.fill_(SENTINEL)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, map_through_page_table(new_idx, pt, rtb, None, page_size), rtol=0, atol=0)


def test_hip_is_not_chosen_automatically_on_nvidia():
    """The compat build checks the HIP algorithm on NVIDIA; it never serves unless forced."""
    if torch.version.hip is not None:
        pytest.skip("NVIDIA only")
    idx = torch.zeros(2, 4, dtype=torch.int32, device="cuda")
    pt = torch.zeros(2, 4, dtype=torch.int32, device="cuda")
    args = (idx, pt, None, None, 64, idx)
    hip = registry.providers(OP)["hip"]
    assert "force DSA_OPS_BACKEND=hip" in (hip.supports(*args) or "")
    with dsa_ops.use_backend(None):
        assert registry.select(OP, args).backend != "hip"
