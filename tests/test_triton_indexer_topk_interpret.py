"""The fused Triton indexer_topk path under TRITON_INTERPRET=1, against the exact top-k of the Triton
indexer_logits scores (the dense route's oracle: the same arithmetic, so the sets must be equal and the
returned scores bitwise equal) and against the op's reference as sets.

Small sizes (SAMPLE patched to 64 keys so the strided sample is sparse at a few hundred keys). Data:
random, clustered runs of high keys, periodic high keys at the sample stride (resonance) and at 64,
all-equal rows, mostly-zero rows, NaN keys (both NaN orders); slabs forced to overflow (tiny
capacity) and gates forced to pass fewer than k keys (tiny PASS_FACTOR), both of which the rescan must
finish exactly; with and without the page table; windows shorter than k, empty and clipped. exact=False
with an underfilled gate returns a subset of the true top-k.
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
    import dsa_ops  # noqa: F401
    from dsa_ops.backends.triton import indexer_logits as il, indexer_topk as it
    from dsa_ops.ops._common import map_through_page_table, window_topk
    from dsa_ops.ops.indexer_topk import reference

    FP8 = torch.float8_e4m3fn
    it.SAMPLE = 64
    T, N, H, D, K = 6, 640, 16, 64, 16

    def inputs(kind, dtype, seed):
        g = torch.Generator().manual_seed(seed)
        q = (torch.randn(T, H, D, generator=g) * 2).to(dtype)
        kv = (torch.randn(N, D, generator=g) * 2).to(dtype)
        s = torch.rand(N, generator=g) + 0.25
        w = torch.randn(T, H, generator=g)
        boost = torch.ones(N)
        if kind == "clustered":  # runs of 24 high keys
            for start in (37, 300, 301 + 24, 600):
                boost[start:start + 24] = 16.0
            w = w.abs()
        elif kind == "periodic_stride":  # high keys at the sample stride of the full hull: resonance
            stride = -(-N // it.SAMPLE)
            stride += 1 - stride % 2
            boost[::stride] = 16.0
            w = w.abs()
        elif kind == "periodic_64":
            boost[5::64] = 16.0
            w = w.abs()
        elif kind == "all_equal":
            kv = kv[:1].expand(N, D).contiguous()
            s = torch.full((N,), 0.5)
            w = w.abs()
        elif kind == "mostly_zero":  # scale 0 but at 5 keys a row of zeros tied
            boost = torch.zeros(N)
            boost[torch.randperm(N, generator=g)[:5]] = 1.0
        elif kind == "nan_scales":
            s[torch.randperm(N, generator=g)[:9]] = float("nan")
        elif kind == "nan_rows":  # a NaN weight makes every score of rows 1 and 5 NaN: all tied
            w[1, 3] = w[5, 0] = float("nan")
        if dtype == FP8:
            s = s * boost
        else:
            kv = (kv.float() * boost[:, None]).to(dtype)
            s = None
        ks = torch.tensor([0, -7, 40, 100, 0, 320], dtype=torch.int32)
        ke = torch.tensor([N, N + 9, 52, 99, 5, N], dtype=torch.int32)  # 640 keys, 640, 12 < K, empty, 5, 320
        pages = -(-N // 64) + 2
        pt = torch.randperm(T * pages * 2, generator=g)[: T * pages].view(T, pages).int()
        return q, kv, s, w, ks, ke, pt

    def as_sets(x):
        return torch.sort(torch.where(x < 0, torch.full_like(x, 2**31 - 1), x), dim=1).values

    def check(kind, dtype, precise, paged, nan_first=False, exact=True, seed=0):
        q, kv, s, w, ks, ke, pt = inputs(kind, dtype, seed)
        page = pt if paged else None
        counts = torch.empty(T, dtype=torch.int32)
        out, sc = it.launch_fused(q, kv, s, w, ks, ke, K, exact, precise, page, 64, None, None, True, nan_first,
                                  counts=counts)
        logits = il.launch(q, kv, s, w, ks, ke, True, precise)
        rel = window_topk(logits, K, lengths=ke.long() - ks.long(), row_starts=ks, nan_first=nan_first)
        want = map_through_page_table(rel, pt, None, None, 64) if paged else rel
        if not exact:
            gw, go = as_sets(want), as_sets(out)
            for r in range(T):
                got_r = set(go[r][go[r] != 2**31 - 1].tolist())
                if not got_r <= set(gw[r].tolist()):
                    return f"exact=False row {r}: {sorted(got_r - set(gw[r].tolist()))[:5]} not in the top-k"
            return "ok"
        if not torch.equal(as_sets(out), as_sets(want)):
            bad = (as_sets(out) != as_sets(want)).any(1).nonzero().flatten().tolist()
            return f"rows {bad} differ from topk(indexer_logits) (counts {counts.tolist()})"
        # Scores: bitwise the logits at the picked keys, -inf at -1 slots, in the indices' order.
        if not paged:
            gcol = (out.long() + ks.long()[:, None]).clamp(0, N - 1)
            wsc = torch.where(out >= 0, logits.gather(1, gcol), torch.full_like(sc, float("-inf")))
            if not torch.equal(sc.view(torch.int32), wsc.view(torch.int32)):
                return "returned scores are not bitwise the logits of the returned keys"
        if kind == "nan_scales":  # the Triton indexer_logits scores a NaN-scale key relu(NaN) = 0, the reference NaN
            return "ok"
        ref, _ = reference(q, kv, s, w, ks, ke, K, True, precise, page, 64, None, None, False, nan_first)
        if not torch.equal(as_sets(out), as_sets(ref)):
            return "differs from the op reference (as sets)"
        return "ok"

    CASES = {
        "random_fp8": dict(kind="random", dtype=FP8, precise=False, paged=False),
        "random_fp8_precise_paged": dict(kind="random", dtype=FP8, precise=True, paged=True),
        "random_bf16_paged": dict(kind="random", dtype=torch.bfloat16, precise=False, paged=True),
        "clustered": dict(kind="clustered", dtype=FP8, precise=False, paged=False),
        "clustered_paged": dict(kind="clustered", dtype=FP8, precise=True, paged=True),
        "periodic_stride": dict(kind="periodic_stride", dtype=FP8, precise=False, paged=False),
        "periodic_64": dict(kind="periodic_64", dtype=FP8, precise=False, paged=True),
        "all_equal": dict(kind="all_equal", dtype=FP8, precise=False, paged=False),
        "all_equal_paged": dict(kind="all_equal", dtype=FP8, precise=True, paged=True),
        "mostly_zero": dict(kind="mostly_zero", dtype=FP8, precise=False, paged=False),
        "nan_last": dict(kind="nan_rows", dtype=FP8, precise=False, paged=False),
        "nan_first": dict(kind="nan_rows", dtype=FP8, precise=False, paged=True, nan_first=True),
        "nan_scales_first": dict(kind="nan_scales", dtype=FP8, precise=False, paged=False, nan_first=True),
    }
    results = {}
    for name, kw in CASES.items():
        try:
            results[name] = check(**kw)
        except Exception as e:  # noqa: BLE001
            results[name] = f"raised {type(e).__name__}: {e}"
    # Slabs of K slots: every long row overflows and is rescanned.
    it.CAPACITY_OVERRIDE = K
    for name in ("random", "clustered", "all_equal"):
        try:
            results[f"overflow_{name}"] = check(name, FP8, False, name == "clustered")
        except Exception as e:  # noqa: BLE001
            results[f"overflow_{name}"] = f"raised {type(e).__name__}: {e}"
    it.CAPACITY_OVERRIDE = None
    # Gates that pass about K / 8 keys: long rows come up short and are rescanned (or truncated).
    it.PASS_FACTOR = 0.125
    for name, kw in (("underfill_random", dict(kind="random", dtype=FP8, precise=False, paged=True)),
                     ("underfill_periodic", dict(kind="periodic_64", dtype=FP8, precise=True, paged=False)),
                     ("underfill_inexact", dict(kind="random", dtype=FP8, precise=False, paged=False, exact=False))):
        try:
            results[name] = check(**kw)
        except Exception as e:  # noqa: BLE001
            results[name] = f"raised {type(e).__name__}: {e}"
    # The rescan actually ran: counts show rows below K under the tiny gate.
    q, kv, s, w, ks, ke, pt = inputs("random", FP8, 0)
    counts = torch.empty(T, dtype=torch.int32)
    it.launch_fused(q, kv, s, w, ks, ke, K, True, False, counts=counts)
    results["underfill_counts"] = "ok" if (counts[:2] < K).any() else f"counts {counts.tolist()} not below K"
    it.PASS_FACTOR = 2.5
    # One key split per row tile: the filter's running-count emission (EMIT 2), also overflowing.
    split_count = il.split_count
    il.split_count = lambda *a: 1
    for name, kw in (("one_split_random", dict(kind="random", dtype=FP8, precise=False, paged=False)),
                     ("one_split_clustered", dict(kind="clustered", dtype=FP8, precise=True, paged=True))):
        try:
            results[name] = check(**kw)
        except Exception as e:  # noqa: BLE001
            results[name] = f"raised {type(e).__name__}: {e}"
    it.CAPACITY_OVERRIDE = K
    try:
        results["one_split_overflow"] = check("random", FP8, False, False)
    except Exception as e:  # noqa: BLE001
        results["one_split_overflow"] = f"raised {type(e).__name__}: {e}"
    it.CAPACITY_OVERRIDE = None
    il.split_count = split_count
    print("RESULTS " + json.dumps(results))
    """
).replace("HERE", repr(HERE))

CASES = ["random_fp8", "random_fp8_precise_paged", "random_bf16_paged", "clustered", "clustered_paged",
         "periodic_stride", "periodic_64", "all_equal", "all_equal_paged", "mostly_zero", "nan_last", "nan_first",
         "nan_scales_first", "overflow_random", "overflow_clustered", "overflow_all_equal", "underfill_random",
         "underfill_periodic", "underfill_inexact", "underfill_counts", "one_split_random", "one_split_clustered",
         "one_split_overflow"]


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT, timeout=900)


@pytest.mark.parametrize("case", CASES)
def test_fused_matches_dense(interpreted, case):
    assert interpreted.get(case) == "ok", f"{case}: {interpreted.get(case, 'not run')}"


def test_every_case_ran(interpreted):
    assert sorted(interpreted) == sorted(CASES)


def test_route_is_one_rule(monkeypatch):
    import torch
    from dsa_ops.backends.triton import indexer_topk as it

    q = torch.empty(4096, 64, 128, dtype=torch.float8_e4m3fn, device="meta")
    kv = torch.empty(131072, 128, dtype=torch.float8_e4m3fn, device="meta")
    assert it.FUSED_FASTER == ()  # measured slower than the dense route on every benchmark shape
    assert it.route(q, kv, None, None, None, None, 2048) == "dense"
    monkeypatch.setattr(it, "FUSED_FASTER", ((4096, 65536, 64),))
    monkeypatch.setattr(it, "_logits_backend", lambda *a: "triton")
    assert it.route(q, kv, None, None, None, None, 2048) == "fused"
    assert it.route(q[:4095], kv, None, None, None, None, 2048) == "dense"  # fewer rows than the region
    assert it.route(q, kv[:65535], None, None, None, None, 2048) == "dense"  # fewer keys
    assert it.route(q[:, :32], kv, None, None, None, None, 2048) == "dense"  # other heads
    assert it.route(q, kv, None, None, None, None, 8192) == "dense"  # slab past MAX_CAPACITY
    monkeypatch.setattr(it, "_logits_backend", lambda *a: "cuda")  # other arithmetic: not bitwise
    assert it.route(q, kv, None, None, None, None, 2048) == "dense"


def test_provider_registered():
    from dsa_ops import registry

    assert "triton" in registry.providers("indexer_topk")
