"""Dev tool (GPU): compile-time variants of the CUDA sparse_mla_decode kernel against the default build: a probe
flag that a header reads (`#ifndef NAME / #define NAME 0`, off by default; none is in the tree while no probe is
open):

    python3 tools/ab_mla_flags.py -DNAME=1 [-DA=1,-DB=1 ...] [variant.so ...] [--default=lib.so] [rounds]

Each argument starting with "-" is one variant: its nvcc flags, comma-separated; one ending in ".so" is a variant
library built already (tools/build_cuda_lib_on_cpu.sh with the flag set in the header). Builds the CUDA library
once with the default flags (unless --default names one built already) and once per flag variant (each in its
own build root under /tmp), then, each step in a fresh process bound to one library by DSA_OPS_CUDA_LIB:
1. variant 3's outputs and lse on the benchmark's shapes up to batch 64, single pass and 3 splits, saved from the
   default build and compared bitwise with each variant's (a flag that moves a fence must not change a bit);
2. `tools/smoke_sparse_mla_decode.py --time` alternately with each library for `rounds` rounds (default 2): us by
   CUDA-graph replay, FlashMLA beside when .peer/vllm has it.
Prints each round's lines prefixed by the build, then per shape the median over rounds of the op's time with
each build and each variant's ratio to the default.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_BUILD = """
import shutil, sys
sys.path.insert(0, "tools")
import profile_topk
dest, root, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
shutil.copy(profile_topk.build(" ".join(flags), build_root=root), dest)
"""

_OUTPUTS = """
import sys, torch
sys.path.insert(0, "benchmarks")
import bench_sparse_mla_decode as bm
from dsa_ops.backends.cuda import providers_sparse_mla_decode as pm
res = {}
for layout, heads, s_q, batch in bm.CASES:
    if batch > 64:
        continue
    cache = bm._pool(layout)
    q, idx = bm._inputs(batch, s_q, heads, layout=layout)
    for splits in (1, 3):
        out = torch.full((batch, s_q, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((batch, heads, s_q), float("nan"), dtype=torch.float32, device="cuda")
        pm.launch(q, cache, idx, bm.D_QK[layout] ** -0.5, layout, out=out, lse=lse, splits=splits, variant=3)
        res[f"{layout} h{heads} s_q{s_q} b{batch} splits {splits}"] = (out.cpu(), lse.cpu())
torch.save(res, sys.argv[1])
"""


def run(code_or_args, lib=None, check=True) -> str:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("DSA_OPS_CUDA_LIB", None)
    if lib is not None:
        env["DSA_OPS_CUDA_LIB"] = lib
    args = [sys.executable, "-c", code_or_args[0], *code_or_args[1:]] if isinstance(code_or_args, tuple) else \
        [sys.executable, *code_or_args]
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise SystemExit(f"{args[1:3]} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return p.stdout


def main() -> int:
    args = sys.argv[1:]
    default = next((os.path.abspath(a.split("=", 1)[1]) for a in args if a.startswith("--default=")), None)
    variants = [a.split(",") if a.startswith("-") else os.path.abspath(a)
                for a in args if not a.startswith("--") and (a.startswith("-") or a.endswith(".so"))]
    rest = [a for a in args if not a.startswith("-") and not a.endswith(".so")]
    rounds = int(rest[0]) if rest else 2
    if not variants:
        raise SystemExit(__doc__)
    tmp = tempfile.mkdtemp(prefix="ab_mla_")
    builds = {"default": default or []} | {f"variant{k}": v for k, v in enumerate(variants)}
    libs = {}
    for name, what in builds.items():
        if isinstance(what, str):  # a library built already
            libs[name] = what
            print(f"{name}: {what}", flush=True)
            continue
        libs[name] = os.path.join(tmp, f"{name}.so")
        run((_BUILD, libs[name], os.path.join(tmp, f"build_{name}"), *what))
        print(f"built {name} {' '.join(what)}", flush=True)

    import torch

    saved = {}
    for name in libs:
        path = os.path.join(tmp, f"{name}.pt")
        run((_OUTPUTS, path), lib=libs[name])
        saved[name] = torch.load(path)
    bad = 0
    for name in list(libs)[1:]:
        diff = [k for k, (o, lse) in saved["default"].items()
                if not (torch.equal(o.view(torch.int16), saved[name][k][0].view(torch.int16))
                        and torch.equal(lse.view(torch.int32), saved[name][k][1].view(torch.int32)))]
        bad += bool(diff)
        print(f"bitwise {name}: {len(saved['default']) - len(diff)} of {len(saved['default'])} cases equal"
              + (f"; differ: {', '.join(diff)}" if diff else ""), flush=True)

    times: dict[str, dict[str, list[float]]] = {}
    for r in range(rounds):
        for name, lib in libs.items():
            for line in run(["tools/smoke_sparse_mla_decode.py", "--time"], lib=lib, check=False).splitlines():
                if line.startswith("smoke:") and line != "smoke: ok":
                    print(f"round {r} {name}: {line}", flush=True)
                m = re.match(r"(v32|v4) (h\d+ s_q\d+ b\d+) splits \d+: .*?op ([\d.]+)", line)
                if m:
                    print(f"round {r} {name}: {line}", flush=True)
                    times.setdefault(f"{m.group(1)} {m.group(2)}", {}).setdefault(name, []).append(float(m.group(3)))
    names = list(libs)
    print(f"\nshape: op us, {' / '.join(names)} (median over rounds); each variant / default")
    for shape, t in times.items():
        if len(t) == len(names):
            med = [statistics.median(t[n]) for n in names]
            print(f"{shape}: {' / '.join(f'{m:.1f}' for m in med)}; "
                  + ", ".join(f"{m / med[0]:.3f}" for m in med[1:]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
