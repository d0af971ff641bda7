"""Generates results/<gpu>.md from results/<gpu>.json: `python benchmarks/results_table.py FILE.json`."""

from __future__ import annotations

import json
import sys


def _case(c: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in c.items())


def write_markdown(json_path: str) -> str:
    doc = json.load(open(json_path))
    lines = [
        f"# Benchmarks on {doc['device']}",
        "",
        f"torch {doc['torch']}, triton {doc['triton']}, {doc['date']}. Device-copy bandwidth measured in the same "
        f"run: {doc['copy_bandwidth_gbps']} GB/s (read + write). Generated from `{json_path.split('/')[-1]}` by "
        "`benchmarks/results_table.py`.",
        "",
        f"Command: `{doc['command']}`",
        "",
        "| op | provider | case | median us | floor us (kind) | x floor | baselines (us, and speed-up vs them) "
        "| notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        floor = f"{r['floor_us']} ({r['floor_kind']})" if r.get("floor_us") else "-"
        xf = f"{r['median_us'] / r['floor_us']:.2f}" if r.get("floor_us") else "-"
        base = "; ".join(f"{k} {v} ({v / r['median_us']:.2f}x)" for k, v in r["baselines"].items() if v) or "-"
        notes = ", ".join(f"{k}={v}" for k, v in r.items()
                          if k not in ("op", "provider", "case", "median_us", "floor_us", "floor_kind", "baselines"))
        lines.append(f"| {r['op']} | {r['provider']} | {_case(r['case'])} | {r['median_us']} | {floor} | {xf} | "
                     f"{base} | {notes} |")
    md = "\n".join(lines) + "\n"
    open(json_path[:-5] + ".md", "w").write(md)
    return md


if __name__ == "__main__":
    print(write_markdown(sys.argv[1]))
