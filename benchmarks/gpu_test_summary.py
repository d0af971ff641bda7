"""Per-file summary of a GPU test run (pytest --junitxml) as markdown: what ran on the device, and how.

    python3 benchmarks/gpu_test_summary.py gpu_tests.xml results/h200_gpu_tests.md
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET


def summarize(xml_path: str) -> str:
    counts = collections.defaultdict(collections.Counter)
    failed = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
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
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    md = summarize(sys.argv[1])
    open(sys.argv[2], "w").write(md)
    print(md)
