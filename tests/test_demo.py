"""`python -m dsa_ops demo` on the CPU: the decode layer step runs, its checks pass, and each check fails on a
corrupted step output (so a GPU run that gets a step wrong exits non-zero)."""

from __future__ import annotations

import pytest
import torch
from dsa_ops import demo


@pytest.fixture(scope="module")
def step():
    x = demo.make_layer(2, 2, 640, heads=64, k=256, seed=3)
    return x, demo.layer_step(x)


def test_demo_main_runs_a_decode_step_and_passes_its_checks(capsys):
    assert demo.main(["--device", "cpu", "--batch", "2", "--next-n", "2", "--context", "1000", "--heads", "64",
                      "--k", "512"]) == 0
    out = capsys.readouterr().out
    for name in ("paged_indexer_logits", "topk_page_table_transform", "sparse_mla_decode"):
        assert f"{name}" in out and "via reference (CPU)" in out
    assert "top-k slots of 4 rows equals the reference: True" in out
    assert "within the sparse_mla_decode tolerances: True" in out


def test_demo_flags_are_checked():
    with pytest.raises(SystemExit):
        demo.main(["--device", "cpu", "--rows", "3", "--next-n", "2"])
    with pytest.raises(SystemExit):
        demo.main(["--device", "cpu", "--rows", "2", "--batch", "2"])
    for flag in ("--batch", "--context", "--keys", "--k"):  # 0 is refused, not read as "the default"
        with pytest.raises(SystemExit):
            demo.main(["--device", "cpu", flag, "0"])


def test_decode_rows_follow_the_indexer_visibility():
    lengths, rows = demo.decode_rows(torch.tensor([5, 1, 0], dtype=torch.int32), 2)
    assert lengths.tolist() == [4, 5, 0, 1, 0, 0]
    assert rows.tolist() == [0, 0, 1, 1, 2, 2]
    assert lengths.dtype == rows.dtype == torch.int32


def test_checks_pass_on_the_reference_step(step):
    x, (logits, slots, out, lse) = step
    lines, failed = demo.check(x, logits, slots, out, lse, [0, 1])
    assert failed == [], lines
    # every selected slot is on a page of the request's own block table row
    pages = slots.view(2, 2, -1).long() // demo.PAGE
    for b in range(2):
        assert torch.isin(pages[b], x.block_table[b].long()).all()


def test_each_check_fails_on_a_corrupted_output(step):
    x, (logits, slots, out, lse) = step
    bad_logits = logits.clone()
    low = int(torch.where(torch.isfinite(logits[1]), logits[1], float("inf")).argmin())  # not in the top-k
    bad_logits[1, low] = 2 * logits[1].abs().max()
    assert demo.check(x, bad_logits, slots, out, lse, [0])[1] == ["indexer scores", "top-k"]

    bad_slots = slots.clone()
    unused = next(s for s in range(x.mla_cache.shape[0] * demo.PAGE) if s not in set(slots[0].tolist()))
    bad_slots[0, 5] = unused  # one slot not in the top-k set
    assert "top-k" in demo.check(x, logits, bad_slots, out, lse, [0])[1]

    bad_out = out.clone()
    bad_out[0, 1, 3, 10] += 0.1
    assert demo.check(x, logits, slots, bad_out, lse, [0])[1] == ["attention"]
    bad_lse = lse.clone()
    bad_lse[1, 2, 0] += 1e-3
    assert demo.check(x, logits, slots, out, bad_lse, [0, 1])[1] == ["attention"]


def test_spare_pages_of_the_mla_cache_are_nan():
    x = demo.make_layer(1, 1, 128, heads=64, k=64, spare_pages=3)
    used = set(x.block_table.flatten().tolist())
    spare = [p for p in range(x.mla_cache.shape[0]) if p not in used]
    assert len(spare) == 3
    assert (x.mla_cache[spare] == 0xFF).all() and not (x.mla_cache[sorted(used)] == 0xFF).all()
