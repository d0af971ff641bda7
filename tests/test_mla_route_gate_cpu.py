"""The C++ fast check of dsa.sparse_mla_decode's CUDA-key kernel (backends_cuda/csrc/sparse_mla_decode_route.cpp),
on the CPU, against the Python path's decision (tests/route_gate_helpers.py): the kernel may serve a call without
Python only when the op's validate passes and the cuda provider's unsupported_shape accepts it.
"""

from __future__ import annotations

import textwrap

import pytest
from route_gate_helpers import check_agreement, run_gate

SCRIPT = textwrap.dedent(
    r"""
    import importlib
    from dsa_ops.backends.cuda import providers_sparse_mla_decode as mc
    M = importlib.import_module("dsa_ops.ops.sparse_mla_decode")
    ns, route_set, libs = build_route("sparse_mla_decode", "sparse_mla_decode_route.cpp", "MLA", '''
    #include "sparse_mla_decode_out.h"
    void dsa_cuda_binding::sparse_mla_decode_out(torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor,
        std::optional<torch::stable::Tensor>, std::optional<torch::stable::Tensor>, double, bool, int64_t,
        torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor, int64_t) {
      STD_TORCH_CHECK(false, "STUB_LAUNCH");
    }
    ''')
    OP = ns.sparse_mla_decode

    BPT = {"v32": 656, "v4": 584}
    DIM = {"v32": 576, "v4": 512}

    def base(layout="v32", b=2, s_q=1, h=64, topk=128, nb=4, page=64):
        q = torch.zeros((b, s_q, h, DIM[layout]), dtype=torch.bfloat16)
        kv = torch.empty((nb, page, 1, BPT[layout]), dtype=torch.uint8)  # metadata only: never read
        idx = torch.zeros((b, s_q, topk), dtype=torch.int32)
        return dict(q=q, kv=kv, idx=idx, layout=layout, lens=None, sink=None)

    def padded_pages(layout, pad, nb=4, page=64):
        buf = torch.zeros((nb, page * BPT[layout] + pad), dtype=torch.uint8)
        return buf[:, :page * BPT[layout]].view(nb, page, 1, BPT[layout])

    b32, b4 = base(), base("v4")
    qbuf = torch.zeros(2 * 64 * 580 + 8, dtype=torch.bfloat16)
    cases = {
        "plain": b32,
        "v4": b4,
        "extras": with_(b32, lens=torch.zeros(2, dtype=torch.int32), sink=torch.zeros(64)),
        "heads128": base(h=128),
        "batch0": base(b=0),
        "topk0": base(topk=0),
        "one-page": base(nb=1),
        "no-pages": base(nb=0),
        "pages-padded-16": with_(b32, kv=padded_pages("v32", 16)),
        "layout-v5": with_(b32, layout="v5"),
        "layout-v4-q576": with_(b32, layout="v4"),
        "q-float32": with_(b32, q=b32["q"].float()),
        "q-head-dim-512": with_(b32, q=b32["q"][..., :512]),
        "heads32": base(h=32),
        "q-rows-16B": with_(b32, q=torch.zeros((2, 1, 64, 584), dtype=torch.bfloat16)[..., :576]),
        "q-rows-8B": with_(b32, q=qbuf[: 2 * 64 * 580].view(2, 1, 64, 580)[..., :576]),
        "q-offset": with_(b32, q=qbuf[1: 1 + 2 * 64 * 576].view(2, 1, 64, 576)),
        "q-last-stride": with_(b32, q=torch.zeros((2, 1, 64, 576, 2), dtype=torch.bfloat16)[..., 0]),
        "kv-offset": with_(b32, kv=torch.zeros(4 * 64 * 656 + 1, dtype=torch.uint8)[1:].view(4, 64, 1, 656)),
        "pages-padded-8": with_(b32, kv=padded_pages("v32", 8)),
        "pages-overlap": with_(b32, kv=torch.zeros(5 * 64 * 656, dtype=torch.uint8).as_strided(
            (4, 64, 1, 656), (64 * 656 - 16, 656, 656, 1))),
        "kv-int8": with_(b32, kv=b32["kv"].view(torch.int8)),
        "kv-width": with_(b32, kv=torch.zeros((4, 64, 1, 600), dtype=torch.uint8)),
        "kv-two-heads": with_(b32, kv=torch.zeros((4, 64, 2, 656), dtype=torch.uint8)),
        "page-2^20+1": base(nb=1, page=2**20 + 1, topk=1),
        "idx-int64": with_(b32, idx=b32["idx"].long()),
        "idx-batch": with_(b32, idx=torch.zeros((3, 1, 128), dtype=torch.int32)),
        "idx-2d": with_(b32, idx=torch.zeros((2, 128), dtype=torch.int32)),
        "lens-shape": with_(b32, lens=torch.zeros(3, dtype=torch.int32)),
        "lens-int64": with_(b32, lens=torch.zeros(2, dtype=torch.int64)),
        "sink-shape": with_(b32, sink=torch.zeros(63)),
        "sink-double": with_(b32, sink=torch.zeros(64, dtype=torch.float64)),
        "sink-strided": with_(b32, sink=torch.zeros(128)[::2]),
        "lens-strided": with_(b32, lens=torch.zeros(4, dtype=torch.int32)[::2]),
        "idx-strided": with_(b32, idx=torch.zeros((2, 1, 256), dtype=torch.int32)[..., ::2]),
    }

    def python_serves(c):
        try:
            M.validate(c["q"], c["kv"], c["idx"], 1.0, c["layout"], c["lens"], c["sink"])
        except DsaArgumentError:
            return False
        return mc.unsupported_shape(c["q"], c["kv"], c["idx"], c["layout"], c["sink"]) is None

    results = {}
    for name, c in cases.items():
        kw = {k: v for k, v in (("topk_lens", c["lens"]), ("attn_sink", c["sink"])) if v is not None}
        results[name] = [route(lambda: OP(c["q"], c["kv"], c["idx"], softmax_scale=1.0, layout=c["layout"], **kw)),
                         python_serves(c)]
    route_set(0)
    results["mask-off"] = [route(lambda: OP(b32["q"], b32["kv"], b32["idx"], softmax_scale=1.0)), True]
    print("RESULTS " + json.dumps(results))
    """
)

SERVED = ["plain", "v4", "extras", "heads128", "batch0", "topk0", "one-page", "no-pages", "pages-padded-16",
          "q-rows-16B", "lens-strided", "idx-strided"]


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    return run_gate(SCRIPT, tmp_path_factory)


def test_the_cpp_check_agrees_with_the_python_path(gate):
    check_agreement(gate, SERVED)
