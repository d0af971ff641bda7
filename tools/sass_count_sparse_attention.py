"""Static SASS count of the Triton sparse_attention single-pass loop: thread instructions per token, per variant (CPU).

    python tools/sass_count_sparse_attention.py [--variant NAME ...] [--dump DIR]

Compiles attention_kernel (SPLIT=False, 24 q / 2 KV heads, D 128, pages of 64, the launcher's
specialisation) for sm_90a with the installed Triton, disassembles the cubin with the nvdisasm that ships
with Triton, takes the innermost backward branch whose body holds the tensor-core instructions as the tile
loop, and prints its instruction count x 32 lanes x num_warps / BLOCK_N (every instruction is counted once,
as if issued by all lanes; predicated-off and conditional blocks inside the body count too). Count with the
Triton the GPU runs: the SASS differs between Triton releases.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from dsa_ops.backends.triton import sparse_attention as sa
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

# name -> CONFIG_OVERRIDE-like dict (dtype "fp8" or "bf16"; single_config, f16, k_pairs, v_pairs, v_perm)
_NO = dict(v_perm=False, opaque=False)  # every flag explicit: the module defaults do not leak into a variant
VARIANTS = {
    "bf16-cache": dict(dtype="bf16"),
    "fp8-bf16mma-kvpairs": dict(f16=False, k_pairs=True, v_pairs=True, **_NO),
    "fp8-f16-vpairs": dict(f16=True, k_pairs=False, v_pairs=True, **_NO),
    "fp8-f16-bytes": dict(f16=True, k_pairs=False, v_pairs=False, **_NO),
    "fp8-f16-kvpairs": dict(f16=True, k_pairs=True, v_pairs=True, **_NO),
    "fp8-f16-vperm": dict(f16=True, k_pairs=False, v_perm=True, opaque=False),
    "fp8-f16-opaque": dict(f16=True, opaque=True, v_perm=False),
    "fp8-bf16mma-opaque": dict(f16=False, opaque=True, v_perm=False),
}

_INS = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);?\s*(?:/\*.*)?$")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRA = re.compile(r"\bBRA\b.*?`?\(?(\.L_x_\d+)")
_MMA = re.compile(r"\b(HGMMA|HMMA|WGMMA)\b")


def compile_variant(v: dict):
    """The compiled kernel for one variant (Triton's CompiledKernel)."""
    fp8 = v.get("dtype", "fp8") == "fp8"
    bn, nw, ns = v.get("single_config", sa.SINGLE_CONFIG["fp8" if fp8 else "bf16"])
    opaque = fp8 and v.get("opaque", sa.FP8_OPAQUE)
    k_pairs = fp8 and not opaque and v.get("k_pairs", sa.FP8_K_PAIRS)
    v_perm = fp8 and v.get("v_perm", sa.FP8_V_PERM)
    v_pairs = fp8 and not (v_perm or opaque) and v.get("v_pairs", sa.FP8_V_PAIRS)
    sig = dict(sa._ATT_SIG)
    sig["k_ptr"] = "*i16" if k_pairs else "*fp8e4nv" if fp8 else "*bf16"
    sig["v_ptr"] = "*i16" if v_pairs else "*fp8e4nv" if fp8 else "*bf16"
    constexprs = {"G": 12, "HKV": 2, "BLOCK_H": 16, "D": 128, "DV": 128, "PAGE": 64, "BLOCK_N": bn, "SPLIT": False,
                  "SLOTS_INLINE": False, "K_PAIRS": k_pairs, "V_PAIRS": v_pairs, "F16": fp8 and v.get("f16", True),
                  "V_PERM": v_perm, "OPAQUE": opaque}
    params = list(sig)
    attrs = {(params.index(a),): [["tt.divisibility", 16]]
             for a, ty in sig.items() if ty.startswith("*") or a in sa._ATT_DIV}
    src = ASTSource(sa.attention_kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": nw, "num_stages": ns}), bn, nw


def disassemble(cubin: bytes) -> str:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([str(tool), "-c", f.name], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)


def loop_body(sass: str) -> list[str]:
    """Instructions of the innermost backward-branch range that holds MMA instructions."""
    ins, labels = [], {}
    for line in sass.splitlines():
        if m := _LABEL.match(line):
            labels[m.group(1)] = len(ins)
        elif m := _INS.match(line):
            ins.append(m.group(2).strip())
    loops = []
    for i, text in enumerate(ins):
        m = _BRA.search(text)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            lo = labels[m.group(1)]
            if any(_MMA.search(t) for t in ins[lo:i + 1]):
                loops.append((i + 1 - lo, lo, i))
    if not loops:
        raise RuntimeError("no backward branch around an MMA instruction in the SASS")
    _, lo, hi = min(loops)
    return ins[lo:hi + 1]


def histogram(body: list[str]) -> dict:
    h: dict = {}
    for t in body:
        op = re.sub(r"^@!?U?P\w+\s+", "", t).split()[0]
        h[op] = h.get(op, 0) + 1
    return dict(sorted(h.items(), key=lambda kv: -kv[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", choices=list(VARIANTS), help="default: all")
    ap.add_argument("--config", help="BLOCK_N,num_warps,num_stages for every variant (default: the module's)")
    ap.add_argument("--dump", help="write each variant's SASS and loop body under this folder")
    ap.add_argument("--ops", action="store_true", help="print the loop's opcode histogram")
    a = ap.parse_args(argv)
    print(f"triton {triton.__version__}, sm_90a; thread instructions per token = loop SASS x 32 x warps / BLOCK_N")
    for name in a.variant or list(VARIANTS):
        v = dict(VARIANTS[name])
        if a.config:
            v["single_config"] = tuple(int(x) for x in a.config.split(","))
        try:
            k, bn, nw = compile_variant(v)
            sass = disassemble(k.asm["cubin"])
            body = loop_body(sass)
        except Exception as e:  # noqa: BLE001  (a variant that fails is a result)
            print(f"{name:28s} failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        per_token = len(body) * 32 * nw / bn
        print(f"{name:28s} ({bn},{nw},{k.metadata.num_stages}) loop {len(body):5d} SASS -> {per_token:7.1f} per token")
        if a.ops:
            print("   ", " ".join(f"{op}:{n}" for op, n in histogram(body).items()))
        if a.dump:
            d = Path(a.dump)
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{name}.sass").write_text(sass)
            (d / f"{name}.loop.sass").write_text("\n".join(body) + "\n")
            for ir in ("ttgir", "ptx"):
                (d / f"{name}.{ir}").write_text(k.asm[ir])
    return 0


if __name__ == "__main__":
    sys.exit(main())
