"""Smoke run of the cuda sparse_mla_decode provider: one small case per (layout, heads, path) against the
exact reference, one line each with the max errors, so a failure is easy to place from a log.

    python tools/smoke_sparse_mla_decode.py            # exits 1 if any case is off or NaN

Cases come from tests/sparse_mla_decode_cases.py (NaN-filled unused cache slots, invalid indices,
topk_lens cutting a request and a request of length 0, attn_sink).
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from sparse_mla_decode_cases import compare, make_case, oracle  # noqa: E402

SCALE = {"v32": 576**-0.5, "v4": 512**-0.5}


def main() -> int:
    from dsa_ops.backends import cuda
    from dsa_ops.backends.cuda import providers_sparse_mla_decode as pm

    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(dev)}, available: {cuda.available(dev) or 'yes'}", flush=True)
    t = time.perf_counter()
    print(f"library: {cuda.load(dev)} ({time.perf_counter() - t:.1f} s)", flush=True)
    failed = 0
    for layout in ("v32", "v4"):
        for heads in (64, 128):
            for splits in (1, 3):
                q, cache, idx, lens, sink = make_case(layout, 3, 2, heads, 512, page=64, num_blocks=24,
                                                      lens=[512, 300, 0], seed=heads + splits, device=dev)
                out = torch.full((3, 2, heads, 512), float("nan"), dtype=torch.bfloat16, device=dev)
                lse = torch.full((3, heads, 2), float("nan"), dtype=torch.float32, device=dev)
                name = f"{layout} heads={heads} splits={splits}"
                try:
                    pm.launch(q, cache, idx, SCALE[layout], layout, lens, sink, splits=splits, out=out, lse=lse)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001  (reported per case; the next case still runs)
                    print(f"{name}: FAILED to run: {type(e).__name__}: {e}", flush=True)
                    failed += 1
                    continue
                ro, rl, vmax = oracle(q, cache, idx, SCALE[layout], layout, lens, sink)
                fin = torch.isfinite(rl)
                oerr = (out.double() - ro).abs().max().item()
                lerr = ((lse.double() - rl).abs() / rl.abs().clamp(min=1))[fin].max().item()
                nan = int(torch.isnan(out).sum()) + int(torch.isnan(lse).sum())
                why = compare(out, lse, ro, rl, vmax)
                print(f"{name}: max |out err| {oerr:.3g} (max |out| {ro.abs().max().item():.3g}), "
                      f"max lse rel err {lerr:.3g}, NaN {nan}: {'ok' if why is None else 'FAIL ' + why}", flush=True)
                failed += why is not None
    print("smoke:", "ok" if failed == 0 else f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
