"""benchmarks/results_table.py merge: the rows of the named ops (of the named providers, when given) are replaced,
every other row stays."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results_table.py"
_spec = importlib.util.spec_from_file_location("results_table", _PATH)
results_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results_table)


def _row(op: str, case: int, us: float) -> dict:
    return {"op": op, "provider": "cuda", "case": {"n": case}, "median_us": us, "floor_us": 1.0,
            "floor_kind": "copy", "baselines": {"torch": 10.0}}


def _doc(date: str, bw: float, rows: list) -> dict:
    return {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "date": date, "command": "old",
            "copy_bandwidth_gbps": bw, "ceilings": {"fp8_tflops": 1.0}, "results": rows}


def test_merge_replaces_only_the_named_ops(tmp_path):
    into, new = tmp_path / "h200.json", tmp_path / "new.json"
    into.write_text(json.dumps(_doc("2026-01-01", 4000.0, [_row("ptt", 1, 5.0), _row("topk", 1, 9.0),
                                                           _row("topk", 2, 8.0), _row("idx", 1, 7.0)]), indent=1))
    new.write_text(json.dumps(_doc("2026-02-02", 4100.0, [_row("topk", 3, 3.0), _row("ptt", 9, 1.0)]), indent=1))
    doc = results_table.merge(str(new), str(into), ["topk"], "the new run; ptt and idx from the old one")
    assert [(r["op"], r["case"]["n"], r["median_us"]) for r in doc["results"]] == [
        ("ptt", 1, 5.0), ("topk", 3, 3.0), ("idx", 1, 7.0)]
    assert doc["date"] == "2026-02-02" and doc["copy_bandwidth_gbps"] == 4100.0
    assert doc["ceilings"] == {"fp8_tflops": 1.0} and doc["command"] == "the new run; ptt and idx from the old one"
    assert json.loads(into.read_text()) == doc
    md = (tmp_path / "h200.md").read_text()
    assert "the new run; ptt and idx from the old one" in md and md.count("| topk |") == 1


def test_merge_refuses_missing_rows_and_an_empty_command(tmp_path):
    into, new = tmp_path / "h200.json", tmp_path / "new.json"
    into.write_text(json.dumps(_doc("d", 1.0, [_row("topk", 1, 9.0)])))
    new.write_text(json.dumps(_doc("d", 1.0, [_row("ptt", 1, 1.0)])))
    with pytest.raises(ValueError, match="no rows"):
        results_table.merge(str(new), str(into), ["topk"], "x")
    with pytest.raises(ValueError, match="--command"):
        results_table.merge(str(new), str(into), ["ptt"], " ")
    assert json.loads(into.read_text())["results"] == [_row("topk", 1, 9.0)]


def test_merge_takes_the_new_runs_commit_and_note(tmp_path):
    into, new = tmp_path / "h200.json", tmp_path / "new.json"
    old = dict(_doc("d1", 1.0, [_row("topk", 1, 9.0), _row("ptt", 1, 2.0)]), commit="aaaaaaa", note="old run's note")
    into.write_text(json.dumps(old))
    new.write_text(json.dumps(_doc("d2", 2.0, [_row("topk", 2, 8.0)])))
    doc = results_table.merge(str(new), str(into), ["topk"], "topk: new run; ptt: old run (d1, aaaaaaa)")
    assert "commit" not in doc and "note" not in doc  # the old run's fields do not describe the new rows
    new.write_text(json.dumps(dict(_doc("d3", 3.0, [_row("topk", 3, 7.0)]), commit="bbbbbbb")))
    doc = results_table.merge(str(new), str(into), ["topk"], "c", note="host pace varies")
    assert doc["commit"] == "bbbbbbb" and doc["note"] == "host pace varies" and doc["date"] == "d3"
    assert list(doc)[-1] == "results" and doc["ceilings"] == {"fp8_tflops": 1.0}
    md = (tmp_path / "h200.md").read_text()
    assert "d3, commit bbbbbbb." in md and "\nhost pace varies\n" in md


def test_merge_replaces_only_the_named_providers(tmp_path):
    into, new = tmp_path / "h200.json", tmp_path / "new.json"
    triton = dict(_row("sa", 1, 20.0), provider="triton")
    into.write_text(json.dumps(_doc("d1", 1.0, [triton, _row("sa", 1, 12.0), _row("ptt", 1, 2.0)])))
    fresh_triton = dict(_row("sa", 1, 99.0), provider="triton")
    new.write_text(json.dumps(_doc("d2", 2.0, [fresh_triton, _row("sa", 1, 11.0), _row("sa", 2, 30.0)])))
    doc = results_table.merge(str(new), str(into), ["sa"], "sa cuda: new run; the rest: d1", providers=["cuda"])
    assert [(r["provider"], r["case"]["n"], r["median_us"]) for r in doc["results"]] == [
        ("triton", 1, 20.0), ("cuda", 1, 11.0), ("cuda", 2, 30.0), ("cuda", 1, 2.0)]
    with pytest.raises(ValueError, match="no rows"):
        results_table.merge(str(new), str(into), ["ptt"], "x", providers=["cuda"])
