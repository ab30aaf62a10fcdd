"""python_iterable without `samples`: a stream whose length is not known. Each epoch ends where
its iterator does (the last partial batch per drop_last), the next calls the factory again; the
report, the verdict, autotune, Ctrl-C, on_error and the resume rule work without a total."""
import json
import os
import re
import subprocess
import textwrap
import time

import numpy as np
import pytest

import flowfeed

LENGTH = 150  # 9 batches of 16 and one of 6


def sample_x(i):
    return np.arange(12, dtype=np.float32).reshape(3, 4) + np.float32(1000 * i)


def assert_config_error(cfg, pattern):
    """Building `cfg` fails with a ConfigError whose whole text matches `pattern`."""
    with pytest.raises(flowfeed.ConfigError) as e:
        flowfeed.Pipeline(cfg)
    assert re.fullmatch(pattern, str(e.value)), str(e.value)


class Stream:
    """A callable returning a new generator of `length` samples; counts its calls."""

    def __init__(self, length=LENGTH, fail_at=None, failures=None, delay=0.0):
        self.length, self.fail_at, self.delay, self.calls = length, fail_at, delay, 0
        self.failures = failures  # how many times sample fail_at raises (None: always)

    def __call__(self):
        self.calls += 1
        return self.samples()

    def samples(self):
        i = 0
        while self.length is None or i < self.length:
            if self.delay:
                time.sleep(self.delay)
            if i == self.fail_at and self.failures != 0:
                self.failures = None if self.failures is None else self.failures - 1
                raise ValueError(f"bad sample {i}")
            yield {"x": sample_x(i), "y": i}
            i += 1


def config(stream, epochs=1, batch_size=16, depth=4, drop_last=False, on_error="fail", **pipe):
    return {
        "pipeline": {"batch_size": batch_size, "epochs": epochs, "prefetch_depth": depth,
                     "device": "host", "on_error": on_error, **pipe},
        "sampler": {"shuffle": False, "drop_last": drop_last},
        "nodes": [{"name": "load", "type": "python_iterable", "params": {"callable": stream}},
                  {"name": "stage", "type": "host_staging"},
                  {"name": "upload", "type": "host_upload"}]}


def expected(length=LENGTH, batch_size=16, drop_last=False, start=0):
    out = [list(range(s, min(s + batch_size, length))) for s in range(start, length, batch_size)]
    return [b for b in out if len(b) == batch_size or not drop_last]


def take(batches):
    got = []
    for batch in batches:
        with batch:
            samples = list(batch.samples)
            x = np.from_dlpack(batch["x"]).copy()
            y = np.from_dlpack(batch["y"]).copy()
        assert np.array_equal(x, np.stack([sample_x(i) for i in samples]))
        assert list(y) == samples
        got.append((batch.epoch, samples))
    return got


@pytest.mark.parametrize("length,drop_last", [(LENGTH, False), (LENGTH, True), (160, False),
                                              (5, False)])
def test_each_epoch_ends_where_the_iterator_does(length, drop_last):
    stream = Stream(length)
    p = flowfeed.Pipeline(config(stream, epochs=3, drop_last=drop_last))
    calls_at_build = stream.calls  # the first sample gave the layout
    for epoch in range(3):
        assert take(p.epoch()) == [(epoch, b) for b in expected(length, drop_last=drop_last)]
    assert stream.calls == calls_at_build + 3  # once per epoch
    report = p.report()
    batches = 3 * len(expected(length, drop_last=drop_last))
    samples = sum(len(b) for b in expected(length, drop_last=drop_last)) * 3
    assert (report["batches"], report["samples"], report["skipped_batches"]) == (batches, samples, 0)
    assert report["verdict"] and "nan" not in report["verdict"] and "inf" not in report["verdict"]
    assert p.free_buffers == p.total_buffers


def test_a_stream_is_a_callable_returning_an_iterable_not_a_generator_object():
    stream = Stream()
    cfg = config(stream())  # a generator object: read once only
    assert_config_error(
        cfg,
        r"<dict>:\d+:\d+: nodes\[0\]\.params\.callable: Stream\.samples is an iterator, which "
        r"can be read once \(each epoch reads the samples anew\) pass the generator function or "
        r"a re-iterable object")

    class Numbers:  # iter() gives a new iterator each time
        def __iter__(self):
            return ({"x": sample_x(i), "y": i} for i in range(40))

    p = flowfeed.Pipeline(config(Numbers(), epochs=2))
    assert take(p) == [(e, b) for e in range(2) for b in expected(40)]


def test_breaking_out_leaves_the_rest_of_the_epoch_and_stop_ends_the_run():
    p = flowfeed.Pipeline(config(Stream(), epochs=2))
    first = []
    for batch in p.epoch():
        with batch:
            first.append(list(batch.samples))
        if len(first) == 3:
            break
    assert first + [b for _, b in take(p.epoch())] == expected()
    assert take(p.epoch()) == [(1, b) for b in expected()]
    # An endless stream ends with stop().
    p = flowfeed.Pipeline(config(Stream(None), epochs=1))
    got = 0
    for batch in p:
        batch.release()
        got += 1
        if got == 50:
            p.stop()
    assert p.report()["interrupted"] is True and p.free_buffers == p.total_buffers


def test_autotune_tunes_a_transform_after_a_stream():
    def slow(batch):
        time.sleep(0.03)  # a sleep releases the GIL: the bodies overlap

    cfg = config(Stream(), epochs=4, depth=8)
    cfg["nodes"].insert(1, {"name": "aug", "type": "python_transform", "concurrency": "auto",
                            "params": {"callable": slow}})
    p = flowfeed.Pipeline(cfg)
    assert take(p) == [(e, b) for e in range(4) for b in expected()]
    report = p.report()
    first = report["tuning"]["decisions"][0]
    assert (first["knob"], first["from"]) == ("nodes.aug.concurrency", 1) and first["to"] > 1
    assert report["verdict"]
    assert report["batches"] == 4 * len(expected())


def test_ctrl_c_ends_an_endless_stream_within_a_second(ctrl_c_ends_the_run):
    ctrl_c_ends_the_run(flowfeed.Pipeline(config(Stream(None, delay=0.001), depth=8)))


RAISE_LINE = Stream.samples.__code__.co_firstlineno + 7


def test_an_exception_mid_stream_fails_the_run_with_its_traceback():
    p = flowfeed.Pipeline(config(Stream(fail_at=40)))
    with pytest.raises(flowfeed.NodeError) as e:
        take(p)
    text = str(e.value)
    assert re.match(
        r"node 'load' \(python_iterable, <dict>:\d+\) batch 2 \(epoch 0\): sample 40: "
        r"ValueError: bad sample 40 \(at " + re.escape(__file__) + f":{RAISE_LINE} in samples\\)"
        r"\nTraceback \(most recent call last\):\n", text), text
    assert text.endswith("ValueError: bad sample 40")
    assert p.free_buffers == p.total_buffers


def test_an_exception_mid_stream_skips_its_batch_under_on_error_skip():
    # The iterator that raised is over; the next batch reads a new one up to its place, so a
    # stream whose sample 40 failed once loses that batch only.
    p = flowfeed.Pipeline(config(Stream(fail_at=40, failures=1), epochs=2, on_error="skip",
                                 max_skipped=1))
    assert take(p) == [(0, b) for b in expected() if 40 not in b] + [(1, b) for b in expected()]
    report = p.report()
    assert (report["skipped_batches"], report["skipped_samples"]) == (1, 16)
    assert any("ValueError: bad sample 40" in w for w in report["warnings"])
    # One that fails every time fails each new iterator too: the run ends at max_skipped.
    p = flowfeed.Pipeline(config(Stream(fail_at=40), on_error="skip", max_skipped=3))
    with pytest.raises(flowfeed.NodeError, match=r"\(4 batches skipped, more than "
                       r"pipeline.max_skipped = 3\)"):
        take(p)


def resume_case(taken, epochs=2):
    whole = take(flowfeed.Pipeline(config(Stream(), epochs=epochs)))
    first = flowfeed.Pipeline(config(Stream(), epochs=epochs))
    before = []
    for batch in first:
        with batch:
            before.append((batch.epoch, list(batch.samples)))
        if len(before) == taken:
            break
    state = first.state_dict()
    first.close()
    return whole, before, state


@pytest.mark.parametrize("taken", [1, 4, 9, 10, 11, 19])
def test_a_state_dict_resumes_a_stream_where_it_was_taken(taken):
    whole, before, state = resume_case(taken)
    # The cursor counts the stream's batches of the epoch; past its last, the next epoch's start.
    per_epoch = len(expected())
    assert (state["cursor"]["epoch"], state["cursor"]["samples"]) == (
        taken // per_epoch, (taken % per_epoch) * 16)
    assert state["sampler"]["dataset_size"] == 0  # a stream: its size is not known
    resumed = flowfeed.Pipeline(config(Stream(), epochs=2))
    resumed.load_state_dict(state)
    assert before + take(resumed) == whole


def test_a_resume_a_stream_cannot_promise_is_refused():
    _, _, state = resume_case(4)
    sized = config(Stream())
    sized["nodes"][0]["params"]["samples"] = LENGTH
    p = flowfeed.Pipeline(sized)
    with pytest.raises(flowfeed.ConfigError) as e:
        p.load_state_dict(state)
    assert str(e.value) == (
        "state_dict: sampler.dataset_size: the checkpoint was written by a stream of unknown "
        "length, this run's data set has 150 samples (a stream's position is a count of "
        "samples read, not a place in a data set of known size) resume with the same stream "
        "(python_iterable without samples)")
    take(p)
    with pytest.raises(flowfeed.ConfigError) as e:
        flowfeed.Pipeline(config(Stream())).load_state_dict(p.state_dict())
    assert str(e.value) == (
        "state_dict: sampler.dataset_size: the checkpoint was written for 150 samples, this run "
        "reads a stream of unknown length (its epochs end where its data does, so a position in "
        "a data set of known size says nothing about it) resume with the same data set")
    # A stream that yields fewer samples than the state read before its cursor.
    shorter = flowfeed.Pipeline(config(Stream(length=30)))
    shorter.load_state_dict(state)
    with pytest.raises(flowfeed.NodeError) as e:
        take(shorter)
    assert re.fullmatch(
        r"node 'load' \(python_iterable, <dict>:\d+\) batch 0 \(epoch 0\): the stream ended "
        r"after 30 samples, before sample 64 of epoch 0 where this run resumes \(a resume reads "
        r"and leaves the samples before its cursor: the iterable gave more when the checkpoint "
        r"was taken\) resume only from an iterable that yields the same samples again",
        str(e.value)), str(e.value)
    assert shorter.free_buffers == shorter.total_buffers


def test_a_stream_cannot_be_a_source_of_a_mix():
    flowfeed.register("ff_test_stream", Stream())
    p = {
        "pipeline": {"batch_size": 8, "epochs": 1, "prefetch_depth": 4, "device": "host"},
        "sampler": {"shuffle": False},
        "nodes": [
            {"name": "load", "type": "mix", "sources": [
                {"type": "python_iterable", "params": {
                    "callable": "ff_test_stream", "layout": ["x: float32 [3, 4]", "y: int32"]}},
                {"type": "synthetic", "params": {"samples": 100, "sample_shape": [3, 4],
                                                 "dtype": "float32"}}]},
            {"name": "stage", "type": "host_staging"},
            {"name": "upload", "type": "host_upload"}]}
    assert_config_error(
        p,
        r"<dict>:\d+:\d+: node 'load' source 0 \(python_iterable\): a stream of unknown length "
        r"cannot be mixed \(a mix draws every epoch from its sources' sizes\) give the source its "
        r"size \(samples\)")


def test_the_runner_reads_a_stream_with_progress_and_stop_after(tmp_path, runner_path):
    (tmp_path / "ff_stream_data.py").write_text(textwrap.dedent(f"""\
        import time
        import numpy as np
        def stream():
            for i in range({LENGTH}):
                time.sleep(0.005)  # a run of seconds: progress lines come every second
                yield {{"x": np.full((4,), i, np.float32), "y": i}}
        """))
    (tmp_path / "stream.yaml").write_text(textwrap.dedent("""\
        pipeline: { batch_size: 16, epochs: 3, prefetch_depth: 4, device: host }
        sampler: { shuffle: false }
        nodes:
          - { name: load, type: python_iterable, params: { callable: "ff_stream_data:stream" } }
          - { name: stage, type: host_staging }
          - { name: upload, type: host_upload }
          - { name: train, type: discard }
        """))

    def run(*extra):
        report = tmp_path / "report.json"
        done = subprocess.run(
            [runner_path, str(tmp_path / "stream.yaml"), "--report", str(report), *extra],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": str(tmp_path)})
        assert done.returncode == 0, done.stderr
        return json.loads(report.read_text()), done.stderr

    report, stderr = run()
    assert (report["batches"], report["samples"]) == (30, 3 * LENGTH)
    lines = [l for l in stderr.splitlines() if l.startswith("flowfeed: ")]
    assert lines and all(re.fullmatch(r"flowfeed: \d+ batches, \d+ batches/s \(a stream of "
                                      r"unknown length\)", l) for l in lines), stderr
    # Epoch 0's 10 batches and 2 of epoch 1: the batches let in past epoch 0's end do not count.
    report, _ = run("--stop-after", "12")
    assert (report["batches"], report["samples"]) == (12, LENGTH + 2 * 16)
