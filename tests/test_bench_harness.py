"""benchmarks/harness.py's device-free parts: the interleaved sampling behind Timer.graph_medians_us."""

from __future__ import annotations

import importlib.util
import pathlib

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "harness.py"
_spec = importlib.util.spec_from_file_location("bench_harness", _PATH)
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)


def test_interleaved_medians_take_turns_and_keep_each_samplers_own_median():
    calls = []

    def sampler(name, values):
        it = iter(values)

        def one():
            calls.append(name)
            return next(it)
        return one

    got = harness.interleaved_medians([sampler("a", [3, 1, 2]), sampler("b", [10, 30, 20])], iters=3)
    assert got == [2, 20]
    assert calls == ["a", "b"] * 3


def test_a_drift_shared_by_interleaved_samplers_leaves_their_ratio():
    # Both samplers slow down alike over the run (a clock drift of 0.1% a sample): interleaved, the ratio
    # of medians stays at 1.05; timed one after the other, it reads 1.13.
    clock = iter(1.0 + 0.001 * i for i in range(1000))
    plain, form = (lambda: 10.0 * next(clock)), (lambda: 10.5 * next(clock))
    a, b = harness.interleaved_medians([plain, form], iters=100)
    assert abs(b / a - 1.05) < 2e-3
    (a,), (b,) = harness.interleaved_medians([plain], iters=100), harness.interleaved_medians([form], iters=100)
    assert b / a > 1.12


def test_host_overheads_take_batches_in_turn_after_a_warmup(monkeypatch):
    monkeypatch.setattr(harness.torch.cuda, "synchronize", lambda: None)  # (no device: nothing to wait on)
    calls = []
    got = harness.host_overheads_us([lambda: calls.append("a"), lambda: calls.append("b")], calls=30, batches=3,
                                    warmup_s=0.0)
    # one warm-up round of a batch each, then three batches each, in turn: a*10 b*10 a*10 b*10 ...
    assert calls == (["a"] * 10 + ["b"] * 10) * 4
    assert len(got) == 2 and all(0 <= best <= med for med, best in got)


def test_row_max_rel_err_per_row_max_and_inf_patterns():
    import torch

    ninf = float("-inf")
    ref = torch.tensor([[4.0, -2.0, ninf], [0.5, 0.25, ninf]])
    out = torch.tensor([[4.0, -1.0, ninf], [0.5, 0.3, ninf]])
    assert abs(harness.row_max_rel_err(out, ref) - 0.25) < 1e-6  # row 0: 1 / 4; row 1: 0.05 / 0.5
    assert harness.row_max_rel_err(ref, ref) == 0.0
    assert harness.row_max_rel_err(torch.tensor([[4.0, -2.0, 0.0], [0.5, 0.25, ninf]]), ref) == float("inf")
