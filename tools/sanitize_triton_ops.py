"""The Triton kernels of dequant_k_cache_paged, sparse_attention and sparse_mla_decode once each on small,
hostile shapes (NaN-filled unused cache slots, invalid indices), every path forced, each result checked
against the reference: the script compute-sanitizer (memcheck, racecheck) walks for these ops.

    compute-sanitizer --tool memcheck --error-exitcode 9 python tools/sanitize_triton_ops.py
"""

import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import dequant_cases  # noqa: E402
import sparse_attention_cases  # noqa: E402
import sparse_mla_decode_cases  # noqa: E402
from dsa_ops.backends.triton import dequant_k_cache_paged as tdq  # noqa: E402
from dsa_ops.backends.triton import sparse_attention as tsa  # noqa: E402
from dsa_ops.backends.triton import sparse_mla_decode as tmla  # noqa: E402

# The op modules (dsa_ops.ops re-exports each op's function under the module's name).
dq, sa, mla = (importlib.import_module(f"dsa_ops.ops.{m}")
               for m in ("dequant_k_cache_paged", "sparse_attention", "sparse_mla_decode"))

dev = "cuda"
ran = []

for layout in ("v32", "v4"):
    cache = dequant_cases.make_cache(layout, 6, 16, pad=32, seed=1, device=dev)
    slots = dequant_cases.make_slots(6, 16, 77, seed=2, device=dev)
    got = tdq.launch(cache, slots, layout)
    assert dequant_cases.bit_mismatch(got, dq.reference(cache, slots, layout)) == "", layout
    ran.append(f"dequant_k_cache_paged[{layout}]")

for dtype in (torch.float8_e4m3fn, torch.bfloat16):
    args = sparse_attention_cases.make_case(37, 8, 2, 64, 64, page=16, num_blocks=24, num_reqs=3, max_pages=6,
                                            topk=80, dtype=dtype, seed=3, device=dev)
    ref = sa.reference(*args, 0.125, 1.0, 1.0)
    for split in (False, True):
        out = torch.full_like(ref, float("nan"))
        tsa.launch(*args, 0.125, 1.0, 1.0, out, split=split)
        bad = sparse_attention_cases.compare(out, ref)
        assert bad is None, bad
        ran.append(f"sparse_attention[{str(dtype)[6:]}, split={split}]")

for layout in ("v32", "v4"):
    q, cache, idx, lens, sink = sparse_mla_decode_cases.make_case(layout, 2, 2, 64, 96, lens=[50, 96], device=dev)
    want = mla.reference(q, cache, idx, 0.07, layout, lens, sink)
    for split in (False, True):
        out, lse = tmla.launch(q, cache, idx, 0.07, layout, lens, sink, split=split)
        torch.testing.assert_close(out.float(), want[0].float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse, want[1], atol=1e-4, rtol=1e-4)
        ran.append(f"sparse_mla_decode[{layout}, split={split}]")

torch.cuda.synchronize()
print("sanitize_triton_ops ran:", ", ".join(ran))
