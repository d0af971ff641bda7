"""The Triton page_table_transform kernel on CPU tensors under TRITON_INTERPRET=1, against the reference.

TRITON_INTERPRET must be set before the kernel is defined (triton.jit reads it then), so the cases run
in one subprocess that imports dsa_ops with it set; each case reports back and is its own test here.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from triton_interpret_runner import run_interpreted

SCRIPT = textwrap.dedent(
    r"""
    import json, os, sys
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    from dsa_ops.backends.triton import page_table_transform as m
    from dsa_ops.ops._common import map_through_page_table

    g = torch.Generator().manual_seed(1234)
    POISON = 0x5A5A5A5A

    def ints(lo, hi, shape):
        return torch.randint(lo, hi, shape, dtype=torch.int32, generator=g)

    def hostile(rows, k, nb, max_pages, page_size, with_maps):
        # Indices: -1, other negatives, in range, past the table and near INT32_MAX.
        span = max_pages * page_size
        idx = ints(-3, span + 2 * page_size + 1, (rows, k))
        idx[ints(0, 5, (rows, k)) == 0] = -1
        idx.view(-1)[::13] = 2**31 - 1
        # Page entries: negatives, small, and large enough that page * P + i % P leaves int32.
        big = (2**31 - 1) // page_size
        pt_wide = ints(-2, 50, (nb, max_pages + 3))
        pt_wide[ints(0, 4, (nb, max_pages + 3)) == 0] = big
        pt_wide[ints(0, 6, (nb, max_pages + 3)) == 0] = min(big + 1, 2**31 - 1)  # overflows when P > 1
        pt = pt_wide[:, :max_pages]  # row stride != width: the kernel must honour stride(0)
        r2b = ps = None
        if with_maps:
            r2b = ints(-2, nb + 3, (rows,))  # batch rows outside [0, nb)
            ps = ints(-2, max_pages + 2, (rows,))  # starts that push slots outside [0, max_pages)
        return idx, pt, r2b, ps

    def check(name, idx, pt, r2b, ps, page_size, inplace=False, direct_index_64=False, via_op=False):
        ref = map_through_page_table(idx, pt, r2b, ps, page_size)
        src = idx.clone()
        if inplace:
            out = src
        else:
            out = torch.full_like(idx, POISON)
        if direct_index_64:  # the >2**31-element code path, forced on a small tensor
            numel = idx.numel()
            m.page_table_transform_kernel[(-(-numel // m.BLOCK),)](
                src, pt, r2b if r2b is not None else src, ps if ps is not None else src, out,
                numel, idx.shape[1], pt.shape[0], pt.shape[1], pt.stride(0), page_size.bit_length() - 1,
                HAS_ROW_TO_BATCH=r2b is not None, HAS_ROW_STARTS=ps is not None, INDEX_64=True, BLOCK=m.BLOCK)
        elif via_op:
            torch.ops.dsa_triton.page_table_transform_out(src, pt, r2b, ps, page_size, out)
        else:
            m.launch(src, pt, r2b, ps, page_size, out)
        if not inplace and not torch.equal(src, idx):
            return "indices were modified"
        if not torch.equal(out, ref):
            bad = (out != ref).nonzero()[:5].tolist()
            got = [out[r, c].item() for r, c in bad]
            want = [ref[r, c].item() for r, c in bad]
            return f"mismatch at {bad}: got {got}, want {want}"
        return "ok"

    results = {}
    for k in (1, 3, 5):
        for page_size in (1, 64):
            for with_maps in (False, True):
                for inplace in (False, True):
                    maps = "maps" if with_maps else "nomaps"
                    name = f"k{k}-P{page_size}-{maps}-{'inplace' if inplace else 'out'}"
                    # > BLOCK elements so several programs run, including a ragged last one
                    rows = 1100 // k + 3
                    args = hostile(rows, k, nb=4, max_pages=6, page_size=page_size, with_maps=with_maps)
                    results[name] = check(name, *args, page_size, inplace=inplace)

    args = hostile(40, 5, nb=3, max_pages=4, page_size=64, with_maps=True)
    results["index64-path"] = check("index64-path", *args, 64, direct_index_64=True)
    results["triton_op"] = check("triton_op", *args, 64, via_op=True)
    results["triton_op-inplace"] = check("triton_op-inplace", *args, 64, inplace=True, via_op=True)
    # Degenerate tables: nothing may be read, everything is -1.
    idx = ints(-1, 100, (9, 3))
    empty = lambda *shape: torch.zeros(shape, dtype=torch.int32)
    results["empty-table-rows"] = check("e1", idx, empty(0, 4), None, None, 64)
    results["empty-table-cols"] = check("e2", idx, empty(3, 0), None, None, 64)
    results["no-rows"] = check("e3", empty(0, 4), ints(0, 9, (2, 3)), None, None, 64)
    # Exact values at the int32 edge: page * P + i % P == INT32_MAX is kept, one more is -1.
    P = 64
    pt = torch.tensor([[(2**31 - 1) // P, 2**31 // P]], dtype=torch.int32)
    idx = torch.tensor([[P - 1, 0, P - 2, P + 0, -1]], dtype=torch.int32)
    results["int32-edge"] = check("edge", idx, pt, None, None, P)
    print("RESULTS " + json.dumps(results))
    """
)

CASES = [
    f"k{k}-P{p}-{maps}-{mode}"
    for k in (1, 3, 5) for p in (1, 64) for maps in ("nomaps", "maps") for mode in ("out", "inplace")
] + ["index64-path", "triton_op", "triton_op-inplace", "empty-table-rows", "empty-table-cols", "no-rows",
     "int32-edge"]


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT, timeout=600)


@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference(interpreted, case):
    assert interpreted.get(case) == "ok", f"{case}: {interpreted.get(case, 'not run')}"


def test_every_case_ran(interpreted):
    assert sorted(interpreted) == sorted(CASES)


def test_provider_registered():
    pytest.importorskip("triton")
    import torch
    from dsa_ops import registry

    p = registry.providers("page_table_transform")["triton"]
    assert p.available(torch.device("cpu")) is not None  # a reason, not None
    assert p.available(torch.device("cuda")) is None
    assert hasattr(torch.ops.dsa_triton, "page_table_transform_out")


def test_import_without_triton():
    """A machine without Triton still imports dsa_ops; the provider says why it cannot run."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["triton"] = None  # makes `import triton` raise ImportError
        import torch, dsa_ops
        from dsa_ops import registry
        import dsa_ops.backends.triton as tb
        p = registry.providers("page_table_transform")["triton"]
        why = p.available(torch.device("cuda"))
        assert why and "triton" in why, why
        assert tb.GATE_KERNELS == [] and tb.IMPORT_ERROR
        print("OK", why)
        """
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "OK" in p.stdout, p.stdout + p.stderr
