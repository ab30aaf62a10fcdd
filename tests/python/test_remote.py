"""Shards by URL from Python: a Pipeline whose npy loader names its shards by http:// URLs,
served on 127.0.0.1 by Python's threaded HTTP server, yields the bytes of the same shards on
disk, in order, served from another process or from a thread of this one (the Pipeline's
construction releases the GIL while it fetches); a missing shard fails the Pipeline's
construction naming the URL and the status (docs/REMOTE.md)."""
import functools
import http.server
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

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


def config(base, cache, shards="{0..2}", extra=""):
    return f"""
pipeline: {{ epochs: 1, batch_size: 8, device: host }}
nodes:
  - name: load
    type: npy
    params: {{ features: '{base}x-{shards}.npy', labels: '{base}y-{shards}.npy', cache_dir: '{cache}'{extra} }}
"""


def write_shards(data):
    """Three shards (features and labels) in `data`; returns all their features and labels."""
    for i in range(3):
        np.save(data / f"x-{i}.npy", np.arange(20 * 6, dtype=np.float32).reshape(20, 6) + 1000 * i)
        np.save(data / f"y-{i}.npy", (np.arange(20, dtype=np.int32) + i) % 7)
    return (np.concatenate([np.load(data / f"x-{i}.npy") for i in range(3)]),
            np.concatenate([np.load(data / f"y-{i}.npy") for i in range(3)]))


def expect_the_shards(pipeline, want_x, want_y):
    xs, ys = [], []
    for batch in pipeline:
        xs.append(np.array(batch["x"]))  # copies: the batch goes back to the pipeline
        ys.append(np.array(batch["y"]))
    assert np.array_equal(np.concatenate(xs), want_x)
    assert np.array_equal(np.concatenate(ys), want_y)


def test_shards_by_url_give_the_bytes_of_the_files(served, tmp_path):
    want_x, want_y = write_shards(tmp_path / "data")
    for _ in range(2):  # cold, then warm
        expect_the_shards(flowfeed.Pipeline(config(served, tmp_path / "cache")), want_x, want_y)


def test_a_server_thread_of_this_process_serves_the_build(tmp_path):
    """The construction fetches with the GIL released: a Python thread of the same process serves
    the shards (holding the GIL, the fetch would get no answer and fail after timeout_s)."""
    data = tmp_path / "data"
    data.mkdir()
    want_x, want_y = write_shards(data)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(data)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        pipeline = flowfeed.Pipeline(config(base, tmp_path / "cache", extra=", timeout_s: 5, attempts: 1"))
        expect_the_shards(pipeline, want_x, want_y)
    finally:
        server.shutdown()
        server.server_close()


def test_a_missing_shard_names_its_url_and_status(served, tmp_path):
    data = tmp_path / "data"
    np.save(data / "x-0.npy", np.zeros((4, 2), dtype=np.float32))
    np.save(data / "y-0.npy", np.zeros(4, dtype=np.int32))
    with pytest.raises(flowfeed.DataError) as e:
        flowfeed.Pipeline(config(served, tmp_path / "cache", "{0..1}"))
    assert str(e.value) == (
        f"node 'load' (npy, <string>:4): {served}x-1.npy: HTTP 404 Not Found (no such object: "
        "check the URL (bucket, prefix and shard names))")


REMOTE_TESTS = Path(__file__).resolve().parent.parent / "remote"


def start_server(script, *args):
    """A server of tests/remote on 127.0.0.1 (its process, its port)."""
    p = subprocess.Popen([sys.executable, str(REMOTE_TESTS / script), *args],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    assert line.startswith("port "), line
    return p, int(line.split()[1])


BUILDS_THROUGH = """
import sys, time
import flowfeed
print("building", flush=True)
try:
    flowfeed.Pipeline(sys.argv[1])
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    sys.exit(3)
print("built", flush=True)
"""


@pytest.mark.parametrize("order", ["samples", "shards"])
def test_ctrl_c_while_the_build_fetches_raises_keyboard_interrupt_at_once(tmp_path, order):
    """A shard of 32 MiB through a proxy sending 1 MB a second (half a minute to fetch): Ctrl-C a
    second into the build ends it within two seconds with KeyboardInterrupt, whether the build
    fetches every shard (order: samples) or waits for the first one streamed (order: shards)."""
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "x-0.npy", np.zeros((2048, 4096), dtype=np.float32))
    np.save(data / "y-0.npy", np.zeros(2048, dtype=np.int32))
    server, port = start_server("range_server.py", "--root", str(data))
    proxy, proxy_port = start_server("fault_proxy.py", "--upstream", str(port), "--bandwidth", "1000000")
    try:
        base = f"http://127.0.0.1:{proxy_port}/"
        yaml = (config(base, tmp_path / "cache", shards="0", extra=", transfers: 1")
                + f"sampler: {{ shuffle: true, order: {order} }}\n")
        child = subprocess.Popen([sys.executable, "-c", BUILDS_THROUGH, yaml],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "building\n"
        time.sleep(1.0)
        interrupted = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
        ended = time.monotonic() - interrupted
        assert child.returncode == 3, (out, err)
        assert out == "KeyboardInterrupt\n", (out, err)
        assert ended < 2.0, ended
    finally:
        for p in (proxy, server):
            p.terminate()
            p.wait(10)
