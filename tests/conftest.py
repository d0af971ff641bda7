import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """GPU tests are skipped, loudly, where there is no GPU (CI); they run with `pytest -m gpu`."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU (run `pytest -m gpu` on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
