"""The Triton dequant_k_cache_paged kernel on CPU tensors under TRITON_INTERPRET=1, bitwise against the reference.

Small caches of random bytes (tests/dequant_cases.py): e4m3 NaN codes, subnormals, NaN / inf / subnormal
fp32 scales, every ue8m0 byte 0..255, NaN rope payloads; pages packed, padded (stride 16-aligned and
not) and starting off a 16-byte boundary; slots -1, INT_MIN, INT_MAX, the slot count and past it, a
tail shorter than TOKENS; TOKENS 1, 2, 4, 8; an empty slot list, an empty cache, a one-page cache with a
stray stride(0); the triton_op. Outputs are NaN-poisoned before each call.
"""

from __future__ import annotations

import os
import textwrap

from triton_interpret_runner import run_interpreted

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent(
    r"""
    import json, os, sys
    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.path.insert(0, TESTS_DIR)
    import _triton_interpreter_compat  # noqa: F401
    import numpy as np
    import torch
    import triton.language as tl
    import triton.runtime.interpreter as ti
    import dsa_ops
    from dsa_ops.backends.triton import dequant_k_cache_paged as m
    from dsa_ops.ops.dequant_k_cache_paged import dequant_slots
    from dequant_cases import bit_mismatch, make_cache, make_slots, poisoned_out

    # The interpreter widens e4m3 0x7f / 0xff to +-480 where the GPU (and torch) give NaN: test only.
    _fp_to_fp = ti.InterpreterBuilder.create_fp_to_fp

    def _e4m3_nan(self, src, dst_type, rounding_mode):
        r = _fp_to_fp(self, src, dst_type, rounding_mode)
        if src.dtype.scalar == tl.float8e4nv and dst_type.scalar == tl.float32:
            nan = (src.data & 0x7F) == 0x7F
            r = ti.TensorHandle(np.where(nan, np.float32("nan"), r.data.view(np.float32)), tl.float32)
        return r

    ti.InterpreterBuilder.create_fp_to_fp = _e4m3_nan

    results = {}

    def check(name, cache, slots, layout, tokens=None, via_op=False):
        m.CONFIG_OVERRIDE = None if tokens is None else {"tokens": tokens}
        try:
            if via_op:
                out = torch.ops.dsa_triton.dequant_k_cache_paged(cache, slots, layout)
            else:
                out = poisoned_out(slots.shape[0], layout)
                got = m.launch(cache, slots, layout, out=out)
                assert got is out
        except Exception as e:  # noqa: BLE001
            results[name] = f"raised {type(e).__name__}: {e}"
            return
        finally:
            m.CONFIG_OVERRIDE = None
        results[name] = bit_mismatch(out, dequant_slots(cache, slots, layout)) or "ok"

    for layout in ("v32", "v4"):
        nb, p = 6, 16
        for pad, offset in ((0, 0), (48, 16), (40, 0), (3, 5)):
            cache = make_cache(layout, nb, p, pad=pad, offset=offset, seed=pad)
            slots = make_slots(nb, p, 61, seed=pad)
            for tokens in (1, 2, 4, 8):
                check(f"{layout}-pad{pad}-off{offset}-tokens{tokens}", cache, slots, layout, tokens)
        cache = make_cache(layout, nb, p, seed=7)
        every = torch.randperm(nb * p, generator=torch.Generator().manual_seed(7)).to(torch.int32)
        check(f"{layout}-every-token", cache, every, layout)  # every ue8m0 byte meets the kernel
        check(f"{layout}-no-slots", cache, every[:0], layout)
        check(f"{layout}-all-invalid", cache, torch.tensor([-1, -2**31, 2**31 - 1, nb * p], dtype=torch.int32),
              layout)
        check(f"{layout}-empty-cache", cache[:0], make_slots(nb, p, 9), layout)
        one = make_cache(layout, 1, p, seed=8).as_strided((1, p, 1, cache.shape[3]), (12345, cache.shape[3],
                                                                                     cache.shape[3], 1))
        check(f"{layout}-one-page-stray-stride", one, make_slots(1, p, 21, seed=8), layout)
        check(f"{layout}-odd-page-size", make_cache(layout, 3, 5, seed=9), make_slots(3, 5, 19, seed=9), layout)
        check(f"{layout}-triton_op", cache, make_slots(nb, p, 29, seed=10), layout, via_op=True)
    print("RESULTS " + json.dumps(results))
    """
).replace("TESTS_DIR", repr(TESTS_DIR))


def test_dequant_k_cache_paged_interpreted():
    results = run_interpreted(SCRIPT, timeout=900)
    bad = {k: v for k, v in results.items() if v != "ok"}
    assert len(results) == 2 * (16 + 7) and not bad, bad
