"""The Triton sparse_attention kernels on CPU tensors under TRITON_INTERPRET=1, against the reference.

Small shapes (head dims 16 and 32, a few rows) on adversarial inputs (tests/sparse_attention_cases.py):
both paths (single pass with its slot pass, split-K with pages resolved in its loop or by the slot pass),
fp8 read as int16 pairs or byte by byte (V's columns permuted or not), bf16, every e4m3 code (NaN codes in
valid tokens give NaN where the reference has it), several tiles a row, a group size that is not a power of
two, vLLM's strided K/V views, the triton_op, and degenerate metadata.
"""

from __future__ import annotations

import os
import textwrap

import pytest
from triton_interpret_runner import run_interpreted

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent(
    r"""
    import json, os, sys
    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.path.insert(0, TESTS_DIR)
    import _triton_interpreter_compat  # noqa: F401
    import torch
    import dsa_ops
    from dsa_ops.backends.triton import sparse_attention as m
    from dsa_ops.ops.sparse_attention import reference
    from sparse_attention_cases import FP8, compare, make_case

    results = {}

    def check(name, case, scales=(0.25, 0.5, 2.0), override=None, split=None, via_op=False, nan_ok=False):
        q, kc, vc, idx, bt, t2r = case
        ss, ks, vs = scales
        ref = reference(q, kc, vc, idx, bt, t2r, ss, ks, vs)
        out = torch.full((q.shape[0], q.shape[1], vc.shape[3]), float("nan"), dtype=torch.bfloat16)
        m.CONFIG_OVERRIDE = override
        try:
            if via_op:
                torch.ops.dsa_triton.sparse_attention_out(q, kc, vc, idx, bt, t2r, ss, ks, vs, out)
            else:
                m.launch(q, kc, vc, idx, bt, t2r, ss, ks, vs, out, split=split)
        except Exception as e:  # noqa: BLE001
            results[name] = f"raised {type(e).__name__}: {e}"
            return
        finally:
            m.CONFIG_OVERRIDE = None
        if nan_ok:  # NaN exactly where the reference has it, the rest compared as usual
            if not torch.equal(out.isnan(), ref.isnan()):
                results[name] = f"NaN at {int(out.isnan().sum())} outputs, the reference at {int(ref.isnan().sum())}"
                return
            if not ref.isnan().any():
                results[name] = "the case has no NaN output"
                return
            out, ref = out.nan_to_num(0.0), ref.nan_to_num(0.0)
        results[name] = compare(out, ref) or "ok"

    small = dict(split_config=(16, 4, 1), single_config=(16, 4, 1))
    FP8_FORMS = {"bf16mma": dict(f16=False, k_pairs=True, v_pairs=True),
                 "bytes": dict(k_pairs=False, v_pairs=False), "kpairs": dict(k_pairs=True, v_pairs=False),
                 "vperm": dict(k_pairs=False, v_perm=True), "opaque": dict(opaque=True)}
    for dtype, dname in ((FP8, "fp8"), (torch.bfloat16, "bf16")):
        for hq, hkv in ((4, 2), (6, 2), (2, 1)):
            case = make_case(7, hq, hkv, 16, 32, page=4, num_blocks=40, num_reqs=3, max_pages=5, topk=37,
                             dtype=dtype, seed=hq * 10 + hkv)
            tag = f"{dname}-hq{hq}-hkv{hkv}"
            check(f"single-{tag}", case, override=small, split=False)
            check(f"split-inline-{tag}", case, override=dict(small, splits=3, slots_inline=True), split=True)
            check(f"split-slots-{tag}", case, override=dict(small, splits=2, slots_inline=False), split=True)
            if dtype == FP8:
                for name, form in FP8_FORMS.items():
                    check(f"single-{name}-{tag}", case, override=dict(small, **form), split=False)
                    check(f"split-{name}-{tag}", case, override=dict(small, splits=2, **form), split=True)
        case = make_case(5, 4, 2, 32, 16, page=8, num_blocks=30, num_reqs=2, max_pages=3, topk=20, dtype=dtype,
                         seed=7, cache_layout="vllm")
        check(f"vllm-layout-single-{dname}", case, split=False)
        check(f"vllm-layout-split-{dname}", case, split=True)
        # split_compiled (the op's capture rule): True for the specialisation just launched, False for another page
        other = make_case(5, 4, 2, 32, 16, page=16, num_blocks=30, num_reqs=2, max_pages=3, topk=20, dtype=dtype,
                          seed=8, cache_layout="vllm")
        seen = (m.split_compiled(*case[:3]), m.split_compiled(*other[:3]))
        results[f"split-compiled-{dname}"] = "ok" if seen == (True, False) else f"split_compiled gave {seen}"
        check(f"default-config-{dname}", case)
        check(f"triton_op-{dname}", case, via_op=True)
    # fp8 values whose scales make the score scale fold matter; NaN-free benign case, k_scale negative
    case = make_case(4, 4, 2, 16, 16, page=4, num_blocks=12, num_reqs=2, max_pages=4, topk=16, dtype=FP8,
                     seed=3, hostile=False)
    check("benign-negative-kscale", case, scales=(0.7, -1.5, 0.25))
    # q far from 1 (the fp16 path scales q by a power of two per program): rows x 2^20, x 2^-60, mixed
    q = case[0].clone()
    q[0] *= 2.0**20
    q[1] *= 2.0**-60
    q[2, :, ::2] *= 2.0**-30
    for dtype, dname in ((FP8, "fp8"), (torch.bfloat16, "bf16")):
        c = (q,) + tuple(x.to(dtype) if x.is_floating_point() else x for x in case[1:3]) + case[3:]
        check(f"q-range-{dname}", c, scales=(0.1, 1.0, 1.0), split=False)
        check(f"q-range-split-{dname}", c, scales=(0.1, 1.0, 1.0), split=True)
    # heads of one KV group far apart (the fp16 path scales q per head): x 2^18 beside x 2^-18, and an inf head
    # (NaN in that head only, as the reference's; its group's other head unharmed)
    q = case[0].clone()
    q[:, 0] *= 2.0**18
    q[:, 1] *= 2.0**-18
    qi = case[0].clone()
    qi[0, 2, 3] = float("inf")
    for dtype, dname in ((FP8, "fp8"), (torch.bfloat16, "bf16")):
        kv = tuple(x.to(dtype) if x.is_floating_point() else x for x in case[1:3])
        for split in (False, True):
            sfx = "-split" if split else ""
            check(f"q-heads-apart{sfx}-{dname}", (q,) + kv + case[3:], scales=(2.0**16, 1.0, 1.0), split=split)
            check(f"q-head-inf{sfx}-{dname}", (qi,) + kv + case[3:], scales=(0.1, 1.0, 1.0), split=split,
                  nan_ok=True)
    # every e4m3 code in valid tokens: subnormals, +-0, +-448 and (second case) NaN codes in K and V, per form
    q, kc, vc, idx, bt, t2r = make_case(6, 4, 2, 16, 32, page=4, num_blocks=12, num_reqs=2, max_pages=4, topk=24,
                                        dtype=FP8, seed=9, hostile=False)
    kb = (torch.arange(kc.numel()) % 256).to(torch.uint8).view(kc.shape)
    vb = ((torch.arange(vc.numel()) * 7 + 3) % 256).to(torch.uint8).view(vc.shape)
    for b in (kb, vb):
        b[b == 0x7F] = 0x7E  # NaN -> 448
        b[b == 0xFF] = 0xFE  # NaN -> -448
    finite = (q, kb.view(FP8), vb.view(FP8), idx, bt, t2r)

    def slot(r, j):
        pos = int(idx[r, j])
        return int(bt[int(t2r[r]), pos // 4]), pos % 4

    kn, vn = kb.clone(), vb.clone()
    vn[slot(0, 0)][1, 3] = 0x7F  # row 0: a valid token's V holds NaN in column 3 (KV head 1)
    vn[slot(4, 5)][0, 0] = 0xFF
    kn[slot(3, 2)][0, 5] = 0x7F  # row 3: a valid token's K holds NaN (KV head 0)
    nan = (q, kn.view(FP8), vn.view(FP8), idx, bt, t2r)
    for form in ("default",) + tuple(FP8_FORMS):
        o = None if form == "default" else dict(small, **FP8_FORMS[form])
        for split in (False, True):
            check(f"codes-{form}-{split}", finite, scales=(0.05, 1.0, 1.0), override=o, split=split)
            check(f"nan-codes-{form}-{split}", nan, scales=(0.05, 1.0, 1.0), override=o, split=split, nan_ok=True)
    # degenerate metadata: nothing valid anywhere, empty block table, topk 0
    q, kc, vc, idx, bt, t2r = make_case(3, 4, 2, 16, 16, page=4, num_blocks=8, num_reqs=2, max_pages=2, topk=8,
                                        dtype=FP8, seed=5)
    check("all-invalid", (q, kc, vc, torch.full_like(idx, -1), bt, t2r), split=False)
    check("all-invalid-split", (q, kc, vc, torch.full_like(idx, -1), bt, t2r), split=True)
    for split in (False, True):
        check(f"empty-table-{split}", (q, kc, vc, idx, bt[:0], t2r), split=split)
        check(f"empty-table-cols-{split}", (q, kc, vc, idx, bt[:, :0], t2r), split=split)
        check(f"topk0-{split}", (q, kc, vc, idx[:, :0], bt, t2r), split=split)
    print("RESULTS " + json.dumps(results))
    """
).replace("TESTS_DIR", repr(TESTS_DIR))

_FORMS = ("bf16mma", "bytes", "kpairs", "vperm", "opaque")
_TAGS = [f"{d}-hq{hq}-hkv{hkv}" for d in ("fp8", "bf16") for hq, hkv in ((4, 2), (6, 2), (2, 1))]
CASES = (
    [f"{p}-{t}" for t in _TAGS for p in ("single", "split-inline", "split-slots")]
    + [f"{p}-{f}-{t}" for t in _TAGS if t.startswith("fp8") for f in _FORMS for p in ("single", "split")]
    + [f"{p}-{f}-{s}" for p in ("codes", "nan-codes") for f in ("default",) + _FORMS for s in (False, True)]
    + [f"{p}-{d}" for d in ("fp8", "bf16")
       for p in ("vllm-layout-single", "vllm-layout-split", "split-compiled", "default-config", "triton_op")]
    + ["benign-negative-kscale", "all-invalid", "all-invalid-split"]
    + [f"q-range{s}-{d}" for d in ("fp8", "bf16") for s in ("", "-split")]
    + [f"{p}{s}-{d}" for p in ("q-heads-apart", "q-head-inf") for d in ("fp8", "bf16") for s in ("", "-split")]
    + [f"{p}-{s}" for s in (False, True) for p in ("empty-table", "empty-table-cols", "topk0")]
)


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT, timeout=900)


@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference(interpreted, case):
    assert interpreted.get(case) == "ok", f"{case}: {interpreted.get(case, 'not run')}"


def test_every_case_reported(interpreted):
    assert sorted(interpreted) == sorted(CASES)
