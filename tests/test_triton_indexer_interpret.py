"""The Triton indexer_logits and paged_indexer_logits kernels under TRITON_INTERPRET=1, vs the references.

Like test_triton_interpret.py, the cases run in one subprocess that sets TRITON_INTERPRET=1 before
Triton is imported (plus tests/_triton_interpreter_compat.py, two test-only interpreter fixes); each
case reports back and is its own test here. Tolerance, by the op's precision mode: precise=True (and
bf16 operands) |out - ref| <= 1e-5 * ||ref row||_2 on the visible entries; precise=False (fp8 MMAs)
|out - ref| <= 1e-3 * max |ref row|. Outside the windows exactly -inf (the reference's positions).
The interpreter computes an fp8 dot in fp32 from the widened values, not with Hopper's ~14-bit MMA
accumulation: the default-mode cases check the fp8 path's data flow, windows and masks against its bound.
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

    def compare(out, ref, clean=True, precise=True):
        if out.shape != ref.shape:
            return f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
        vis = torch.isfinite(ref)
        if clean:
            if not torch.equal(out[~vis], ref[~vis]):
                bad = ((out != ref) & ~vis).nonzero()[:5].tolist()
                return f"outside the windows: not -inf at {bad}"
        if not torch.isfinite(out[vis]).all():
            return "non-finite value inside a window"
        if precise:
            tol, what = 1e-5, "row norm"
            norm = torch.where(vis, ref, 0).double().norm(dim=1, keepdim=True)
        else:
            tol, what = 1e-3, "row max |score|"
            norm = torch.where(vis, ref, 0).double().abs().amax(dim=1, keepdim=True) if out.numel() else None
        err = torch.where(vis, (out.double() - ref.double()).abs(), 0)
        worst = (err - tol * norm).max().item() if out.numel() else 0
        if worst > 0:
            r = (err - tol * norm).amax(dim=1).argmax().item()
            return f"row {r}: max err {err[r].max().item():.3g} > {tol} * {what} {norm[r].item():.3g}"
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
                   strided_q=False, precise=True, neg_scales=False):
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
            out = torch.ops.dsa_triton.indexer_logits(q, kv, s, w, ks, ke, clean, precise)
        else:
            out = torch.full((t, n), POISON)
            il.launch(q, kv, s, w, ks, ke, clean, precise, out=out)
        results[name] = compare(out, ref, clean, precise or dtype != FP8)

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
    # The default mode (precise=False): fp8 MMAs.
    dense_case("dense-fp8-h64-default-hostile", 11, 150, 64, FP8, "hostile", precise=False)
    dense_case("dense-fp8-h32-default-causal", 13, 150, 32, FP8, "causal", precise=False, wt_noncontig=True)
    dense_case("dense-fp8-h64-default-neg-scales", 9, 200, 64, FP8, "full", precise=False, neg_scales=True)
    dense_case("dense-fp8-h64-default-unclean", 6, 130, 64, FP8, "hostile", precise=False, clean=False)
    dense_case("dense-fp8-h64-default-triton_op", 5, 80, 64, FP8, "hostile", precise=False, via_op=True)
    dense_case("dense-bf16-h64-default-hostile", 11, 150, 64, torch.bfloat16, "hostile", precise=False)
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

    def paged_case(name, b, next_n, h, ctx, table, nb, L, pad=0, via_op=False, clean=True, precise=True):
        q = (torch.randn(b, next_n, h, 128, generator=g) * 2).to(FP8)
        cache = make_cache(nb, pad=pad)
        w = torch.randn(b * next_n, h, generator=g)
        ctx = torch.tensor(ctx, dtype=torch.int32)
        table = torch.tensor(table, dtype=torch.int32)
        ref = ref_paged(q, cache, w, ctx, table, L, True)
        if via_op:
            out = torch.ops.dsa_triton.paged_indexer_logits(q, cache, w, ctx, table, L, clean, precise)
        else:
            out = torch.full((b * next_n, L), POISON)
            pil.launch(q, cache, w, ctx, table, L, clean, precise, out=out)
        results[name] = compare(out, ref, clean, precise)

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
    paged_case("paged-n2-h64-default", 3, 2, 64, [130, 1, 250], tbl, 6, 260, precise=False)
    paged_case("paged-n1-h64-default-padded-pages", 2, 1, 64, [200, 90], tbl[:2], 8, 210, pad=48, precise=False)
    paged_case("paged-n3-h32-default-triton_op", 3, 3, 32, [64, 190, 2], tbl, 6, 150, via_op=True, precise=False)
    print("RESULTS " + json.dumps(results))
    """
).replace("HERE", repr(HERE))

CASES = (
    [f"dense-{dn}-h{h}-{w}" for dn in ("fp8", "bf16") for h in (32, 64)
     for w in ("full", "causal", "hostile")]
    + ["dense-fp8-h64-weights-noncontig", "dense-bf16-h32-weights-noncontig", "dense-fp8-h64-q-strided",
       "dense-fp8-h64-unclean", "dense-fp8-h64-triton_op", "dense-fp8-h64-one-row", "dense-fp8-h16",
       "dense-fp8-h64-default-hostile", "dense-fp8-h32-default-causal", "dense-fp8-h64-default-neg-scales",
       "dense-fp8-h64-default-unclean", "dense-fp8-h64-default-triton_op", "dense-bf16-h64-default-hostile",
       "dense-fp8-h64-widened-hostile", "dense-fp8-h32-widened-causal",
       "dense-fp8-h64-widened-triton_op", "dense-fp8-h64-widened-neg-scales", "dense-fp8-h64-neg-scales"]
    + ["paged-n1-h64", "paged-n2-h64", "paged-n3-h32", "paged-n4-h64", "paged-n1-h64-padded-pages",
       "paged-n1-h64-L-past-table", "paged-n2-h64-unclean", "paged-n1-h64-triton_op", "paged-n2-h64-default",
       "paged-n1-h64-default-padded-pages", "paged-n3-h32-default-triton_op"]
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


class _Recorder:
    """Stands in for a jitted kernel through launch(..., wrap=): records each launch's keyword arguments."""

    def __init__(self, log):
        self.log = log

    def __call__(self, kernel):
        rec = self

        class Launch:
            def __getitem__(self, grid):
                return lambda *a, **kw: rec.log.append((kernel.__name__, kw))

        return Launch()


@pytest.mark.parametrize("precise", [False, True])
@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
def test_launch_picks_the_mma_by_precise(precise, dtype):
    """The op's `precise` is the only switch: fp8 operands get fp8 MMAs unless precise (bf16: bf16 MMAs)."""
    pytest.importorskip("triton")
    import torch
    from dsa_ops.backends.triton import indexer_logits as il
    from dsa_ops.backends.triton import paged_indexer_logits as pil

    fp8 = dtype == "fp8"
    dt = torch.float8_e4m3fn if fp8 else torch.bfloat16
    t, n, h = 128, 256, 64  # 8192 (row, head) pairs: the exact path widens kv once
    q, kv = torch.zeros(t, h, 128, dtype=dt), torch.zeros(n, 128, dtype=dt)
    s = torch.ones(n) if fp8 else None
    w, ks = torch.zeros(t, h), torch.zeros(t, dtype=torch.int32)
    log = []
    il.launch(q, kv, s, w, ks, ks, True, precise, wrap=_Recorder(log))
    names = [name for name, _ in log]
    kw = log[-1][1]
    assert names[-1] == "indexer_logits_kernel" and kw["F16_MMA"] == (fp8 and precise)
    assert (names[0] == "widen_kv_kernel") == (fp8 and precise) and kw["SIGNS_IN_KV"] == (fp8 and precise)
    if fp8:
        log.clear()
        cache = torch.zeros(4, 64, 1, 132, dtype=torch.uint8)
        one = torch.ones(1, dtype=torch.int32)
        pil.launch(q[:1].view(1, 1, h, 128), cache, w[:1], one, one.view(1, 1), 64, True, precise,
                   wrap=_Recorder(log))
        assert [name for name, _ in log] == ["paged_indexer_logits_kernel"] and log[0][1]["F16_MMA"] == precise


def test_paged_supports_declines_a_cache_not_4_byte_aligned():
    """The kernel loads each block's fp32 scales as fp32: a cache view starting off a 4-byte boundary (or with
    such a block stride) is declined with a reason, not read misaligned."""
    pytest.importorskip("triton")
    import torch
    from dsa_ops.backends.triton import paged_indexer_logits as pil

    q = torch.zeros(1, 1, 64, 128, dtype=torch.float8_e4m3fn)
    w, one = torch.zeros(1, 64), torch.ones(1, dtype=torch.int32)
    raw = torch.zeros(4 * 64 * 132 + 4, dtype=torch.uint8)
    args = (q, None, w, one, one.view(1, 1), 64, True, False)
    for offset, why in ((0, None), (4, None), (1, "not 4-byte aligned"), (2, "not 4-byte aligned")):
        cache = raw[offset:offset + 4 * 64 * 132].view(4, 64, 1, 132)
        reason = pil.supports(args[0], cache, *args[2:])
        assert (reason is None) if why is None else (reason is not None and why in reason), (offset, reason)
