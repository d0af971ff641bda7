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


class _Bench:
    """The bench fixture's interface with no device: median_us runs the function once."""

    def __init__(self):
        self.rows = []
        self.timer = self

    def median_us(self, fn, warmup=0, iters=1):
        fn()
        return 1.0

    def floor_us(self, nbytes):
        return nbytes / 4e6

    def add(self, row):
        self.rows.append(row)


class _Graph:
    def __init__(self, fn):
        fn()
        self.replay = fn


def _stand_ins(batch, s_q):
    """CPU stand-ins of the three peers, computing their contracts with dsa_ops' references."""
    from types import SimpleNamespace

    import dsa_ops
    from dsa_ops import demo

    def metadata(ctx2d, page, sms, indices):
        assert ctx2d.shape == (batch, s_q) and page == 64 and indices is None
        return torch.zeros((sms + 1, 2), dtype=torch.int32)

    def logits(q, q_sf, cache, w, ctx2d, table, meta, width, indices):
        assert q_sf is None and indices is None and meta.shape[1] == 2
        return dsa_ops.reference.paged_indexer_logits(q, cache, w, ctx2d[:, -1].contiguous(), table,
                                                      max_context_len=width)

    def persistent_topk(s, lengths, out, ws, k, width):
        assert ws.numel() == 1 << 20 and width == s.shape[1]
        out.copy_(torch.ops.dsa.topk(s, k, lengths=lengths))

    def top_k_per_row_decode(s, next_n, seq_lens, out, rows, stride0, stride1, k):
        assert rows == s.shape[0] and (stride0, stride1) == s.stride()
        out.copy_(torch.ops.dsa.topk(s, k, lengths=demo.decode_rows(seq_lens, next_n)[0]))

    def sparse_decode_fwd(q, cache, idx, a, b_, meta, nsp, c, d, e, dv, scale, f, g):
        assert dv == 512
        out, lse = torch.ops.dsa.sparse_mla_decode(q, cache, idx, softmax_scale=scale)
        return out, lse, torch.zeros(1) if meta is None else meta, torch.zeros(1) if nsp is None else nsp

    return (SimpleNamespace(get_paged_mqa_logits_metadata=metadata, fp8_fp4_paged_mqa_logits=logits),
            SimpleNamespace(persistent_topk=persistent_topk, top_k_per_row_decode=top_k_per_row_decode),
            SimpleNamespace(sparse_decode_fwd=sparse_decode_fwd))


def _run_case(monkeypatch, peers: bool):
    from types import SimpleNamespace

    from dsa_ops import demo

    batch, s_q = 2, 2
    dg, vops, fm = _stand_ins(batch, s_q)
    monkeypatch.setattr(b, "DEV", "cpu")
    monkeypatch.setattr(b, "capture_graph", _Graph)
    monkeypatch.setattr(b, "_layer", lambda bt, sq: demo.make_layer(bt, sq, 640, heads=64, k=256, seed=1))
    monkeypatch.setattr(b.torch.cuda, "get_device_properties", lambda dev: SimpleNamespace(multi_processor_count=4))
    monkeypatch.setattr(b, "deep_gemm", lambda: (dg, None) if peers else (None, "absent here"))
    monkeypatch.setattr(b, "_vllm_topk", lambda: (vops, None) if peers else (None, "absent here"))
    monkeypatch.setattr(b, "_flashmla", lambda: fm if peers else None)
    bench = _Bench()
    b.test_layer_step(bench, batch, s_q)
    (row,) = bench.rows
    return row


def test_a_case_with_every_peer_times_both_steps_and_each_step_alone(monkeypatch, capsys):
    row = _run_case(monkeypatch, peers=True)
    assert row["op"] == "layer_step" and row["case"]["batch"] == 2 and row["case"]["topk"] == 256
    assert row["baselines"] == {b.PEER_BASELINE: 1.0}
    assert set(row["steps_us"]) == {"paged_indexer_logits", "topk_page_table_transform", "sparse_mla_decode"}
    assert set(row["peer_steps_us"]) == {"deepgemm_metadata", "deepgemm_logits", "vllm_persistent_topk",
                                         "vllm_top_k_per_row_decode", "page_table_transform",
                                         "flashmla_sparse_decode"}
    c = row["checks"]
    assert c["ours_score_err"] == 0 and c["deepgemm_score_err"] == 0
    assert c["vllm_persistent_topk_rows_off"] == 0 and c["vllm_top_k_per_row_decode_rows_off"] == 0
    assert c["flashmla_max_rel_err"] < 2 / 128
    assert row["peer_topk"] == "vllm_persistent_topk"
    assert set(row["providers"].values()) == {"reference (CPU)"}


def test_a_case_without_peers_times_ours_and_says_why(monkeypatch, capsys):
    row = _run_case(monkeypatch, peers=False)
    assert row["baselines"] == {} and row["peer_steps_us"] == {}
    out = capsys.readouterr().out
    assert "deepgemm: skipped: absent here" in out and "vllm top-k: skipped: absent here" in out
    assert "flashmla: skipped" in out and "peers' whole step: not timed" in out
