"""The Triton indexer_logits and paged_indexer_logits kernels under TRITON_INTERPRET=1, vs the references.

Like test_triton_interpret.py, the cases run in one subprocess that sets TRITON_INTERPRET=1 before
Triton is imported (plus tests/_triton_interpreter_compat.py, two test-only interpreter fixes); each
case reports back and is its own test here. Tolerance: |out - ref| <= 1e-5 * ||ref row||_2 on the
visible entries, and exactly -inf (same positions as the reference) outside the windows.
"""

from __future__ import annotations

import os
import textwrap

import pytest
from triton_interpret_runner import run_interpreted

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent(
    r"""
    import json, os, sys
    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.path.insert(0, HERE)
    import _triton_interpreter_compat  # noqa: F401
    import torch
    import dsa_ops  # noqa: F401  (defines torch.ops.dsa and registers the providers)
    from dsa_ops.backends.triton import indexer_logits as il, paged_indexer_logits as pil
    from dsa_ops.ops.indexer_logits import reference as ref_dense
    from dsa_ops.ops.paged_indexer_logits import reference as ref_paged

    g = torch.Generator().manual_seed(4321)
    FP8 = torch.float8_e4m3fn
    POISON = 12345.0

    def compare(out, ref, clean=True):
        if out.shape != ref.shape:
            return f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
        vis = torch.isfinite(ref)
        if clean:
            if not torch.equal(out[~vis], ref[~vis]):
                bad = ((out != ref) & ~vis).nonzero()[:5].tolist()
                return f"outside the windows: not -inf at {bad}"
        if not torch.isfinite(out[vis]).all():
            return "non-finite value inside a window"
        norm = torch.where(vis, ref, 0).double().norm(dim=1, keepdim=True)
        err = torch.where(vis, (out.double() - ref.double()).abs(), 0)
        worst = (err - 1e-5 * norm).max().item() if out.numel() else 0
        if worst > 0:
            r = (err - 1e-5 * norm).amax(dim=1).argmax().item()
            return f"row {r}: max err {err[r].max().item():.3g} > 1e-5 * row norm {norm[r].item():.3g}"
        return "ok"

    def dense_inputs(t, n, h, dtype, windows, wt_noncontig):
        d = 128
        q = (torch.randn(t, h, d, generator=g) * 2).to(dtype)
        kv = (torch.randn(n, d, generator=g) * 2).to(dtype)
        s = (torch.rand(n, generator=g) + 0.25) if dtype == FP8 else None
        if wt_noncontig:  # weights as the transpose of an [H, T] buffer: strides (1, T)
            w = torch.randn(h, t, generator=g).t()
        else:
            w = torch.randn(t, h, generator=g)
        if windows == "full":
            ks = torch.zeros(t, dtype=torch.int32)
            ke = torch.full((t,), n, dtype=torch.int32)
        elif windows == "causal":
            ks = torch.zeros(t, dtype=torch.int32)
            ke = (n - t + torch.arange(t) + 1).to(torch.int32)
        else:  # hostile: negative, past N, empty, inverted, full, single key, beyond int range of N
            ks = torch.randint(-2 * n, 2 * n, (t,), generator=g, dtype=torch.int32)
            ke = torch.randint(-2 * n, 2 * n, (t,), generator=g, dtype=torch.int32)
            fixed = [(-5, n + 7), (0, n), (3, 3), (n, n + 10), (-10, -1), (7, 2), (n - 1, n), (0, 1),
                     (-(2**31), 2**31 - 1), (n // 2, n // 2 + 65)]
            for i, (a, b) in enumerate(fixed[:t]):
                ks[i], ke[i] = a, b
        return q, kv, s, w, ks, ke

    results = {}

    def dense_case(name, t, n, h, dtype, windows, wt_noncontig=False, clean=True, via_op=False,
                   strided_q=False, fp8_mma=None, neg_scales=False):
        q, kv, s, w, ks, ke = dense_inputs(t, n, h, dtype, windows, wt_noncontig)
        if neg_scales:  # both signs, +0.0 and -0.0: relu applies to dot * scale
            s = s * torch.where(torch.arange(n) % 3 == 0, -1.0, 1.0)
            s[7::50] = 0.0
            s[5::50] = -0.0
        if strided_q:  # q rows padded: stride(0) = (H + 2) * D, heads of stride D
            big = torch.zeros(t, h + 2, 128, dtype=torch.float32).to(dtype)
            big[:, 1:h + 1] = q
            q = big[:, 1:h + 1]
        ref = ref_dense(q, kv, s, w, ks, ke, True)
        if via_op:
            out = torch.ops.dsa_triton.indexer_logits(q, kv, s, w, ks, ke, clean)
        else:
            out = torch.full((t, n), POISON)
            il.launch(q, kv, s, w, ks, ke, clean, out=out, fp8_mma=fp8_mma)
        results[name] = compare(out, ref, clean)

    # T, N not multiples of the tiles; several row tiles and several key tiles (and key splits).
    for dt, dn in ((FP8, "fp8"), (torch.bfloat16, "bf16")):
        for h in (32, 64):
            for windows in ("full", "causal", "hostile"):
                dense_case(f"dense-{dn}-h{h}-{windows}", 11, 150, h, dt, windows)
    dense_case("dense-fp8-h64-weights-noncontig", 7, 100, 64, FP8, "hostile", wt_noncontig=True)
    dense_case("dense-bf16-h32-weights-noncontig", 9, 70, 32, torch.bfloat16, "causal", wt_noncontig=True)
    dense_case("dense-fp8-h64-q-strided", 5, 90, 64, FP8, "hostile", strided_q=True)
    dense_case("dense-fp8-h64-unclean", 6, 130, 64, FP8, "hostile", clean=False)
    dense_case("dense-fp8-h64-triton_op", 5, 80, 64, FP8, "hostile", via_op=True)
    dense_case("dense-fp8-h64-one-row", 1, 65, 64, FP8, "full")
    dense_case("dense-fp8-h16", 6, 70, 16, FP8, "hostile")
    dense_case("dense-fp8-h64-fp8mma", 11, 150, 64, FP8, "hostile", fp8_mma=True)
    # kv widened to fp16 once before the kernel (the launcher does it from WIDEN_MIN_HEAD_ROWS up).
    il.WIDEN_MIN_HEAD_ROWS = 0
    dense_case("dense-fp8-h64-widened-hostile", 11, 300, 64, FP8, "hostile")
    dense_case("dense-fp8-h32-widened-causal", 13, 150, 32, FP8, "causal", wt_noncontig=True)
    dense_case("dense-fp8-h64-widened-triton_op", 5, 80, 64, FP8, "hostile", via_op=True)
    dense_case("dense-fp8-h64-widened-neg-scales", 9, 200, 64, FP8, "full", neg_scales=True)
    il.WIDEN_MIN_HEAD_ROWS = 1 << 62
    dense_case("dense-fp8-h64-neg-scales", 9, 200, 64, FP8, "full", neg_scales=True)

    # ---- paged -----------------------------------------------------------------------------------
    def make_cache(nb, d=128, pad=0):
        vals = (torch.randn(nb, 64, d, generator=g) * 2).to(FP8).view(torch.uint8).reshape(nb, -1)
        sc = (torch.rand(nb, 64, generator=g) + 0.25).view(torch.uint8).reshape(nb, -1)
        raw = torch.cat([vals, sc, torch.zeros(nb, pad, dtype=torch.uint8)], 1)
        if pad:  # padded pages: a view whose stride(0) exceeds 64 * (D + 4)
            return raw[:, : 64 * (d + 4)].view(nb, 64, 1, d + 4)
        return raw.reshape(nb, 64, 1, d + 4)

    def paged_case(name, b, next_n, h, ctx, table, nb, L, pad=0, via_op=False, clean=True, fp8_mma=None):
        q = (torch.randn(b, next_n, h, 128, generator=g) * 2).to(FP8)
        cache = make_cache(nb, pad=pad)
        w = torch.randn(b * next_n, h, generator=g)
        ctx = torch.tensor(ctx, dtype=torch.int32)
        table = torch.tensor(table, dtype=torch.int32)
        ref = ref_paged(q, cache, w, ctx, table, L, True)
        if via_op:
            out = torch.ops.dsa_triton.paged_indexer_logits(q, cache, w, ctx, table, L, clean)
        else:
            out = torch.full((b * next_n, L), POISON)
            pil.launch(q, cache, w, ctx, table, L, clean, out=out, fp8_mma=fp8_mma)
        results[name] = compare(out, ref, clean)

    # hostile tables: negative ids, ids past the cache, context past the table, negative context
    tbl = [[0, 1, 2, 3], [4, -1, 7, 2], [5, 100, 1, -7]]
    paged_case("paged-n1-h64", 3, 1, 64, [130, -3, 500], tbl, 6, 200)
    paged_case("paged-n2-h64", 3, 2, 64, [130, 1, 250], tbl, 6, 260)
    paged_case("paged-n3-h32", 3, 3, 32, [64, 190, 2], tbl, 6, 150)
    paged_case("paged-n4-h64", 2, 4, 64, [256, 100], tbl[:2], 6, 256)
    paged_case("paged-n1-h64-padded-pages", 2, 1, 64, [200, 90], tbl[:2], 8, 210, pad=48)
    paged_case("paged-n1-h64-L-past-table", 2, 1, 64, [400, 300], [[0, 1], [2, 3]], 4, 300)
    paged_case("paged-n2-h64-unclean", 3, 2, 64, [130, 1, 250], tbl, 6, 260, clean=False)
    paged_case("paged-n1-h64-triton_op", 3, 1, 64, [130, -3, 500], tbl, 6, 200, via_op=True)
    paged_case("paged-n2-h64-fp8mma", 3, 2, 64, [130, 1, 250], tbl, 6, 260, fp8_mma=True)
    print("RESULTS " + json.dumps(results))
    """
).replace("HERE", repr(HERE))

CASES = (
    [f"dense-{dn}-h{h}-{w}" for dn in ("fp8", "bf16") for h in (32, 64)
     for w in ("full", "causal", "hostile")]
    + ["dense-fp8-h64-weights-noncontig", "dense-bf16-h32-weights-noncontig", "dense-fp8-h64-q-strided",
       "dense-fp8-h64-unclean", "dense-fp8-h64-triton_op", "dense-fp8-h64-one-row", "dense-fp8-h16",
       "dense-fp8-h64-fp8mma", "dense-fp8-h64-widened-hostile", "dense-fp8-h32-widened-causal",
       "dense-fp8-h64-widened-triton_op", "dense-fp8-h64-widened-neg-scales", "dense-fp8-h64-neg-scales"]
    + ["paged-n1-h64", "paged-n2-h64", "paged-n3-h32", "paged-n4-h64", "paged-n1-h64-padded-pages",
       "paged-n1-h64-L-past-table", "paged-n2-h64-unclean", "paged-n1-h64-triton_op", "paged-n2-h64-fp8mma"]
)


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT, timeout=900)


@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference(interpreted, case):
    assert interpreted.get(case) == "ok", f"{case}: {interpreted.get(case, 'not run')}"


def test_every_case_ran(interpreted):
    assert sorted(interpreted) == sorted(CASES)


@pytest.mark.parametrize("op", ["indexer_logits", "paged_indexer_logits"])
def test_provider_registered(op):
    pytest.importorskip("triton")
    import torch
    from dsa_ops import registry

    p = registry.providers(op)["triton"]
    assert p.available(torch.device("cpu")) is not None
    assert p.available(torch.device("cuda")) is None
    assert hasattr(torch.ops.dsa_triton, op)


def test_split_count_and_configs():
    pytest.importorskip("triton")
    from dsa_ops.backends.triton import indexer_logits as il

    assert il.split_count(2048, 1024, 132) == 1  # rows alone fill the GPU
    assert il.split_count(1, 1024, 132) == 264
    assert il.split_count(1, 3, 132) == 3  # never more splits than key tiles
    for table in (il._CONFIGS, il._CONFIGS_16BIT):
        for h, (bt, bn, _nw, _ns) in table.items():
            assert bt * h <= 256 and bn in (64, 128)
