"""The C++ fast check of dsa.paged_indexer_logits' CUDA-key kernel (backends_cuda/csrc/paged_indexer_logits_route.cpp),
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
    from dsa_ops.backends.cuda import providers_paged_indexer as cu
    P = importlib.import_module("dsa_ops.ops.paged_indexer_logits")
    ns, route_set, libs = build_route("paged_indexer_logits", "paged_indexer_logits_route.cpp", "PAGED", '''
    #include "paged_indexer_logits_out.h"
    using torch::stable::Tensor;
    void dsa_cuda_binding::paged_indexer_logits_out(Tensor, Tensor, Tensor, Tensor, Tensor, int64_t, bool, bool,
                                                    int64_t, Tensor) {
      STD_TORCH_CHECK(false, "STUB_LAUNCH");
    }
    ''')
    OP = ns.paged_indexer_logits
    FP8, I32 = torch.float8_e4m3fn, torch.int32

    def base(b=4, next_n=1, h=64, d=128, nb=16, max_blocks=8, max_len=512):
        return dict(q=torch.zeros((b, next_n, h, d), dtype=FP8), kv=torch.empty((nb, 64, 1, d + 4), dtype=torch.uint8),
                    w=torch.zeros((b * next_n, h)), lens=torch.zeros(b, dtype=I32),
                    bt=torch.zeros((b, max_blocks), dtype=I32), max_len=max_len, precise=False)

    b = base()
    qbuf = torch.zeros(4 * 64 * 128 + 16, dtype=FP8)
    cases = {
        "plain": b,
        "next_n-2": base(next_n=2),
        "h32": base(h=32),
        "h32-next_n-4": base(h=32, next_n=4),
        "precise": with_(b, precise=True),
        "batch-0": base(b=0),
        "max_len-0": with_(b, max_len=0),
        "no-blocks": base(nb=0),
        "one-block": base(nb=1),
        "w-transposed": with_(b, w=torch.zeros((64, 4)).t()),
        "lens-strided": with_(b, lens=torch.zeros(8, dtype=I32)[::2]),
        "bt-strided": with_(b, bt=torch.zeros((4, 16), dtype=I32)[:, ::2]),
        "q-offset-16": with_(b, q=qbuf[16:].view(4, 1, 64, 128)),
        "q-offset-8": with_(b, q=qbuf[8:8 + 4 * 64 * 128].view(4, 1, 64, 128)),
        "q-bf16": with_(b, q=torch.zeros((4, 1, 64, 128), dtype=torch.bfloat16)),
        "q-3d": with_(b, q=torch.zeros((4, 64, 128), dtype=FP8)),
        "q-last-stride": with_(b, q=torch.zeros((4, 1, 64, 128, 2), dtype=FP8)[..., 0]),
        "h48": base(h=48),
        "d64": base(d=64),
        "kv-int8": with_(b, kv=b["kv"].view(torch.int8)),
        "kv-block-32": with_(b, kv=torch.empty((16, 32, 1, 132), dtype=torch.uint8)),
        "kv-width": with_(b, kv=torch.empty((16, 64, 1, 128), dtype=torch.uint8)),
        "kv-block-stride-8": with_(b, kv=torch.empty((16, 64 * 132 + 8), dtype=torch.uint8)[:, :64 * 132].view(
            16, 64, 1, 132)),
        "kv-block-stride-16": with_(b, kv=torch.empty((16, 64 * 132 + 16), dtype=torch.uint8)[:, :64 * 132].view(
            16, 64, 1, 132)),
        "kv-offset": with_(b, kv=torch.empty(16 * 64 * 132 + 1, dtype=torch.uint8)[1:].view(16, 64, 1, 132)),
        "w-shape": with_(b, w=torch.zeros((4, 32))),
        "w-bf16": with_(b, w=torch.zeros((4, 64), dtype=torch.bfloat16)),
        "lens-shape": with_(b, lens=torch.zeros(3, dtype=I32)),
        "lens-int64": with_(b, lens=torch.zeros(4, dtype=torch.int64)),
        "bt-rows": with_(b, bt=torch.zeros((3, 8), dtype=I32)),
        "bt-int64": with_(b, bt=torch.zeros((4, 8), dtype=torch.int64)),
        "next_n-1025": base(b=1, next_n=1025, max_len=64),
        "max_len-2^31": with_(b, max_len=2**31 - 1000),
        "max_len-negative": with_(b, max_len=-1),
    }

    def python_serves(c):
        try:
            P.validate(c["q"], c["kv"], c["w"], c["lens"], c["bt"], c["max_len"], True, c["precise"])
        except DsaArgumentError:
            return False
        return cu.unsupported_shape(c["q"], c["kv"], c["max_len"]) is None

    def call(c):
        return lambda: OP(c["q"], c["kv"], c["w"], c["lens"], c["bt"], max_context_len=c["max_len"],
                          precise=c["precise"])

    results = {name: [route(call(c)), python_serves(c)] for name, c in cases.items()}
    route_set(0)
    results["mask-off"] = [route(call(b)), True]
    print("RESULTS " + json.dumps(results))
    """
)

SERVED = ["plain", "next_n-2", "h32", "h32-next_n-4", "precise", "batch-0", "max_len-0", "no-blocks", "one-block",
          "w-transposed", "lens-strided", "bt-strided", "q-offset-16", "kv-block-stride-16"]


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    return run_gate(SCRIPT, tmp_path_factory)


def test_the_cpp_check_agrees_with_the_python_path(gate):
    check_agreement(gate, SERVED)
