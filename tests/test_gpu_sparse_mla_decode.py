"""GPU tests of the Triton sparse_mla_decode provider against a float64 oracle on the dequantised rows.

Caches are NaN-filled except the slots in use (tests/sparse_mla_decode_cases.py), so a read of an unused
slot, of a page's padding or of a position past topk_lens shows as NaN. Invalid indices: -1, INT_MIN,
INT_MAX, the slot count and past it; rows with no valid token; 64 and 128 heads; both layouts; both
paths (single pass, split-KV forced, and the heuristic); attn_sink; batch 1 to 256. Outputs are
poisoned (NaN) before each call. Tolerances: compare() in the cases module (bf16 out 1e-3 absolute or
2/128 relative or the bf16-probability bound, 1 - cosine below 1e-5 a row, lse 1e-5 relative).
"""

from __future__ import annotations

import pytest
import torch
from sparse_mla_decode_cases import compare, make_case, oracle

pytestmark = pytest.mark.gpu

DEV = "cuda"
SCALE = {"v32": 576**-0.5, "v4": 512**-0.5}


@pytest.fixture(scope="module")
def m():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from dsa_ops.backends.triton import sparse_mla_decode

    return sparse_mla_decode


def _run(m, case, layout, split=None):
    q, cache, idx, lens, sink = case
    b, s_q, h, _ = q.shape
    out = torch.full((b, s_q, h, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    lse = torch.full((b, h, s_q), float("nan"), dtype=torch.float32, device=DEV)
    m.launch(q, cache, idx, SCALE[layout], layout, lens, sink, split=split, out=out, lse=lse)
    torch.cuda.synchronize()
    return out, lse


def _check(out, lse, case, layout):
    q, cache, idx, lens, sink = case
    err = compare(out, lse, *oracle(q, cache, idx, SCALE[layout], layout, lens, sink))
    assert err is None, err


@pytest.mark.parametrize("split", [False, True, None], ids=["single", "split", "heuristic"])
@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_matches_oracle(m, layout, heads, split):
    # request 0 full, 1 cut at 1000 (its tail points at NaN slots), 2 length 0, 3 past top-k
    case = make_case(layout, 4, 2, heads, 2048, page=64, num_blocks=96, lens=[2048, 1000, 0, 4096],
                     seed=heads + (split is True), device=DEV)
    out, lse = _run(m, case, layout, split)
    _check(out, lse, case, layout)


@pytest.mark.parametrize("split", [False, True], ids=["single", "split"])
@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_rows_without_a_token(m, layout, split):
    q, cache, idx, lens, sink = make_case(layout, 3, 2, 64, 512, page=64, num_blocks=16, lens=[512, 512, 0],
                                          seed=3, device=DEV)
    idx[0, 1] = -1
    idx[1, 0] = torch.tensor([-1, -(2**31), 2**31 - 1, 16 * 64], dtype=torch.int32, device=DEV).repeat(128)
    case = (q, cache, idx, lens, sink)
    out, lse = _run(m, case, layout, split)
    _check(out, lse, case, layout)
    assert torch.all(out[0, 1] == 0) and torch.all(out[1, 0] == 0) and torch.all(out[2] == 0)
    assert torch.all(lse[0, :, 1] == float("inf")) and torch.all(lse[2] == float("inf"))


@pytest.mark.parametrize("batch,s_q,heads", [(1, 1, 128), (1, 2, 64), (4, 1, 64), (32, 2, 128), (256, 1, 64)])
def test_batches(m, batch, s_q, heads):
    layout = "v32"
    case = make_case(layout, batch, s_q, heads, 2048, page=64, num_blocks=256, seed=batch, sink=batch % 2 == 0,
                     invalid_every=7, device=DEV)
    out, lse = _run(m, case, layout)
    _check(out, lse, case, layout)


@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_padded_pages(m, layout):
    case = make_case(layout, 2, 1, 128, 1024, page=64, num_blocks=40, lens=[1024, 700], pad=64, seed=9, device=DEV)
    assert case[1].stride(0) == 64 * {"v32": 656, "v4": 584}[layout] + 64
    for split in (False, True):
        out, lse = _run(m, case, layout, split)
        _check(out, lse, case, layout)


@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_op_routes_to_triton_and_captures(m, layout):
    import dsa_ops
    from dsa_ops import registry

    q, cache, idx, lens, sink = case = make_case(layout, 2, 1, 64, 2048, page=64, num_blocks=64, lens=[2048, 1500],
                                                  seed=11, device=DEV)
    args = (q, cache, idx, SCALE[layout], layout, lens, sink)
    assert registry.select_on("sparse_mla_decode", q.device, args).backend == "triton"
    out, lse = dsa_ops.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE[layout], layout=layout, topk_lens=lens,
                                         attn_sink=sink)
    _check(out, lse, case, layout)
    out2, lse2 = torch.ops.dsa_triton.sparse_mla_decode(*args)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    # CUDA-graph capture and replay of the op (split path: its workspace comes from the graph's pool)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dsa_ops.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE[layout], layout=layout, topk_lens=lens,
                                  attn_sink=sink)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        go, gl = dsa_ops.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE[layout], layout=layout,
                                           topk_lens=lens, attn_sink=sink)
    go.fill_(float("nan"))
    gl.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(go, out) and torch.equal(gl, lse)


def test_supports_declines_misaligned_cache(m):
    raw = torch.zeros(2 * 64 * 656 + 2, dtype=torch.uint8, device=DEV)
    cache = raw[2:].view(2, 64, 1, 656)
    q = torch.zeros(1, 1, 64, 576, dtype=torch.bfloat16, device=DEV)
    idx = torch.zeros(1, 1, 16, dtype=torch.int32, device=DEV)
    assert "multiples of 4" in m.supports(q, cache, idx, 1.0, "v32", None, None)
