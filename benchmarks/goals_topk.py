"""Issue 3's goals, each with its figure from a results file: `python benchmarks/goals_topk.py [FILE.json]`
(default benchmarks/results/h200.json), a markdown table (device_run.sh's bench stage writes it beside the
results). Reads what bench_topk.py recorded (the main cases of topk_cases.py); judges nothing the file does not hold."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from topk_cases import HOST_OVERHEAD_GOAL_US, MAIN_CASES, PAGE_TABLE_RATIO_GOAL  # noqa: E402


def _main_row(doc: dict, rows: int, keys: int):
    for r in doc["results"]:
        c = r["case"]
        if (r["op"], c["rows"], c["keys"], c["dtype"], c["distribution"]) == ("topk", rows, keys, "float32", "normal"):
            return r
    return None


def goals(doc: dict) -> list:
    """(goal, figure, met) for each goal; met is None where the file lacks the figure."""
    found = {(rows, keys): _main_row(doc, rows, keys) for rows, keys, *_ in MAIN_CASES}
    out = []
    for rows, keys, kind, goal in MAIN_CASES:
        r = found[rows, keys]
        label = f"{rows}x{keys} topk <= {goal}" + ("x floor" if kind == "floor" else " us")
        if r is None:
            out.append((label, "not in the file", None))
            continue
        exact = "" if r.get("exact") else ", NOT EXACT"
        x = r["median_us"] / r["floor_us"] if kind == "floor" else r["median_us"]
        figure = f"{r['median_us']} us" + (f", {x:.3f}x" if kind == "floor" else "") + exact
        out.append((label, figure, x <= goal and bool(r.get("exact"))))
    for (rows, keys), r in found.items():
        ratio = None if r is None else r.get("page_table_transform_ratio")
        # (judged against plain topk; the ratio to topk given the same `lengths` is shown, not judged)
        windowed = None if r is None else r.get("page_table_transform_ratio_to_topk_with_lengths")
        figure = "not in the file" if ratio is None else f"{ratio}" + (
            "" if windowed is None else f" ({windowed} to topk with the same lengths)")
        out.append((f"{rows}x{keys} page-table form <= {PAGE_TABLE_RATIO_GOAL}x topk", figure,
                    None if ratio is None else ratio <= PAGE_TABLE_RATIO_GOAL))
    for (rows, keys), r in found.items():
        if r is None or "host_overhead_us" not in r:
            continue
        add = r.get("host_overhead_torch_add_us")
        beside = f" (min {r.get('host_overhead_min_us')}; torch.add {add})" if add is not None else ""
        out.append((f"{rows}x{keys} host overhead <= {HOST_OVERHEAD_GOAL_US} us", f"{r['host_overhead_us']} us{beside}",
                    r["host_overhead_us"] <= HOST_OVERHEAD_GOAL_US))
    return out


def table(doc: dict) -> str:
    lines = [f"Issue 3's goals in {doc['device']} results of {doc['date']}:", "", "| goal | figure | met |",
             "|---|---|---|"]
    for goal, figure, met in goals(doc):
        lines.append(f"| {goal} | {figure} | {'-' if met is None else 'yes' if met else 'NO'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "results", "h200.json")
    print(table(json.load(open(path))), end="")
