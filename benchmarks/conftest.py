"""Benchmark session: measures the ceilings once, collects rows, writes results/<gpu>.json and .md.

    python -m pytest benchmarks -m gpu --dsa-results benchmarks/results/h200.json
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from harness import Timer, copy_bandwidth_gbps  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--dsa-results", default=None, help="write the results json (and .md beside it) here")


class Session:
    def __init__(self):
        self.rows = []
        self.timer = Timer()
        self.copy_gbps = copy_bandwidth_gbps(self.timer)
        self.ceilings = {}

    def floor_us(self, nbytes: int) -> float:
        return nbytes / (self.copy_gbps * 1e9) * 1e6

    def add(self, row):
        self.rows.append(row)
        b = row["baselines"]
        ratios = "  ".join(f"{k} {v / row['median_us']:.2f}x" for k, v in b.items() if v)
        floor = ""
        if row["floor_us"]:
            floor = f"  floor {row['floor_us']:.1f} us ({row['median_us'] / row['floor_us']:.2f}x)"
        print(f"\n  {row['op']} [{row['provider']}] {row['case']}: {row['median_us']:.1f} us{floor}  {ratios}")


_SESSION = None


def tree_commit() -> str:
    """The measured tree's commit: $DSA_OPS_COMMIT where the copy has no .git, else `git describe --dirty`."""
    if os.environ.get("DSA_OPS_COMMIT"):
        return os.environ["DSA_OPS_COMMIT"]
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True,
                             text=True, timeout=30, cwd=os.path.dirname(os.path.abspath(__file__)))
    except OSError:
        out = None
    if out is None or out.returncode != 0:
        return "unknown (no git checkout; set DSA_OPS_COMMIT)"
    return out.stdout.strip()


@pytest.fixture(scope="session")
def bench():
    global _SESSION
    if not torch.cuda.is_available():
        pytest.skip("benchmarks need a GPU")
    if _SESSION is None:
        _SESSION = Session()
    return _SESSION


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--dsa-results")
    if not path or _SESSION is None or not _SESSION.rows:
        return
    import triton

    doc = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
        "command": "python -m pytest " + " ".join(session.config.invocation_params.args),
        "commit": tree_commit(),
        "copy_bandwidth_gbps": round(_SESSION.copy_gbps, 1),
        "ceilings": _SESSION.ceilings,
        "results": _SESSION.rows,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    from results_table import write_markdown

    write_markdown(path)
