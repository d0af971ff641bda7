"""The Triton launchers on views the ops accept but the kernels do not index by stride, on CPU tensors under
TRITON_INTERPRET=1, against the reference: page_table_transform's row_to_batch strided and expanded (stride 0),
dequant_k_cache_paged's slots strided, sparse_attention's q / indices / block_table with a last stride of 2,
sparse_mla_decode's topk_lens and attn_sink strided. The launchers pass unit-last-stride copies of such views
(backends_triton/_launch.py, unit_last_stride); before, each of these read the wrong elements.
"""

from __future__ import annotations

import os
import textwrap

from triton_interpret_runner import run_interpreted

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent(
    r"""
    import json, sys
    sys.path.insert(0, TESTS_DIR)
    import _triton_interpreter_compat  # noqa: F401
    import torch
    import dsa_ops
    from dsa_ops.backends.triton import (dequant_k_cache_paged as dq, page_table_transform as ptt,
                                         sparse_attention as sa, sparse_mla_decode as mla)

    def i32(*v):
        return torch.tensor(v, dtype=torch.int32)

    g = torch.Generator().manual_seed(0)
    results = {}

    def record(name, fn):
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001  (reported per case)
            results[name] = f"raised {type(e).__name__}: {e}"

    idx = torch.randint(0, 256, (4, 8), generator=g, dtype=torch.int32)
    pt = torch.randint(0, 50, (3, 4), generator=g, dtype=torch.int32)
    for name, rtb in (("strided", i32(2, 9, 0, 9, 1, 9, 2, 9)[::2]), ("expanded", i32(1).expand(4))):
        def run(rtb=rtb):
            out = torch.full_like(idx, 12345)
            ptt.launch(idx, pt, rtb, None, 64, out)
            want = dsa_ops.page_table_transform(idx, pt, row_to_batch=rtb.contiguous())
            return "ok" if torch.equal(out, want) else f"differs at {int((out != want).sum())} entries"
        record(f"page_table_transform-row_to_batch-{name}", run)

    cache = torch.randint(0, 100, (3, 4, 1, 656), generator=g, dtype=torch.uint8)
    slots = i32(0, -1, 5, -1, 11, -1)[::2]

    def run_dequant():
        out = dq.launch(cache, slots, "v32")
        want = dsa_ops.dequant_k_cache_paged(cache, slots.contiguous(), layout="v32")
        return "ok" if torch.equal(out.view(torch.int16), want.view(torch.int16)) else "differs"
    record("dequant-slots-strided", run_dequant)

    kc = torch.randn(3, 4, 2, 16, generator=g).bfloat16()
    vc = torch.randn(3, 4, 2, 16, generator=g).bfloat16()
    q = torch.randn(2, 2, 16, generator=g).bfloat16()
    ind, bt, t2r = i32(0, 5, 3, 1).view(2, 2), i32(0, 2, 1)[None], i32(0, 0)
    views = {"q": (q.transpose(1, 2).contiguous().transpose(1, 2), ind, bt),
             "indices": (q, torch.stack([ind, ind * 0 + 7], -1)[..., 0], bt),
             "block_table": (q, ind, torch.stack([bt, bt * 0 - 1], -1)[..., 0])}
    for name, (qq, ii, bb) in views.items():
        def run(qq=qq, ii=ii, bb=bb):
            want = dsa_ops.sparse_attention(qq.contiguous(), kc, vc, ii.contiguous(), bb.contiguous(), t2r,
                                            softmax_scale=0.25)
            out = torch.full_like(want, float("nan"))
            sa.launch(qq, kc, vc, ii, bb, t2r, 0.25, 1.0, 1.0, out)
            err = (out.float() - want.float()).abs().max().item()
            return "ok" if err <= 2 ** -7 * want.float().abs().max().item() else f"max error {err:.3g}"
        record(f"sparse_attention-{name}-last-stride-2", run)

    kv = torch.zeros(2, 64, 1, 656, dtype=torch.uint8)
    kv[..., :512] = torch.randn(2, 64, 1, 512, generator=g).to(torch.float8_e4m3fn).view(torch.uint8)
    kv[..., 512:528] = torch.full((2, 64, 1, 4), 0.5).view(torch.uint8)
    kv[..., 528:] = torch.randn(2, 64, 1, 64, generator=g).bfloat16().view(torch.uint8)
    qm = torch.randn(2, 1, 2, 576, generator=g).bfloat16()
    mi = torch.randint(0, 128, (2, 1, 8), generator=g, dtype=torch.int32)
    lens, sink = i32(8, 0, 2, 0)[::2], torch.tensor([0.5, 99.0, -1.0, 99.0])[::2]

    def run_mla():
        ro, rl = dsa_ops.sparse_mla_decode(qm, kv, mi, softmax_scale=0.04, topk_lens=lens.contiguous(),
                                           attn_sink=sink.contiguous())
        o, lse = mla.launch(qm, kv, mi, 0.04, "v32", lens, sink)
        err = (o.float() - ro.float()).abs().max().item()
        lerr = (lse - rl).abs().nan_to_num(0.0).max().item()
        same_inf = torch.equal(torch.isinf(lse), torch.isinf(rl))
        ok = err <= 2 ** -7 * ro.float().abs().max().item() and lerr <= 1e-5 and same_inf
        return "ok" if ok else f"out error {err:.3g}, lse error {lerr:.3g}, inf where the reference: {same_inf}"
    record("sparse_mla_decode-topk_lens-attn_sink-strided", run_mla)
    print("RESULTS " + json.dumps(results))
    """
).replace("TESTS_DIR", repr(TESTS_DIR))


def test_triton_launchers_take_strided_metadata():
    results = run_interpreted(SCRIPT, timeout=900)
    bad = {k: v for k, v in results.items() if v != "ok"}
    assert len(results) == 7 and not bad, bad
