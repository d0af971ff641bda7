"""dsa.sparse_attention's Triton provider on the GPU against the reference (fp32 on dequantised values).

Inputs from tests/sparse_attention_cases.py: unreferenced pages NaN, permuted block tables with invalid
entries, indices -1 / INT32_MIN / INT32_MAX / past the table, rows with no valid index, padding rows.
Outputs are NaN-poisoned before each call. Tolerance (bf16 output): per (row, head) the largest error is
at most 2e-2 of the largest reference value and the cosine similarity is at least 0.999; rows whose
reference is 0 must be exactly 0.
"""

from __future__ import annotations

import logging

import dsa_ops
import pytest
import torch
from dsa_ops import registry
from dsa_ops.ops.sparse_attention import reference
from sparse_attention_cases import FP8, SHAPES, compare, every_code_cases, make_case

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

sa = pytest.importorskip("dsa_ops.backends.triton.sparse_attention")

DTYPES = {"fp8": FP8, "bf16": torch.bfloat16}
SCALES = (128**-0.5, 0.7, 1.9)


def _case(shape, dtype, seed=0, layout="plain"):
    rows, hq, hkv, d, dv, page, nb, nreq, mp, topk = SHAPES[shape] if isinstance(shape, str) else shape
    return make_case(rows, hq, hkv, d, dv, page=page, num_blocks=nb, num_reqs=nreq, max_pages=mp, topk=topk,
                     dtype=DTYPES[dtype], seed=seed, device="cuda", cache_layout=layout)


def _poisoned(q, vc):
    return torch.full((q.shape[0], q.shape[1], vc.shape[3]), float("nan"), dtype=torch.bfloat16, device=q.device)


def _check(case, split, scales=SCALES, override=None):
    q, kc, vc, idx, bt, t2r = case
    out = _poisoned(q, vc)
    sa.CONFIG_OVERRIDE = override
    try:
        sa.launch(q, kc, vc, idx, bt, t2r, *scales, out, split=split)
    finally:
        sa.CONFIG_OVERRIDE = None
    ref = reference(q, kc, vc, idx, bt, t2r, *scales)
    err = compare(out, ref)
    assert err is None, err


# fp8 load forms and tile configs the benchmark's sweep chooses among (each must be right to be chosen).
_NO = dict(v_perm=False, opaque=False)
FP8_FORMS = {"bytes": dict(k_pairs=False, v_pairs=False, **_NO), "vpairs": dict(k_pairs=False, v_pairs=True, **_NO),
             "kvpairs": dict(k_pairs=True, v_pairs=True, **_NO),
             "bf16mma": dict(f16=False, k_pairs=True, v_pairs=True, **_NO),
             "vperm": dict(k_pairs=False, v_perm=True, opaque=False), "opaque": dict(opaque=True, v_perm=False),
             "opaque-bf16mma": dict(f16=False, opaque=True, v_perm=False)}
SWEPT = [("single", c) for c in ((128, 4, 2), (128, 2, 2), (64, 1, 2), (32, 1, 2), (64, 2, 3))] + \
        [("split", c) for c in ((32, 4, 2), (32, 1, 2), (64, 2, 2))]


@pytest.mark.parametrize("form", list(FP8_FORMS))
@pytest.mark.parametrize("path,config", SWEPT)
def test_fp8_forms_and_configs(form, path, config):
    override = dict(FP8_FORMS[form], **{f"{path}_config": config})
    _check(_case("rows37", "fp8", seed=11), split=path == "split", override=override)


@pytest.mark.parametrize("form", ["default"] + list(FP8_FORMS))
@pytest.mark.parametrize("path", ["single", "split"])
def test_fp8_every_code_and_nan(form, path):
    """Every e4m3 code in valid tokens (subnormals, +-0, +-448), then NaN codes in a valid token's K and V:
    NaN exactly where the reference has it, the rest within tolerance."""
    finite, case = every_code_cases("cuda")
    override = None if form == "default" else FP8_FORMS[form]
    scales = (0.01, 1.0, 1.0)
    _check(finite, split=path == "split", scales=scales, override=override)
    out = _poisoned(case[0], case[2])
    sa.CONFIG_OVERRIDE = override
    try:
        sa.launch(*case, *scales, out, split=path == "split")
    finally:
        sa.CONFIG_OVERRIDE = None
    ref = reference(*case, *scales)
    assert ref.isnan().any()
    assert torch.equal(out.isnan(), ref.isnan()), f"NaN at {int(out.isnan().sum())}, reference {int(ref.isnan().sum())}"
    err = compare(out.nan_to_num(0.0), ref.nan_to_num(0.0))
    assert err is None, err


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("path", ["single", "split"])
def test_matches_reference(shape, dtype, path):
    _check(_case(shape, dtype, seed=len(shape)), split=path == "split")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("path", ["single", "split"])
def test_vllm_strided_cache_views(dtype, path):
    """K and V as views of one [num_blocks, Hkv, P, D + Dv] buffer (vLLM's layout)."""
    _check(_case((64, 24, 2, 128, 128, 64, 500, 6, 64, 2048), dtype, seed=3, layout="vllm"), split=path == "split")


@pytest.mark.parametrize("heads", [(8, 8, 64, 64), (6, 2, 128, 64), (32, 2, 128, 128), (64, 1, 64, 128),
                                   (128, 2, 128, 128)])
@pytest.mark.parametrize("path", ["single", "split"])
def test_head_layouts(heads, path):
    hq, hkv, d, dv = heads
    _check(_case((23, hq, hkv, d, dv, 16, 400, 5, 50, 300), "fp8", seed=hq + d), split=path == "split")


@pytest.mark.parametrize("page", [1, 16, 48])
def test_page_sizes(page):
    for split in (False, True):
        _check(_case((19, 24, 2, 128, 128, page, 3000 // page + 40, 4, 2000 // page, 512), "fp8", seed=page),
               split=split)


@pytest.mark.parametrize("rows", [1, 8, 32, 33, 64, 200, 1600])
def test_dispatch_through_the_op(rows):
    """dsa_ops.sparse_attention with the Triton backend forced: the gate picks the path; out= and functional."""
    q, kc, vc, idx, bt, t2r = _case((rows, 24, 2, 128, 128, 64, 2000, 7, 256, 2048), "fp8", seed=rows)
    kw = dict(softmax_scale=SCALES[0], k_scale=SCALES[1], v_scale=SCALES[2])
    ref = reference(q, kc, vc, idx, bt, t2r, *SCALES)
    with registry.use_backend("triton"):
        out = _poisoned(q, vc)
        got = dsa_ops.sparse_attention(q, kc, vc, idx, bt, t2r, out=out, **kw)
        assert got is out
        assert compare(out, ref) is None, compare(out, ref)
        fresh = dsa_ops.sparse_attention(q, kc, vc, idx, bt, t2r, **kw)
        assert compare(fresh, ref) is None, compare(fresh, ref)


def test_split_and_single_agree_on_benign_rows():
    """Both paths over the same rows: each within bf16 rounding of the other (no invalid index)."""
    case = make_case(48, 24, 2, 128, 128, page=64, num_blocks=600, num_reqs=4, max_pages=128, topk=2048, dtype=FP8,
                     seed=9, device="cuda", hostile=False)
    outs = []
    for split in (False, True):
        out = _poisoned(case[0], case[2])
        sa.launch(*case, *SCALES, out, split=split)
        outs.append(out)
    assert compare(outs[0], outs[1].float()) is None


def test_fp8_nan_code_propagates():
    """A referenced token whose K holds the e4m3 NaN code gives NaN in its row (the cast is exact), and only there."""
    q, kc, vc, idx, bt, t2r = make_case(4, 24, 2, 128, 128, page=64, num_blocks=50, num_reqs=2, max_pages=8,
                                        topk=64, dtype=FP8, seed=4, device="cuda", hostile=False)
    t2r[:] = torch.tensor([0, 0, 1, 1], dtype=torch.int32)
    idx[0, 5] = 3  # row 0 reads token 3 of request 0
    idx[1] = torch.where(idx[1] == 3, 4, idx[1])  # row 1 of the same request does not
    page0 = bt[0, 0].item()
    kc.view(torch.uint8)[page0, 3, 0, 7] = 0x7F
    for split in (False, True):
        out = _poisoned(q, vc)
        sa.launch(q, kc, vc, idx, bt, t2r, *SCALES, out, split=split)
        assert torch.isnan(out[0, :12]).all() and torch.isfinite(out[0, 12:]).all()
        assert torch.isfinite(out[1:]).all()


def test_cuda_graph_capture_after_warmup():
    """warmup() then capture both paths; replays follow new inputs written into the captured buffers."""
    sa.warmup(24, 2, 128, page_size=64, topk=2048)
    for rows in (4, 300):
        case = _case((rows, 24, 2, 128, 128, 64, 1500, 5, 256, 2048), "fp8", seed=rows)
        q, kc, vc, idx, bt, t2r = case
        out = _poisoned(q, vc)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            sa.launch(*case, *SCALES, out)
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            sa.launch(*case, *SCALES, out)
        fresh = _case((rows, 24, 2, 128, 128, 64, 1500, 5, 256, 2048), "fp8", seed=rows + 1)
        for dst, src in zip(case, fresh):
            dst.copy_(src)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert compare(out, reference(*fresh, *SCALES)) is None


def test_warmup_compiles_both_paths_and_logs(caplog):
    """A head layout no other test uses: warmup compiles the slot pass, both attention paths and the merge,
    logs each first compile, and a later call of those shapes compiles nothing new."""
    with caplog.at_level(logging.INFO, logger="dsa_ops"):
        keys = sa.warmup(12, 3, 32, page_size=32, topk=96, kv_dtypes=(FP8,))
    kinds = {k[0] for k in keys}
    assert {"slots", "attention", "merge"} <= kinds
    assert {k[1] for k in keys if k[0] == "attention"} == {False, True}
    assert sum("first launch" in r.message for r in caplog.records) == len(keys)
    before = set(sa._COMPILED), _triton_binaries()
    for rows in (1, 40):
        _check(_case((rows, 12, 3, 32, 32, 32, 60, 3, 6, 96), "fp8", seed=rows), split=None)
    assert (set(sa._COMPILED), _triton_binaries()) == before


def _triton_binaries() -> int:
    """Binaries Triton holds for the three kernels (its per-device kernel caches)."""
    return sum(len(c[0]) for f in (sa.slots_kernel, sa.attention_kernel, sa.merge_kernel)
               for c in f.device_caches.values())
