"""tools/model_mla_lean_protocol.py: the lean MLA producer's protocol (named-barrier stage waits, 3 mask slots,
paired tiles, QK / PV handovers) over random interleavings, and that the model catches what it checks."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("model_mla_lean_protocol", ROOT / "tools" / "model_mla_lean_protocol.py")
model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model)


@pytest.mark.parametrize("count", range(0, 22, 2))
def test_protocol_holds(count):
    for seed in range(200):
        model.simulate(count, seed)


@pytest.mark.parametrize("bug", ["no_wait", "early_release", "one_mask_slot"])
def test_model_catches_faults(bug):
    with pytest.raises(AssertionError):
        for seed in range(200):
            model.simulate(12, seed, bug=bug)


def test_a_second_arrival_in_one_generation_is_caught():
    bar = model.NamedBar({"P", "QK"})
    bar.arrive("QK")
    with pytest.raises(AssertionError, match="arrived twice"):
        bar.arrive("QK")
