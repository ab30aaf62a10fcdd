"""Fixtures of the flowfeed module's tests: small real .npy data sets and pull-mode configs.

The module is found through PYTHONPATH (ctest sets it to build/python)."""
import os
import textwrap

import numpy as np
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def cuda_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device visible (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class DataSet:
    """x: float32 [n, 8] (distinct values), y: int32 [n] (the sample index), as .npy files."""

    def __init__(self, folder, n=1000, features=8):
        rng = np.random.default_rng(12)
        self.x = rng.random((n, features), dtype=np.float32)
        self.y = np.arange(n, dtype=np.int32)
        self.features = str(folder / "x.npy")
        self.labels = str(folder / "y.npy")
        np.save(self.features, self.x)
        np.save(self.labels, self.y)

    def config(self, epochs=1, batch_size=64, depth=4, device="host", extra_nodes="",
               upload="host_upload", stage="host_staging", shuffle=True):
        """A pull-mode config over this data set; extra_nodes go after the upload."""
        return textwrap.dedent(f"""\
            pipeline: {{ mode: pull, epochs: {epochs}, batch_size: {batch_size}, prefetch_depth: {depth}, device: {device} }}
            sampler: {{ shuffle: {str(shuffle).lower()}, seed: 3 }}
            nodes:
              - {{ name: load, type: npy, concurrency: 2, params: {{ features: {self.features}, labels: {self.labels} }} }}
              - {{ name: stage, type: {stage} }}
              - {{ name: upload, type: {upload} }}
            """) + textwrap.indent(textwrap.dedent(extra_nodes), "  ")


@pytest.fixture
def data(tmp_path):
    return DataSet(tmp_path)
