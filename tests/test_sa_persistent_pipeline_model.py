"""tools/model_sa_persistent_pipeline.py: a warp of the persistent sparse_attention kernel over the units of a CTA
(lookahead registers, ring, unit switch), and that the model catches units too short for the lookahead."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("model_sa_persistent_pipeline",
                                              ROOT / "tools" / "model_sa_persistent_pipeline.py")
model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model)


def test_pipeline_holds():
    model.main()


@pytest.mark.parametrize("n", range(1, model.MIN_N))
def test_short_units_are_caught(n):
    with pytest.raises(AssertionError):
        model.run(n, [0, 1, 2])
