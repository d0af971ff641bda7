"""Results tables of the benchmarks.

    python benchmarks/results_table.py FILE.json
        writes FILE.md from FILE.json (what `pytest benchmarks/... --dsa-results FILE.json` wrote).
    python benchmarks/results_table.py merge NEW.json INTO.json --ops topk [--ops ...] [--providers cuda ...]
            --command "..." [--note "..."]
        replaces INTO's rows of those ops (of those providers only, with --providers) with NEW's (in place, where
        INTO had them), takes NEW's run fields (device, torch, triton, date, commit, copy bandwidth), sets the
        command, which must say where the other rows come from (command, date and commit of their run), and
        rewrites INTO.md.
"""

from __future__ import annotations

import argparse
import json
import sys


def _case(c: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in c.items())


def write_markdown(json_path: str) -> str:
    doc = json.load(open(json_path))
    lines = [
        f"# Benchmarks on {doc['device']}",
        "",
        f"torch {doc['torch']}, triton {doc['triton']}, {doc['date']}"
        + (f", commit {doc['commit']}" if doc.get("commit") else "")
        + f". Device-copy bandwidth measured in the same run: {doc['copy_bandwidth_gbps']} GB/s (read + write). "
        f"Generated from `{json_path.split('/')[-1]}` by `benchmarks/results_table.py`.",
        "",
        f"Command: `{doc['command']}`",
        "",
        *([doc["note"], ""] if doc.get("note") else []),
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


RUN_FIELDS = ("device", "torch", "triton", "date", "commit", "copy_bandwidth_gbps")


def merge(new_path: str, into_path: str, ops: list, command: str, note: str | None = None,
          providers: list | None = None) -> dict:
    """Replace `into`'s rows of `ops` (of `providers` only, when given) with `new`'s; every other row and the
    ceilings stay. The run fields and the note are the new run's (a field the new run lacks is dropped, not kept
    from the old one). Returns the merged doc."""
    new, into = json.load(open(new_path)), json.load(open(into_path))
    if not command.strip():
        raise ValueError("merge needs --command: the run the merged rows come from, and where the others do")
    def replaced(r: dict) -> bool:
        return r["op"] in ops and (providers is None or r["provider"] in providers)

    fresh = [r for r in new["results"] if replaced(r)]
    missing = sorted(set(ops) - {r["op"] for r in fresh})
    if missing:
        raise ValueError(f"{new_path} has no rows of {missing}" + (f" from {providers}" if providers else ""))
    rows, placed = [], False
    for r in into["results"]:
        if not replaced(r):
            rows.append(r)
        elif not placed:  # the fresh rows take the place of the first replaced one
            rows.extend(fresh)
            placed = True
    if not placed:
        rows.extend(fresh)
    kept = {k: v for k, v in into.items() if k not in RUN_FIELDS + ("command", "note", "results")}
    into = {**{k: new[k] for k in RUN_FIELDS if k in new}, "command": command, **({"note": note} if note else {}),
            **kept, "results": rows}
    with open(into_path, "w") as f:
        json.dump(into, f, indent=1)  # (as benchmarks/conftest.py writes it)
    write_markdown(into_path)
    return into


def main(argv: list) -> None:
    if argv[:1] != ["merge"]:
        print(write_markdown(argv[0]))
        return
    ap = argparse.ArgumentParser(prog="results_table.py merge")
    ap.add_argument("new")
    ap.add_argument("into")
    ap.add_argument("--ops", action="append", required=True)
    ap.add_argument("--providers", action="append", default=None,
                    help="replace only these providers' rows of the ops (repeatable; default: every provider)")
    ap.add_argument("--command", required=True)
    ap.add_argument("--note", default=None, help="a sentence the table prints under the command")
    a = ap.parse_args(argv[1:])
    doc = merge(a.new, a.into, a.ops, a.command, a.note, a.providers)
    which = ", ".join(a.ops) + (f" ({', '.join(a.providers)})" if a.providers else "")
    print(f"{a.into}: {len(doc['results'])} rows ({which} from {a.new})")


if __name__ == "__main__":
    main(sys.argv[1:])
