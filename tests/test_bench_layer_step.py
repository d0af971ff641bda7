"""benchmarks/bench_layer_step.py's device-free parts: the floor's byte count, the tie-agnostic check of a
peer's top-k, the per-step lines; and that the bench module imports without a GPU."""

from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_layer_step as b  # noqa: E402


def test_floor_counts_the_indexer_cache_the_scores_twice_and_the_selected_tokens():
    # batch 64, s_q 1, 65536 tokens: 64 x 65536 x 132 + 2 x 64 x 65536 x 4 + 64 x 2048 x 656
    assert b.floor_bytes(64, 1, 65536, 2048) == 553_648_128 + 33_554_432 + 85_983_232
    assert b.floor_bytes(2, 2, 100, 10) == 2 * 100 * 132 + 2 * 4 * 100 * 4 + 4 * 10 * 656


def test_topk_value_check_ignores_ties_and_order_but_not_values():
    scores = torch.tensor([[5.0, 1.0, 5.0, 3.0, float("-inf")], [0.0, 2.0, 2.0, 7.0, 1.0]])
    want = torch.tensor([[0, 3], [3, 1]], dtype=torch.int32)
    tie_and_order = torch.tensor([[3, 2], [2, 3]], dtype=torch.int32)  # 5.0 at column 2 ties column 0
    assert b.topk_value_mismatches(scores, tie_and_order, want) == 0
    wrong = torch.tensor([[0, 1], [3, 1]], dtype=torch.int32)
    assert b.topk_value_mismatches(scores, wrong, want) == 1
    missing = torch.tensor([[0, -1], [3, 4]], dtype=torch.int32)
    assert b.topk_value_mismatches(scores, missing, want) == 2


def test_step_lines_put_ours_first_and_mark_the_peers():
    lines = b.step_lines({"paged_indexer_logits": 160.0, "sparse_mla_decode": 700.5},
                         {"deepgemm_logits": 150.25, "flashmla_sparse_decode": 108.0})
    assert [ln.split()[0] for ln in lines] == ["paged_indexer_logits", "sparse_mla_decode", "deepgemm_logits",
                                               "flashmla_sparse_decode"]
    assert lines[1].endswith("700.5 us") and lines[2].endswith("150.2 us (peers)")


def test_cases_are_the_issue_shapes():
    assert sorted(b.CASES) == [(64, 1), (64, 2), (128, 1), (128, 2)]
    assert (b.HEADS, b.CONTEXT, b.TOPK, b.INDEX_HEADS) == (128, 65536, 2048, 64)
