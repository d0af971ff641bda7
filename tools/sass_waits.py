"""Static view of a kernel loop's SASS (CPU): instruction classes, and for each scoreboard wait the global loads it
waits for and how much issue precedes it since the newest of them.

    cuobjdump -sass -fun <mangled name> lib.cubin > k.sass
    python tools/sass_waits.py k.sass 10300-14ab0            # a loop body (hex addresses, inclusive)
    python tools/sass_waits.py k.sass dcf0-15920 --list      # also print the body with decoded control bits

How the design notes' static comparisons were made (the MLA producer against FlashMLA's, the indexer kernels
against DeepGEMM's): each SASS instruction's second 64-bit word carries its control bits (bits 41-63: stall
cycles, yield, the scoreboard it sets on write and on read, the scoreboards it waits for, reuse flags). A wait
on a scoreboard waits for every operation still pending on it, so loads that share a scoreboard with a load
issued just before the wait are exposed whatever the distance to their own use. The loop is walked three times
(steady state); "issue" counts the stall cycles of the instructions in between (at least 1 each), a lower
bound of the time the warp takes (other warps share the issue slot).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

_INSN = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]+) \*/")
_CTRL = re.compile(r"/\* (0x[0-9a-f]+) \*/")
_CLASSES = (
    ("LDG", ("LDG",)), ("STG", ("STG",)), ("LDS", ("LDS", "LDSM")), ("STS", ("STS",)),
    ("MMA", ("HGMMA", "QGMMA", "IGMMA", "HMMA", "WARPGROUP")),
    ("conversion", ("F2FP", "I2F", "F2I", "F2F", "I2FP", "F2IP")),
    ("fp32", ("FMUL", "FFMA", "FADD", "FMNMX", "FSEL", "FSETP")),
    ("fp16x2", ("HADD2", "HMUL2", "HFMA2")), ("MUFU", ("MUFU",)),
    ("sync", ("BAR", "SYNCS", "WARPSYNC", "MEMBAR", "FENCE", "DEPBAR", "BSSY", "BSYNC", "CCTL")),
    ("shuffle/vote", ("SHFL", "VOTE", "VOTEU", "REDUX", "MATCH")), ("branch", ("BRA", "EXIT", "RET", "CALL")),
)


def parse(text: str) -> list[dict]:
    """The instructions of a cuobjdump -sass listing with their decoded control bits."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines[:-1]):
        m = _INSN.match(line)
        if not m:
            continue
        hi = _CTRL.search(lines[i + 1])
        if hi is None:
            continue
        c = (int(hi.group(1), 16) >> 41) & 0x7FFFFF
        out.append({"addr": int(m.group(1), 16), "text": m.group(2), "stall": c & 0xF, "wb": (c >> 5) & 7,
                    "rb": (c >> 8) & 7, "wait": (c >> 11) & 0x3F})
    return out


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def klass(text: str) -> str:
    op = opcode(text).split(".")[0]
    for name, prefixes in _CLASSES:
        if op in prefixes:
            return name
    if op.startswith("U"):
        return "uniform"
    return "integer/other"


def body(insns: list[dict], ranges: list[tuple[int, int]]) -> list[dict]:
    return [x for lo, hi in ranges for x in insns if lo <= x["addr"] <= hi]


def waits(seq: list[dict], rounds: int = 3) -> list[dict]:
    """Each wait that covers a pending global load in the last of `rounds` walks of the loop body `seq`."""
    pending = {b: [] for b in range(6)}  # scoreboard -> issue clocks of the global loads still on it
    clock = 0
    found = []
    for r in range(rounds):
        for x in seq:
            if x["wait"]:
                sbs = [b for b in range(6) if x["wait"] >> b & 1]
                loads = [t for b in sbs for t in pending[b]]
                if loads and r == rounds - 1:
                    found.append({"addr": x["addr"], "text": x["text"], "loads": len(loads),
                                  "issue_since_newest": clock - max(loads)})
                for b in sbs:
                    pending[b] = []
            if x["wb"] != 7 and opcode(x["text"]).startswith("LDG"):
                pending[x["wb"]].append(clock)
            clock += max(x["stall"], 1)
    return found


def fmt(x: dict) -> str:
    w = "".join(str(b) for b in range(6) if x["wait"] >> b & 1)
    return (f"{x['addr']:05x} S{x['stall']:02d} {'W' + str(x['wb']) if x['wb'] != 7 else '  '} "
            f"{'R' + str(x['rb']) if x['rb'] != 7 else '  '} {('w' + w) if w else '':7s} {x['text']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sass")
    ap.add_argument("ranges", nargs="+", help="LO-HI hex addresses of the loop body, inclusive")
    ap.add_argument("--list", action="store_true", help="print the body with decoded control bits")
    args = ap.parse_args(argv)
    with open(args.sass) as f:
        insns = parse(f.read())
    ranges = [tuple(int(v, 16) for v in r.split("-")) for r in args.ranges]
    seq = body(insns, ranges)
    if not seq:
        print("no instructions in those ranges", file=sys.stderr)
        return 1
    if args.list:
        for x in seq:
            print(fmt(x))
    counts = collections.Counter(klass(x["text"]) for x in seq)
    print(f"{len(seq)} instructions, {sum(max(x['stall'], 1) for x in seq)} issue cycles (stall counts)")
    print("  " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    for w in waits(seq):
        print(f"  wait at {w['addr']:05x}: {w['loads']:2d} global loads pending, newest issued "
              f"{w['issue_since_newest']} cycles before ({w['text'][:60]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
