"""Dev tool (CPU): where a kernel's executed instructions and stall samples go, by source line of
kernels/topk_filter.cu, from an ncu SASS export.

    # on the GPU machine (a -lineinfo build; see tools/profile_topk.sh):
    ncu --clock-control none --cache-control none --section SourceCounters --section WarpStateStats \\
        --import-source yes -k regex:topk_filter_kernel --launch-skip 2 --launch-count 1 -o p \\
        python3 tools/profile_topk.py run 1 131072
    ncu -i p.ncu-rep --page source --csv --print-source sass > sass.csv
    # here, on the same source tree (SASS offsets are matched opcode by opcode; it stops on a mismatch):
    python tools/ncu_source_lines.py sass.csv [--kernel SUBSTRING] [--lines FIRST LAST] [--top N]

Each SASS instruction is charged to the last line of topk_filter.cu seen before it in the line table
(`nvdisasm --print-line-info` of a -lineinfo cubin built here with nvcc), so header code inlined into a
line counts for that line. Without --lines it prints the top lines; with it, every line in the range
with the innermost header line as well.
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(ROOT, "backends_cuda", "kernels", "topk_filter.cu")


def nvdisasm() -> str:
    for cand in ("nvdisasm", "/usr/local/cuda/bin/nvdisasm"):
        if subprocess.run(["which", cand], capture_output=True).returncode == 0 or os.path.exists(cand):
            return cand
    import triton  # (its wheel ships nvdisasm)

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")


def line_table(kernel: str, source: str) -> tuple[dict[int, tuple[int, str]], dict[int, str]]:
    """offset -> (topk_filter.cu line, innermost 'file:line'), offset -> opcode, for the first kernel
    of `source` (a translation unit) whose mangled name contains `kernel`."""
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        subprocess.run(["nvcc", "-std=c++17", "-O3", "-lineinfo", "-I", os.path.join(ROOT, "backends_cuda", "include"),
                        "-gencode", "arch=compute_90a,code=sm_90a", "-cubin", "-o", cubin, source], check=True)
        text = subprocess.run([nvdisasm(), "--print-line-info", cubin], check=True, capture_output=True,
                              text=True).stdout
    where, ops = {}, {}
    inside, line, inner = False, 0, ""
    for row in text.split("\n"):
        if row.startswith(".text."):
            inside = kernel in row
            continue
        if not inside:
            continue
        m = re.match(r'\s*//## File "(.*)", line (\d+)', row)
        if m:
            inner = f"{os.path.basename(m.group(1))}:{m.group(2)}"
            if m.group(1).endswith("topk_filter.cu"):
                line = int(m.group(2))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", row)
        if m:
            off = int(m.group(1), 16)
            where[off] = (line, inner)
            ops[off] = m.group(3)
    return where, ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--kernel", default="topk_filter_kernelIfLb1E", help="a substring of the mangled name")
    ap.add_argument("--source", default=SOURCE, help="the translation unit (kernels/topk_filter_narrow.cu: the "
                    "narrow shape, --kernel topk_filter_narrow_detail)")
    ap.add_argument("--lines", type=int, nargs=2)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv)))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    names, data = rows[header], [r for r in rows[header + 1:] if r and r[0].startswith("0x")]
    col = {h: i for i, h in enumerate(names)}
    stalls = [h for h in names if h.startswith("stall_") and "Not Issued" not in h]
    where, ops = line_table(args.kernel, args.source)
    base = int(data[0][0], 16)
    acc = collections.defaultdict(lambda: [0.0, 0.0, collections.Counter()])
    for r in data:
        off = int(r[0], 16) - base
        op = r[1].split()[1] if r[1].startswith("@") else r[1].split()[0]
        if ops.get(off) != op:
            sys.exit(f"SASS mismatch at +{off:#x}: ncu {op}, here {ops.get(off)}: not the same build")
        line, inner = where[off]
        key = (line, inner if args.lines else "")
        a = acc[key]
        a[0] += float(r[col["Instructions Executed"]] or 0)
        a[1] += float(r[col["Warp Stall Sampling (All Samples)"]] or 0)
        for h in stalls:
            a[2][h[6:]] += float(r[col[h]] or 0)
    total_i = sum(a[0] for a in acc.values()) or 1.0
    total_s = sum(a[1] for a in acc.values()) or 1.0
    print(f"{len(data)} instructions matched; {total_i:.0f} warp instructions executed, {total_s:.0f} stall samples")
    keys = sorted(k for k in acc if args.lines[0] <= k[0] <= args.lines[1]) if args.lines else \
        sorted(acc, key=lambda k: -acc[k][0])[: args.top]
    for k in keys:
        i, smp, why = acc[k]
        top = " ".join(f"{w}:{int(v)}" for w, v in why.most_common(3) if v)
        print(f"line {k[0]:5d} {k[1]:32s} instr {i:9.0f} {100 * i / total_i:5.1f}%  samples {smp:5.0f}  {top}")


if __name__ == "__main__":
    main()
