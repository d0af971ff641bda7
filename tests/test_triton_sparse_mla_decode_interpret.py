"""The Triton sparse_mla_decode kernels on CPU tensors under TRITON_INTERPRET=1, against a float64 oracle.

Small shapes (64 and 128 heads, top-k 64 to 128, pages of 16) on NaN-filled caches
(tests/sparse_mla_decode_cases.py): both layouts, single pass and split-KV (forced and by the heuristic),
invalid slots, topk_lens (0, short, negative, past top-k), attn_sink, rows with no valid token, padded
pages, top-k 0, an empty cache, poisoned outputs, the triton_op, and the dequant bit for bit on every finite e4m3
code (rows of one token, weight 1; tests/sparse_mla_decode_cases.py make_code_sweep).
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
    from dsa_ops.backends.triton import sparse_mla_decode as m
    from sparse_mla_decode_cases import code_sweep_mismatch, compare, make_case, make_code_sweep, oracle

    results = {}

    def check(name, case, split=None, override=None, via_op=False, scale=0.04):
        q, cache, idx, lens, sink = case
        layout = "v32" if q.shape[-1] == 576 else "v4"
        b, s_q, h, _ = q.shape
        out = torch.full((b, s_q, h, 512), float("nan"), dtype=torch.bfloat16)
        lse = torch.full((b, h, s_q), float("nan"), dtype=torch.float32)
        m.CONFIG_OVERRIDE = override
        try:
            if via_op:
                out, lse = torch.ops.dsa_triton.sparse_mla_decode(q, cache, idx, scale, layout, lens, sink)
            else:
                m.launch(q, cache, idx, scale, layout, lens, sink, split=split, out=out, lse=lse)
        except Exception as e:  # noqa: BLE001
            results[name] = f"raised {type(e).__name__}: {e}"
            return
        finally:
            m.CONFIG_OVERRIDE = None
        results[name] = compare(out, lse, *oracle(q, cache, idx, scale, layout, lens, sink)) or "ok"

    for layout in ("v32", "v4"):
        case = make_case(layout, 2, 2, 64, 128, lens=[128, 90], seed=1)
        check(f"{layout}-single", case, split=False)
        check(f"{layout}-split", case, split=True)
        check(f"{layout}-split3", case, split=True, override={"splits": 3})
        check(f"{layout}-heuristic", case)
        nolens = make_case(layout, 1, 2, 64, 120, sink=False, seed=2)
        check(f"{layout}-nolens-nosink", nolens, split=False)
        check(f"{layout}-nolens-nosink-split", nolens, split=True)
        h128 = make_case(layout, 1, 1, 128, 72, lens=[67], seed=3)
        check(f"{layout}-h128", h128, split=False)
        check(f"{layout}-h128-split", h128, split=True)
        # request 0 has length 0, request 1 a negative length, request 2 one past top-k
        degenerate = make_case(layout, 3, 1, 64, 64, lens=[0, -5, 65], seed=4)
        check(f"{layout}-lens-0-neg-past", degenerate, split=False)
        check(f"{layout}-lens-0-neg-past-split", degenerate, split=True)
        q, cache, idx, lens, sink = make_case(layout, 2, 2, 64, 64, lens=[64, 64], seed=5)
        idx[0, 1] = -1  # one query token with no valid slot
        idx[1] = torch.tensor([-1, 2**31 - 1, -2**31, 8 * 16] * 16, dtype=torch.int32)
        check(f"{layout}-all-invalid-rows", (q, cache, idx, lens, sink), split=False)
        check(f"{layout}-all-invalid-rows-split", (q, cache, idx, lens, sink), split=True)
        # Tokenless rows keep out 0 whatever the sink: NaN, +inf and -inf sinks.
        q, cache, idx, lens, sink = make_case(layout, 1, 1, 64, 64, seed=8)
        idx.fill_(-1)
        sink = torch.tensor([float("nan"), float("inf"), float("-inf"), 3.0] * 16)
        check(f"{layout}-tokenless-nonfinite-sink", (q, cache, idx, lens, sink), split=False)
        check(f"{layout}-tokenless-nonfinite-sink-split", (q, cache, idx, lens, sink), split=True)
        padded = make_case(layout, 2, 1, 64, 96, lens=[96, 80], seed=6, pad=48)
        check(f"{layout}-padded-pages", padded, split=False)
        check(f"{layout}-padded-pages-split", padded, split=True)
        q, cache, idx, lens, sink = make_case(layout, 1, 1, 64, 16, seed=7)
        check(f"{layout}-topk0", (q, cache, idx[:, :, :0], lens, sink), split=False)
        check(f"{layout}-empty-cache", (q, cache[:0], idx, lens, sink), split=False)
        check(f"{layout}-triton_op", case, via_op=True)
        # One token a row with weight 1: the output is the kernel's dequantised V, bit for bit the reference's.
        q, cache, idx = make_code_sweep(layout, tokens=16)
        out = torch.full((16, 1, 64, 512), float("nan"), dtype=torch.bfloat16)
        lse = torch.full((16, 64, 1), float("nan"), dtype=torch.float32)
        m.launch(q, cache, idx, 0.04, layout, None, None, split=False, out=out, lse=lse)
        results[f"{layout}-dequant-bitwise"] = code_sweep_mismatch(out, lse, cache, layout) or "ok"
    print("RESULTS " + json.dumps(results))
    """
).replace("TESTS_DIR", repr(TESTS_DIR))

_PER_LAYOUT = ["single", "split", "split3", "heuristic", "nolens-nosink", "nolens-nosink-split", "h128", "h128-split",
               "lens-0-neg-past", "lens-0-neg-past-split", "all-invalid-rows", "all-invalid-rows-split",
               "tokenless-nonfinite-sink", "tokenless-nonfinite-sink-split", "padded-pages", "padded-pages-split",
               "topk0", "empty-cache", "triton_op", "dequant-bitwise"]
CASES = [f"{layout}-{c}" for layout in ("v32", "v4") for c in _PER_LAYOUT]


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT, timeout=900)


@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_oracle(interpreted, case):
    assert interpreted.get(case) == "ok", f"{case}: {interpreted.get(case, 'not run')}"


def test_every_case_reported(interpreted):
    assert sorted(interpreted) == sorted(CASES)
