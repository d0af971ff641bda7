"""Dev tool: where the filter top-k kernel's time goes (H200). Driven by tools/profile_topk.sh.

    python tools/profile_topk.py build "-lineinfo"     # build a variant of the CUDA library, print its .so
    DSA_OPS_CUDA_LIB=<so> python tools/profile_topk.py run ROWS WIDTH [K]    # 3 calls (ncu target)
    DSA_OPS_CUDA_LIB=<so> python tools/profile_topk.py runpt ROWS WIDTH       # the same, page-table form
    DSA_OPS_CUDA_LIB=<trace so> python tools/profile_topk.py trace           # phase stamps, a few shapes
                                                  # (and the page-table form of 3, and topk with its lengths)
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))  # topk_cases


def build(flags: str, build_root=None) -> str:
    """Builds the CUDA library with `flags` added to nvcc's (in `build_root`, default the cache's), prints and
    returns its path."""
    from dsa_ops.backends import cuda

    base = cuda.build_spec

    def spec(arch):
        s = base(arch)
        s.cuda_cflags = s.cuda_cflags + flags.split()
        return s

    cuda.build_spec = spec
    path = cuda.build(verbose=False, build_root=build_root)
    print(path)
    return path


def run(rows: int, width: int, k: int = 2048, dtype=torch.float32) -> None:
    import dsa_ops  # noqa: F401

    x = torch.randn(rows, width, device="cuda", generator=torch.Generator("cuda").manual_seed(1)).to(dtype)
    for _ in range(3):
        torch.ops.dsa.topk(x, k)
    torch.cuda.synchronize()


def run_page_table(rows: int, width: int, k: int = 2048, lookups: bool = True) -> None:
    """As run(), the page-table form (page size 64, full lengths, out=) as bench_topk.py times it; with
    lookups=False, topk given the same lengths (the form's extra apart from the lookups)."""
    import dsa_ops  # noqa: F401
    from topk_cases import page_table_args

    x = torch.randn(rows, width, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    pt, lengths = page_table_args(rows, width)
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    for _ in range(3):
        if lookups:
            torch.ops.dsa.topk_page_table_transform.out(x, pt, lengths, k, page_size=64, out=out)
        else:
            torch.ops.dsa.topk(x, k, lengths=lengths)
    torch.cuda.synchronize()


def trace() -> None:
    # Each printed line: "trace <block> <phase> <SM cycles since the previous phase> <%globaltimer ns>".
    for rows, width, dtype in ((4096, 32768, torch.float32), (1, 131072, torch.float32), (20, 134868, torch.float32),
                               (64, 1048576, torch.float32), (4096, 131072, torch.float32),
                               (4096, 32768, torch.bfloat16), (1, 131072, torch.bfloat16)):
        print(f"# shape {rows}x{width}{'' if dtype == torch.float32 else 'bf16'}", flush=True)
        run(rows, width, dtype=dtype)
        if dtype == torch.float32 and rows in (1, 20, 4096) and width < 2**17 + 4096:  # and their page-table form
            print(f"# shape {rows}x{width}pt", flush=True)
            run_page_table(rows, width)
            print(f"# shape {rows}x{width}wl", flush=True)  # (topk with the same lengths)
            run_page_table(rows, width, lookups=False)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "build" and len(sys.argv) == 3:
        build(sys.argv[2])
    elif what == "run":
        run(*(int(a) for a in sys.argv[2:]))
    elif what == "runpt":
        run_page_table(*(int(a) for a in sys.argv[2:]))
    elif what == "trace":
        trace()
    else:
        sys.exit(f"mode {what!r}: expected build FLAGS, run ROWS WIDTH [K], runpt ROWS WIDTH or trace\n{__doc__}")
