"""The CUDA top-k providers' calls into the compiled entry (backends_cuda/providers_topk.py), without a GPU:
which kernel each form asks for. (The C++ route, csrc/topk_route.cpp, mirrors them; the GPU tests run it.)"""

from collections import namedtuple

import torch
from dsa_ops.backends.cuda import providers_topk

Provider = namedtuple("Provider", "op backend fn supports available")


def _providers_with_recorder():
    calls = []

    def entry(*args):
        calls.append(args)

    providers = providers_topk.register_topk(Provider, lambda p: None, lambda name, device: entry, lambda d: None)
    return providers, calls


def test_ragged_form_asks_for_the_filter_kernel():
    # (topk_out's 5th argument is `deterministic`: False runs the filter kernel, True the ordered one,
    # which took 4x the filter kernel's time on the H200; the ragged form has no order flag to honour)
    providers, calls = _providers_with_recorder()
    scores = torch.zeros(2, 8)
    lengths, offsets = torch.full((2,), 8, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    out = providers["topk_ragged_transform"].fn(scores, offsets, lengths, 4, None, False)
    assert out.shape == (2, 4) and out.dtype == torch.int32
    (args,) = calls
    assert args[4] is False  # deterministic
    assert args[9] is offsets  # the ragged form's offsets


def test_topk_passes_its_order_flag_through():
    providers, calls = _providers_with_recorder()
    scores = torch.zeros(2, 8)
    for deterministic in (False, True):
        providers["topk"].fn(scores, 4, None, None, deterministic, False)
        assert calls[-1][4] is deterministic


def test_every_form_passes_nan_first_through():
    # (topk_out's 13th argument is `nan_first`: NaN's key 0xFFFFFFFF instead of 0 in both kernels)
    providers, calls = _providers_with_recorder()
    scores, table = torch.zeros(2, 8), torch.zeros(2, 1, dtype=torch.int32)
    lengths, offsets = torch.full((2,), 8, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    out = torch.empty(2, 4, dtype=torch.int32)
    for nan_first in (True, False):
        providers["topk"].fn(scores, 4, None, None, False, nan_first)
        providers["topk_page_table_transform"].fn(scores, table, lengths, 4, None, None, None, 64, True, nan_first,
                                                  out, None)
        providers["topk_ragged_transform"].fn(scores, offsets, lengths, 4, None, nan_first)
        assert [c[12] for c in calls[-3:]] == [nan_first] * 3
