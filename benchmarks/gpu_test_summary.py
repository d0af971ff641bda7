"""Per-file summary of a GPU test run (pytest --junitxml) as markdown: what ran on the device, and how.

    python3 benchmarks/gpu_test_summary.py gpu_tests.xml OUT.md [--command "..."] [--commit SHA]

With --command and --commit (benchmarks/device_run.sh passes both) the table is headed by the run's date
(from the xml), commit, command and wall time, the form of benchmarks/results/h200_gpu_tests.md.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET


def summarize(xml_path: str, command: str | None = None, commit: str | None = None) -> str:
    """The per-file counts table, headed by the run's date, commit, command and time where given."""
    root = ET.parse(xml_path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    head = []
    if command or commit:
        date = (suite.get("timestamp", "") if suite is not None else "")[:10] or "unknown"
        secs = suite.get("time") if suite is not None else None
        head = [f"Date {date}, commit {commit or 'unknown'}" + (f", {float(secs):.1f} s" if secs else "") + ".",
                "", f"Command: `{command}`" if command else "Command: unknown", ""]
    counts = collections.defaultdict(collections.Counter)
    failed = []
    for case in root.iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                failed.append(f"{case.get('classname')}::{case.get('name')}")
            elif child.tag == "skipped":
                why = (child.get("type", "") + child.get("message", "")).lower()
                outcome = "xfailed" if "xfail" in why else "skipped"
        counts[path][outcome] += 1
    lines = ["| test file | passed | failed | skipped | xfailed |", "|---|---|---|---|---|"]
    total = collections.Counter()
    for path in sorted(counts):
        c = counts[path]
        total.update(c)
        lines.append(f"| {path} | {c['passed']} | {c['failed']} | {c['skipped']} | {c['xfailed']} |")
    lines.append(f"| **all** | {total['passed']} | {total['failed']} | {total['skipped']} | {total['xfailed']} |")
    if failed:
        lines += ["", "Failed:", *[f"- {f}" for f in failed]]
    return "\n".join(head + lines) + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("xml")
    ap.add_argument("out")
    ap.add_argument("--command", default=None, help="the command that ran the tests")
    ap.add_argument("--commit", default=None, help="the tested tree's commit")
    a = ap.parse_args()
    md = summarize(a.xml, a.command, a.commit)
    open(a.out, "w").write(md)
    print(md)
