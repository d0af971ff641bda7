"""Runs a Triton test script under TRITON_INTERPRET=1 in a fresh interpreter (the variable must be set
before triton is imported) and returns the {case: "ok" | error} dict it prints as `RESULTS <json>`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run_interpreted(script: str, timeout: int) -> dict:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert p.returncode == 0 and lines, f"interpreter run failed (exit {p.returncode}):\n{p.stdout}{p.stderr}"
    return json.loads(lines[-1][len("RESULTS "):])
