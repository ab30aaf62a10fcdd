"""Fixtures of the flowfeed module's tests: small real .npy data sets and pull-mode configs.

The module is found through PYTHONPATH (ctest sets it to build/python)."""
import os
import signal
import textwrap
import threading
import time

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


@pytest.fixture
def runner_path():
    """The pipeline_runner built next to the module (the test is skipped where there is none)."""
    import flowfeed
    path = os.path.join(os.path.dirname(flowfeed.__file__), "..", "apps", "pipeline_runner",
                        "pipeline_runner")
    if not os.path.exists(path):
        pytest.skip("pipeline_runner is not built next to the module")
    return path


@pytest.fixture
def ctrl_c_ends_the_run():
    """A check: iterating a pipeline, a SIGINT sent half a second in raises KeyboardInterrupt
    within a second, every buffer is back and the report says the run was interrupted."""

    def check(pipeline):
        sent = []

        def interrupt():
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

        timer = threading.Timer(0.5, interrupt)
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                for batch in pipeline:
                    batch.release()
        finally:
            timer.cancel()
        assert sent and time.monotonic() - sent[0] < 1.0
        assert pipeline.free_buffers == pipeline.total_buffers
        assert pipeline.report()["interrupted"] is True

    return check
