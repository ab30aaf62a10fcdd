"""Shards by URL from Python: a Pipeline whose npy loader names its shards by http:// URLs,
served on 127.0.0.1 by Python's threaded HTTP server (in a process of its own: the Pipeline's
construction holds the GIL while it fetches), yields the bytes of the same shards on disk, in
order; a missing shard fails the Pipeline's construction naming the URL and the status
(docs/REMOTE.md)."""
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import flowfeed


@pytest.fixture
def served(tmp_path):
    """tmp_path/data served on 127.0.0.1 at a free port; yields the base URL."""
    (tmp_path / "data").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
         str(tmp_path / "data")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(500):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.terminate()
        server.wait(10)


def config(base, cache, shards="{0..2}"):
    return f"""
pipeline: {{ epochs: 1, batch_size: 8, device: host }}
nodes:
  - name: load
    type: npy
    params: {{ features: '{base}x-{shards}.npy', labels: '{base}y-{shards}.npy', cache_dir: '{cache}' }}
"""


def test_shards_by_url_give_the_bytes_of_the_files(served, tmp_path):
    data = tmp_path / "data"
    for i in range(3):
        np.save(data / f"x-{i}.npy", np.arange(20 * 6, dtype=np.float32).reshape(20, 6) + 1000 * i)
        np.save(data / f"y-{i}.npy", (np.arange(20, dtype=np.int32) + i) % 7)
    want_x = np.concatenate([np.load(data / f"x-{i}.npy") for i in range(3)])
    want_y = np.concatenate([np.load(data / f"y-{i}.npy") for i in range(3)])
    for _ in range(2):  # cold, then warm
        xs, ys = [], []
        for batch in flowfeed.Pipeline(config(served, tmp_path / "cache")):
            xs.append(np.array(batch["x"]))  # copies: the batch goes back to the pipeline
            ys.append(np.array(batch["y"]))
        assert np.array_equal(np.concatenate(xs), want_x)
        assert np.array_equal(np.concatenate(ys), want_y)


def test_a_missing_shard_names_its_url_and_status(served, tmp_path):
    data = tmp_path / "data"
    np.save(data / "x-0.npy", np.zeros((4, 2), dtype=np.float32))
    np.save(data / "y-0.npy", np.zeros(4, dtype=np.int32))
    with pytest.raises(flowfeed.DataError) as e:
        flowfeed.Pipeline(config(served, tmp_path / "cache", "{0..1}"))
    assert str(e.value) == (
        f"node 'load' (npy, <string>:4): {served}x-1.npy: HTTP 404 Not Found (no such object: "
        "check the URL (bucket, prefix and shard names))")
