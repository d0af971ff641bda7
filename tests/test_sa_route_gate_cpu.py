"""The C++ fast check of dsa.sparse_attention's CUDA-key kernels (backends_cuda/csrc/sparse_attention_route.cpp), on
the CPU, against the Python path's decision (tests/route_gate_helpers.py): the kernels may serve a call without Python
only when the op's validate (and, for .out, its out checks) pass and the cuda provider's unsupported_shape accepts it
(fp8 caches; a capture is the router's, which a CPU build never sees).
"""

from __future__ import annotations

import textwrap

import pytest
from route_gate_helpers import check_agreement, run_gate

SCRIPT = textwrap.dedent(
    r"""
    import importlib
    from dsa_ops.backends.cuda import providers_sparse_attention as cu
    S = importlib.import_module("dsa_ops.ops.sparse_attention")
    ns, route_set, libs = build_route("sparse_attention", "sparse_attention_route.cpp", "SA", '''
    #include "sparse_attention_out.h"
    using torch::stable::Tensor;
    void dsa_cuda_binding::sparse_attention_out(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, double, double,
                                                double, int64_t, int64_t, int64_t, Tensor, Tensor) {
      STD_TORCH_CHECK(false, "STUB_LAUNCH");
    }
    ''')
    FN, OUT = ns.sparse_attention, ns.sparse_attention.out
    FP8, BF16, I32 = torch.float8_e4m3fn, torch.bfloat16, torch.int32

    def base(t=4, hq=24, hkv=2, d=128, nb=8, page=64, topk=256, dtype=FP8):
        return dict(q=torch.zeros((t, hq, d), dtype=BF16), k=torch.empty((nb, page, hkv, d), dtype=dtype),
                    v=torch.empty((nb, page, hkv, d), dtype=dtype), idx=torch.zeros((t, topk), dtype=I32),
                    bt=torch.zeros((3, 16), dtype=I32), t2r=torch.zeros(t, dtype=I32))

    b = base()
    kv = torch.empty((8, 2, 64, 256), dtype=FP8)  # vLLM's [pages, Hkv, P, 2 D] buffer: K and V views
    kv_k, kv_v = kv.transpose(1, 2)[..., :128], kv.transpose(1, 2)[..., 128:]
    qbuf = torch.zeros(4 * 24 * 128 + 8, dtype=BF16)
    cbuf = torch.empty(8 * 64 * 2 * 128 + 8, dtype=FP8)
    cases = {
        "plain": b,
        "vllm-views": with_(b, k=kv_k, v=kv_v),
        "rows-1": base(t=1),
        "rows-0": base(t=0),
        "rows-100": base(t=100),
        "topk-0": base(topk=0),
        "group-16": base(hq=32, hkv=2),
        "mqa": base(hq=8, hkv=1),
        "idx-strided": with_(b, idx=torch.zeros((4, 512), dtype=I32)[:, ::2]),
        "t2r-strided": with_(b, t2r=torch.zeros(8, dtype=I32)[::2]),
        "bf16-cache": base(dtype=BF16),
        "group-32": base(hq=64, hkv=2),
        "head-dim-64": base(d=64),
        "hq-not-multiple": base(hq=25, hkv=2),
        "q-float": with_(b, q=b["q"].float()),
        "q-offset": with_(b, q=qbuf[1:1 + 4 * 24 * 128].view(4, 24, 128)),
        "q-heads-strided-8B": with_(b, q=torch.zeros((4, 24, 132), dtype=BF16)[..., :128]),
        "q-heads-strided-16B": with_(b, q=torch.zeros((4, 24, 136), dtype=BF16)[..., :128]),
        "k-offset-8": with_(b, k=cbuf[8:].view(8, 64, 2, 128)),
        "k-offset-16": with_(b, k=torch.empty(8 * 64 * 2 * 128 + 16, dtype=FP8)[16:].view(8, 64, 2, 128)),
        "k-offset-1": with_(b, k=cbuf[1:1 + 8 * 64 * 2 * 128].view(8, 64, 2, 128)),
        "k-last-stride": with_(b, k=torch.empty((8, 64, 2, 128, 2), dtype=FP8)[..., 0]),
        "v-dtype": with_(b, v=b["v"].view(torch.uint8)),
        "v-shape": with_(b, v=torch.empty((8, 64, 2, 64), dtype=FP8)),
        "v-blocks": with_(b, v=torch.empty((9, 64, 2, 128), dtype=FP8)),
        "idx-rows": with_(b, idx=torch.zeros((5, 256), dtype=I32)),
        "idx-int64": with_(b, idx=b["idx"].long()),
        "bt-1d": with_(b, bt=torch.zeros(16, dtype=I32)),
        "bt-int64": with_(b, bt=b["bt"].long()),
        "t2r-rows": with_(b, t2r=torch.zeros(5, dtype=I32)),
        "t2r-2d": with_(b, t2r=torch.zeros((4, 1), dtype=I32)),
        "positions-past-int32": with_(b, bt=torch.empty((1, 2**25 + 1), dtype=I32)),
    }

    def python_serves(c, out=None):
        a = (c["q"], c["k"], c["v"], c["idx"], c["bt"], c["t2r"], 1.0, 1.0, 1.0)
        try:
            S.validate(*a)
            if out is not None:
                S._check_outs(*a, out)
        except DsaArgumentError:
            return False
        return cu.unsupported_shape(c["q"], c["k"], c["v"], c["idx"], c["bt"]) is None

    results = {}
    for name, c in cases.items():
        a = (c["q"], c["k"], c["v"], c["idx"], c["bt"], c["t2r"])
        results[name] = [route(lambda: FN(*a, softmax_scale=1.0)), python_serves(c)]
        out = torch.empty((c["q"].shape[0], c["q"].shape[1], c["v"].shape[3]), dtype=BF16)
        results[name + ".out"] = [route(lambda: OUT(*a, softmax_scale=1.0, out=out)), python_serves(c, out)]
    q, k, v, idx, bt, t2r = (b[n] for n in ("q", "k", "v", "idx", "bt", "t2r"))
    big = torch.zeros(2 * 4 * 24 * 128, dtype=BF16)
    outs = {
        "out-is-q": q,
        "out-rows-strided": big.view(8, 24, 128)[::2],
        "out-heads-overlap": torch.zeros(4 * 128 + 24 * 128, dtype=BF16).as_strided((4, 24, 128), (128, 128, 1)),
        "out-float": torch.empty((4, 24, 128)),
        "out-shape": torch.empty((4, 24, 64), dtype=BF16),
        "out-last-stride": torch.empty((4, 24, 128, 2), dtype=BF16)[..., 0],
    }
    for name, o in outs.items():
        results[name] = [route(lambda: OUT(q, k, v, idx, bt, t2r, softmax_scale=1.0, out=o)),
                         python_serves(b, o)]
    raw = torch.empty(4 * 24 * 128 * 2, dtype=torch.uint8)
    o, t2r_in_out = raw.view(BF16).view(4, 24, 128), raw[-16:].view(I32)  # t2r on out's last 16 bytes
    results["out-over-t2r"] = [route(lambda: OUT(q, k, v, idx, bt, t2r_in_out, softmax_scale=1.0, out=o)),
                               python_serves(with_(b, t2r=t2r_in_out), o)]
    route_set(0)
    results["mask-off"] = [route(lambda: FN(q, k, v, idx, bt, t2r, softmax_scale=1.0)), True]
    print("RESULTS " + json.dumps(results))
    """
)

SERVED = ["plain", "vllm-views", "rows-1", "rows-0", "rows-100", "topk-0", "group-16", "mqa", "idx-strided",
          "t2r-strided", "q-heads-strided-16B", "k-offset-16"]
SERVED += [n + ".out" for n in SERVED] + ["out-rows-strided"]


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    return run_gate(SCRIPT, tmp_path_factory)


def test_the_cpp_check_agrees_with_the_python_path(gate):
    check_agreement(gate, SERVED)
