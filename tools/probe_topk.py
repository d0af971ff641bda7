"""Probe where the filter top-k kernel's time goes (H200). Dev tool.

    python tools/probe_topk.py            # shapes x k, next to a plain read of the same bytes
    python tools/probe_topk.py clusters   # decode-like shapes under each forced cluster size
    python tools/probe_topk.py shapes     # the issue's shapes (fp32, and bf16 4096x32768), one line
    python tools/probe_topk.py ptt        # the same, each followed by its page-table form
    python tools/probe_topk.py ptt_decode # ptt's fp32 shapes of at most 64 rows only
    python tools/probe_topk.py pairs      # decode rows: topk, page-table form, topk with lengths, interleaved
    python tools/probe_topk.py seeded     # decode rows of bench_topk's generator, seeds 0-7 (input spread)
    python tools/probe_topk.py parts      # topk, with lengths, ragged form, page-table form: the extras apart
    python tools/probe_topk.py widths     # many rows of 12K to 64K keys, and fewer rows of 32K (one-CTA rows)
    python tools/probe_topk.py adversarial [ROWSxKEYS]  # 4096x32768 (or that shape) fp32 of each generator
"""

import os
import sys

import dsa_ops  # noqa: F401  (registers torch.ops.dsa)
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))  # harness, topk_cases
from dsa_ops.ops._common import window_topk  # noqa: E402
from harness import Timer  # noqa: E402
from topk_cases import make_scores, page_table_args  # noqa: E402


def by_k():
    t = Timer().median_us  # cold L2, like the benchmarks
    for rows, n in ((264, 32768), (1056, 32768), (4096, 32768), (264, 131072), (4096, 8192), (4096, 4096)):
        x = torch.randn(rows, n, device="cuda")
        line = f"{rows}x{n}: read {t(lambda x=x: x.sum(dim=1)):.1f} us"
        for k in (1, 64, 512, 2048):
            line += f" | k={k} {t(lambda x=x, k=k: torch.ops.dsa.topk(x, k)):.1f}"
        print(line, flush=True)


def shapes(ptt=False, decode_only=False):
    """One line: the issue's shapes (fp32; bf16 4096x32768 and decode rows; nan_inf 4096x32768), and with
    ptt=True the page-table form after each (page size 64, full lengths, out=, as bench_topk.py).
    decode_only: the fp32 shapes of at most 64 rows only (a few seconds a pass)."""
    timer = Timer()
    line = os.environ.get("DSA_OPS_CUDA_LIB", "built library")
    for rows, n, dtype in ((4096, 32768, torch.float32), (16384, 65536, torch.float32), (4096, 131072, torch.float32),
                           (256, 131072, torch.float32), (4096, 32768, torch.bfloat16), (1, 131072, torch.float32),
                           (20, 134868, torch.float32), (64, 1048576, torch.float32), (1, 131072, torch.bfloat16),
                           (20, 134868, torch.bfloat16), (4096, 32768, "nan_inf"), (4096, 32768, "walk"),
                           (16384, 65536, "walk"), (64, 131072, "walk"), (1, 131072, "walk"),
                           (20, 134868, "walk")):
        if decode_only and (rows > 64 or dtype == torch.bfloat16):
            continue
        if dtype in ("nan_inf", "walk"):  # (the bench's generators: NaN, +-inf and normal; random walks)
            x = make_scores(rows, n, "float32", dtype)
            same = bool(torch.equal(torch.ops.dsa.topk(x, 2048).sort(dim=1).values,
                                    window_topk(x, 2048).sort(dim=1).values))
        else:
            x = torch.randn(rows, n, device="cuda").to(dtype)
            # (a cheap exactness check: the chosen values, sorted, against torch.topk's)
            got = x.gather(1, torch.ops.dsa.topk(x, 2048).long()).float().sort(dim=1).values
            want = torch.topk(x.float(), 2048, dim=1).values.sort(dim=1).values
            same = bool(torch.equal(got, want))
        fns = [lambda x=x: torch.ops.dsa.topk(x, 2048)]
        if ptt:
            pt, lengths = page_table_args(rows, n)
            out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
            fns.append(lambda x=x, pt=pt, lengths=lengths, out=out: torch.ops.dsa.topk_page_table_transform.out(
                x, pt, lengths, 2048, page_size=64, out=out))
        times = [timer.graph_median_us(fn) if rows <= 64 else timer.median_us(fn) for fn in fns]
        tag = {torch.float32: "", torch.bfloat16: " bf16"}.get(dtype, f" {dtype}")
        line += f" | {rows}x{n}{tag} " + " ".join(f"{t:.1f}" for t in times)
        line += "" if same else " WRONG"
        del x
    print(line, flush=True)


def pairs():
    """One line: the decode rows of bench_topk.py (fp32 normal; random walks of 1x131072), each timed as the
    bench does, graph replays of topk, the page-table form and topk given the same lengths interleaved
    (Timer.graph_medians_us), to 3 decimals with the form's ratios to both; the form's output checked."""
    timer = Timer()
    line = os.environ.get("DSA_OPS_CUDA_LIB", "built library")
    for rows, n, dist in ((1, 131072, "normal"), (20, 134868, "normal"), (64, 1048576, "normal"),
                          (1, 131072, "walk")):
        x = make_scores(rows, n, "float32", dist)
        pt, lengths = page_table_args(rows, n)
        out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
        fns = [lambda x=x: torch.ops.dsa.topk(x, 2048),
               lambda x=x, pt=pt, lengths=lengths, out=out: torch.ops.dsa.topk_page_table_transform.out(
                   x, pt, lengths, 2048, page_size=64, out=out),
               lambda x=x, lengths=lengths: torch.ops.dsa.topk(x, 2048, lengths=lengths)]
        # (the table maps row r's column c to r * pt.shape[1] * 64 + c)
        want = window_topk(x, 2048).sort(dim=1).values
        shift = torch.arange(rows, device="cuda", dtype=torch.int32)[:, None] * (pt.shape[1] * 64)
        fns[1]()  # (the .out overload returns nothing: read `out`)
        same = bool(torch.equal((out - shift).sort(dim=1).values, want))
        plain, form, windowed = timer.graph_medians_us(fns, iters=100)
        line += (f" | {rows}x{n}{'' if dist == 'normal' else ' ' + dist} {plain:.3f} {form:.3f} {windowed:.3f}"
                 f" {form / plain:.3f} {form / windowed:.3f}" + ("" if same else " WRONG"))
        del x, fns
    print(line, flush=True)


def clusters():
    timer = Timer()
    torch.ops.dsa.topk(torch.randn(1, 4096, device="cuda"), 2048)  # (loads the library: topk_read_env)
    for rows, n in ((1, 131072), (20, 134868), (64, 131072), (256, 131072), (64, 1048576)):
        x = torch.randn(rows, n, device="cuda")
        line = f"{rows}x{n}:"
        for c in ("auto", "1", "2", "3", "4", "5", "6", "8"):  # (the heuristic takes powers of two only)
            if c == "auto":
                os.environ.pop("DSA_OPS_TOPK_CLUSTER", None)
            else:
                os.environ["DSA_OPS_TOPK_CLUSTER"] = c
            torch.ops.dsa_cuda.topk_read_env()  # (read at the first launch, then when told)
            line += f" | c={c} {timer.graph_median_us(lambda x=x: torch.ops.dsa.topk(x, 2048)):.1f}"
        os.environ.pop("DSA_OPS_TOPK_CLUSTER", None)
        torch.ops.dsa_cuda.topk_read_env()
        print(line, flush=True)


def seeded():
    """Decode rows as bench_topk.py makes them (topk_cases.make_scores, normal), one figure a seed: how much
    of a decode row's time is its input (the bench times seed 0 only)."""
    timer = Timer()
    for rows, n in ((1, 131072), (20, 134868)):
        line = f"{rows}x{n}:"
        for seed in range(8):
            x = make_scores(rows, n, "float32", "normal", seed=seed)
            line += f" | s{seed} {timer.graph_median_us(lambda x=x: torch.ops.dsa.topk(x, 2048)):.2f}"
        print(line, flush=True)


def _forms(x, lengths, zeros, pt, out):
    return {"topk": lambda: torch.ops.dsa.topk(x, 2048),
            "lengths": lambda: torch.ops.dsa.topk(x, 2048, lengths=lengths),
            "ragged": lambda: torch.ops.dsa.topk_ragged_transform(x, zeros, lengths, 2048),
            "table": lambda: torch.ops.dsa.topk_page_table_transform.out(x, pt, lengths, 2048, page_size=64, out=out)}


def parts():
    """Where the page-table form's extra time goes: each shape's topk, topk with full `lengths` (the
    window's load at the row's start), the ragged form (lengths and an offset load, no table) and the
    page-table form (lengths and a table lookup an output), as bench_topk.py times them. One line."""
    timer = Timer()
    line = os.environ.get("DSA_OPS_CUDA_LIB", "built library")
    for rows, n in ((4096, 32768), (16384, 65536), (4096, 131072), (256, 131072), (1, 131072), (20, 134868)):
        x = torch.randn(rows, n, device="cuda")
        pt, lengths = page_table_args(rows, n)
        zeros = torch.zeros(rows, dtype=torch.int32, device="cuda")
        out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
        time = timer.graph_median_us if rows <= 64 else timer.median_us
        forms = _forms(x, lengths, zeros, pt, out)
        line += f" | {rows}x{n} " + " ".join(f"{name} {time(fn):.2f}" for name, fn in forms.items())
    print(line, flush=True)


def widths():
    """One line: topk (k 2048, fp32) on the one-CTA rows' shapes around the narrow kernel's bounds:
    4096 rows of 12K to 64K keys, 256 to 2048 rows of 32K keys, 512 and 1024 rows of 12K to 64K."""
    timer = Timer()
    line = os.environ.get("DSA_OPS_CUDA_LIB", "built library")
    for rows, n in ((4096, 12288), (4096, 16384), (4096, 24576), (4096, 32768), (4096, 40960), (4096, 49152),
                    (4096, 57344), (4096, 65536), (256, 32768), (400, 32768), (512, 32768), (1024, 32768),
                    (2048, 32768), (512, 12288), (512, 49152), (512, 65536), (1024, 65536)):
        x = torch.randn(rows, n, device="cuda")
        line += f" | {rows}x{n} {timer.median_us(lambda x=x: torch.ops.dsa.topk(x, 2048)):.2f}"
    print(line, flush=True)


def adversarial(shape="4096x32768"):
    """One line: topk (k 2048, fp32) at `shape` for each of the tests' generators, checked exact."""
    from dsa_ops.testing import TOPK_DISTRIBUTIONS

    rows, n = (int(v) for v in shape.split("x"))
    timer = Timer()
    line = os.environ.get("DSA_OPS_CUDA_LIB", "built library") + f" {shape}"
    for dist in TOPK_DISTRIBUTIONS:
        x = make_scores(rows, n, "float32", dist)
        same = bool(torch.equal(torch.ops.dsa.topk(x, 2048).sort(dim=1).values,
                                window_topk(x, 2048).sort(dim=1).values))
        line += f" | {dist} {timer.median_us(lambda x=x: torch.ops.dsa.topk(x, 2048)):.1f}" + ("" if same else " WRONG")
        del x
    print(line, flush=True)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    modes = {"clusters": clusters, "shapes": shapes, "ptt": lambda: shapes(ptt=True),
             "ptt_decode": lambda: shapes(ptt=True, decode_only=True), "pairs": pairs, "seeded": seeded, "parts": parts,
             "widths": widths, "adversarial": lambda: adversarial(*sys.argv[2:3])}
    modes.get(mode, by_k)()
