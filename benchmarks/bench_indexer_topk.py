"""indexer_topk: dsa.indexer_topk (the dense route: dsa.indexer_logits then dsa.topk) against
dsa.indexer_logits alone and DeepGEMM's fp8_mqa_logits followed by vLLM's faster prefill top-k
(top_k_per_row_prefill or persistent_topk) when .peer/ holds them (optional; the reason is printed when
not).

Cases: 4096 rows, k 2048, D 128, fp8, precise=False: 131072 keys at H 64 (full, causal) and H 32 (full),
32768 keys at H 64 (full, causal). About 1 min on the H200.

    python -m pytest benchmarks/bench_indexer_topk.py -m gpu -q -s --dsa-results /tmp/itopk.json
"""

from __future__ import annotations

import functools
import lzma
import os
import shutil
import tempfile

import pytest
import torch
from bench_indexer_logits import _inputs as _logits_inputs
from bench_indexer_logits import deep_gemm
from harness import record

pytestmark = pytest.mark.gpu
FP8 = torch.float8_e4m3fn
D, K = 128, 2048
_VLLM_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".peer", "vllm")


@functools.lru_cache(maxsize=1)
def _vllm_library():
    """(the path of vLLM's library in .peer/vllm, loaded into torch.ops, None), or (None, why). The library is
    unpacked from its .xz copy into a temp dir when needed; loaded once a process, for every bench here."""
    names = ("_C_stable_libtorch.abi3.so", "_C_sm90.abi3.so")
    so = next((os.path.join(_VLLM_DIR, n) for n in names if os.path.exists(os.path.join(_VLLM_DIR, n))), None)
    if so is None:
        packed = next((os.path.join(_VLLM_DIR, n + ".xz") for n in names
                       if os.path.exists(os.path.join(_VLLM_DIR, n + ".xz"))), None)
        if packed is None:
            return None, f"no vLLM library in {_VLLM_DIR}"
        so = os.path.join(tempfile.mkdtemp(prefix="vllm_"), "_C_stable_libtorch.abi3.so")
        with lzma.open(packed) as src, open(so, "wb") as dst:
            shutil.copyfileobj(src, dst)
    try:
        torch.ops.load_library(so)
    except Exception as e:  # noqa: BLE001  (an optional peer: its absence is printed, not fatal)
        return None, f"load {so}: {type(e).__name__}: {str(e)[:200]}"
    return so, None


@functools.lru_cache(maxsize=None)
def vllm_ops(*kernels: str):
    """(torch.ops._C holding vLLM's `kernels`, None) from .peer/vllm, or (None, why)."""
    so, why = _vllm_library()
    if so is None:
        return None, why
    ops = torch.ops._C
    try:
        for name in kernels:
            getattr(ops, name)  # each must resolve
    except Exception as e:  # noqa: BLE001  (an optional peer: its absence is printed, not fatal)
        return None, f"load {so}: {type(e).__name__}: {str(e)[:200]}"
    return ops, None


def _inputs(t, n, h, windows):
    """bench_indexer_logits' fp8 inputs of a case: q, kv, kv_scale, weights, ks, ke."""
    return _logits_inputs(t, n, h, FP8, windows)


CASES = [
    # (T, N, H, windows)
    (4096, 131072, 64, "full"),
    (4096, 131072, 64, "causal"),
    (4096, 131072, 32, "full"),
    (4096, 32768, 64, "full"),
    (4096, 32768, 64, "causal"),
]


def _peer_us(bench, args, n, label):
    """DeepGEMM logits + vLLM's faster prefill top-k (us), and each part, or None with the reason printed."""
    q, kv, s, w, ks, ke = args
    dg, why = deep_gemm()
    vops, why_v = vllm_ops("persistent_topk", "top_k_per_row_prefill")
    if dg is None or vops is None:
        print(f"\n  {label}: peer baseline skipped: {why or why_v}")
        return None
    try:
        logits = dg.fp8_fp4_mqa_logits(q, None, kv, s, w, ks, ke, n, None)
        dg_us = bench.timer.median_us(lambda: dg.fp8_fp4_mqa_logits(q, None, kv, s, w, ks, ke, n, None), warmup=2,
                                      iters=10)
        t = q.shape[0]
        out = torch.empty((t, K), dtype=torch.int32, device="cuda")
        ws = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        lens = (ke - ks).int()
        tops = {
            "top_k_per_row_prefill": lambda: vops.top_k_per_row_prefill(logits, ks, ke, out, t, logits.stride(0),
                                                                         logits.stride(1), K),
            "persistent_topk": lambda: vops.persistent_topk(logits, lens, out, ws, K, n),
        }
        top_us = {}
        for name, fn in tops.items():
            try:
                top_us[name] = bench.timer.median_us(fn, warmup=2, iters=10)
            except Exception as e:  # noqa: BLE001
                print(f"\n  {label}: vllm {name} failed: {type(e).__name__}: {str(e)[:200]}")
        if not top_us:
            return None
        best = min(top_us, key=top_us.get)
        return {"deepgemm_logits": dg_us, f"vllm_{best}": top_us[best], "deepgemm+vllm": dg_us + top_us[best]}
    except Exception as e:  # noqa: BLE001
        print(f"\n  {label}: peer baseline failed: {type(e).__name__}: {str(e)[:300]}")
        return None


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c[0]}-N{c[1]}-H{c[2]}-{c[3]}")
def test_indexer_topk(bench, case):
    t, n, h, windows = case
    args = _inputs(t, n, h, windows)
    label = f"indexer_topk {case}"
    op_us = bench.timer.median_us(lambda: torch.ops.dsa.indexer_topk(*args, K), warmup=2, iters=10)
    logits_us = bench.timer.median_us(lambda: torch.ops.dsa.indexer_logits(*args), warmup=2, iters=10)
    baselines = {"indexer_logits": logits_us}
    peer = _peer_us(bench, args, n, label)
    if peer is not None:
        baselines.update(peer)
    print(f"\n  {label}: indexer_topk {op_us:.1f} us, indexer_logits {logits_us:.1f} us "
          f"(ratio {op_us / logits_us:.3f})"
          + (f", deepgemm+vllm {peer['deepgemm+vllm']:.1f} us ({peer['deepgemm+vllm'] / op_us:.2f}x)" if peer else ""))
    case_d = {"rows": t, "keys": n, "heads": h, "head_dim": D, "k": K, "dtype": "fp8_e4m3", "windows": windows,
              "precise": False, "exact": True}
    bench.add(record("indexer_topk", "triton_dense_route", case_d, op_us, baselines=baselines,
                     ratio_to_indexer_logits=round(op_us / logits_us, 3)))
