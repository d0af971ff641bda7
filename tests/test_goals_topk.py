"""benchmarks/goals_topk.py: each of issue 3's goals judged from a results file's rows."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

_DIR = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(_DIR))
_spec = importlib.util.spec_from_file_location("goals_topk", _DIR / "goals_topk.py")
goals_topk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(goals_topk)


def _row(rows, keys, us, floor, **extra):
    return {"op": "topk", "provider": "cuda", "median_us": us, "floor_us": floor, "exact": True,
            "case": {"rows": rows, "keys": keys, "k": 2048, "dtype": "float32", "distribution": "normal"}, **extra}


def test_each_goal_from_its_row():
    doc = {"device": "GPU", "date": "d", "results": [
        _row(4096, 32768, 200.0, 133.0, page_table_transform_ratio=1.05),
        _row(4096, 131072, 800.0, 500.0, page_table_transform_ratio=1.051,
             page_table_transform_ratio_to_topk_with_lengths=1.02),
        dict(_row(16384, 65536, 1000.0, 1000.0), exact=False),
        _row(1, 131072, 10.0, 0.1, host_overhead_us=9.9, host_overhead_torch_add_us=7.0),
        _row(20, 134868, 15.1, 2.0, host_overhead_us=10.1),
        {**_row(1, 131072, 1.0, 1.0), "op": "topk_hip"},  # (another op's row: not read)
    ]}
    got = {g: (fig, met) for g, fig, met in goals_topk.goals(doc)}
    assert got["4096x32768 topk <= 1.5x floor"] == ("200.0 us, 1.504x", False)
    assert got["4096x131072 topk <= 1.5x floor"][1] is False
    assert got["16384x65536 topk <= 1.5x floor"] == ("1000.0 us, 1.000x, NOT EXACT", False)
    assert got["256x131072 topk <= 1.5x floor"] == ("not in the file", None)
    assert got["1x131072 topk <= 10.0 us"] == ("10.0 us", True)
    assert got["20x134868 topk <= 15.0 us"][1] is False
    assert got["4096x32768 page-table form <= 1.05x topk"] == ("1.05", True)
    # (the ratio to topk with the same lengths is shown beside, never judged)
    assert got["4096x131072 page-table form <= 1.05x topk"] == ("1.051 (1.02 to topk with the same lengths)", False)
    assert got["1x131072 page-table form <= 1.05x topk"] == ("not in the file", None)
    assert got["1x131072 host overhead <= 10.0 us"] == ("9.9 us (min None; torch.add 7.0)", True)
    assert got["20x134868 host overhead <= 10.0 us"] == ("10.1 us", False)
    assert "| 4096x131072 page-table form <= 1.05x topk | 1.051 (1.02 to topk with the same lengths) | NO |" in \
        goals_topk.table(doc)
