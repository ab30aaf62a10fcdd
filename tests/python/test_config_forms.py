"""How Pipeline(...) reads its arguments: overrides as a dict, a list or one "key=value" string;
a chain without a train node runs in pull mode without `mode: pull` being written."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import flowfeed


def batches(pipeline):
    out = []
    for batch in pipeline:
        with batch:
            out.append(tuple(batch.samples))
    return out


def test_one_override_string_is_one_override(data):
    config = data.config(epochs=1)
    one = flowfeed.Pipeline(config, overrides="pipeline.epochs=2")
    assert one.epochs == 2
    listed = flowfeed.Pipeline(config, overrides=["pipeline.epochs=2"])
    mapped = flowfeed.Pipeline(config, overrides={"pipeline.epochs": 2})
    assert batches(one) == batches(listed) == batches(mapped)
    assert len(batches(one)) == 2 * 16
    with pytest.raises(flowfeed.ConfigError) as error:
        flowfeed.Pipeline(config, overrides="pipeline.epoch=2")
    assert "pipeline.epoch" in str(error.value) and "did you mean 'epochs'" in str(error.value)


def test_overrides_that_are_not_strings_are_a_type_error(data):
    config = data.config(epochs=1)
    # Before, bytes were read one byte at a time ("--set 112: expected key.path=value" ...).
    for overrides, said in ((b"pipeline.epochs=2", "got bytes"), (42, "got int"),
                            (bytearray(b"x=1"), "got bytearray")):
        with pytest.raises(TypeError) as error:
            flowfeed.Pipeline(config, overrides=overrides)
        assert str(error.value) == ("overrides: expected a dict, a list of 'key.path=value' "
                                    "strings or one such string, " + said)
    with pytest.raises(TypeError) as error:
        flowfeed.Pipeline(config, overrides=["pipeline.epochs=2", b"pipeline.epochs=3"])
    assert str(error.value) == "overrides[1]: expected a 'key.path=value' string, got bytes"


def without_mode(config):
    assert "mode: pull, " in config
    return config.replace("mode: pull, ", "")


def test_a_chain_without_a_train_node_runs_in_pull_mode_unasked(data):
    implicit = flowfeed.Pipeline(without_mode(data.config(epochs=1, shuffle=False)))
    explicit = flowfeed.Pipeline(data.config(epochs=1, shuffle=False))
    assert batches(implicit) == batches(explicit)
    assert len(batches(implicit)) == 16


def test_an_explicit_run_mode_without_a_train_node_is_still_an_error(data):
    config = without_mode(data.config()).replace("pipeline: { ", "pipeline: { mode: run, ")
    with pytest.raises(flowfeed.ConfigError) as error:
        flowfeed.Pipeline(config)
    assert str(error.value) == (
        "<string>:6:27: nodes[2].type: the last node must be a train node, 'upload' is a upload node "
        "(add a train-role node such as checksum, sleep or mlp)")
    with pytest.raises(flowfeed.ConfigError) as error:
        flowfeed.Pipeline(without_mode(data.config()), overrides="pipeline.mode=run")
    assert "the last node must be a train node, 'upload' is a upload node" in str(error.value)


def test_a_chain_with_a_train_node_keeps_run_mode(data):
    config = without_mode(data.config()) + "  - { name: train, type: discard }\n"
    pipeline = flowfeed.Pipeline(config)
    with pytest.raises(flowfeed.ConfigError, match=r"^<string>:\d+:\d+: pipeline\.mode: "
                       r"Pipeline::start\(\) hands batches to the caller's loop, and this "
                       r"pipeline has mode: run"):
        pipeline.epoch()


FIFO_SCRIPT = r"""
import signal, sys, flowfeed
print("waiting", flush=True)
try:
    flowfeed.Pipeline(sys.argv[1])
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_a_config_fifo_is_read_and_ctrl_c_ends_the_wait_for_its_writer(data, tmp_path):
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    # A writer that comes after the reader, writes and closes: the config is read whole.
    text = data.config(epochs=1, shuffle=False)
    writer = threading.Thread(target=lambda: (time.sleep(0.3), fifo.write_text(text)))
    writer.start()
    pipeline = flowfeed.Pipeline(str(fifo))
    writer.join()
    assert len(batches(pipeline)) == 16
    # No writer: before, open() blocked through Ctrl-C (only SIGKILL ended the process).
    child = subprocess.Popen([sys.executable, "-c", FIFO_SCRIPT, str(fifo)],
                             stdout=subprocess.PIPE, text=True, env=os.environ)
    assert child.stdout.readline() == "waiting\n"
    time.sleep(0.5)
    child.send_signal(signal.SIGINT)
    try:
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert (out, child.returncode) == ("interrupted\n", 0)
