"""Python node types in the graph (python, python_transform, python_iterable): bytes in the
sampler's order, layouts, errors with their tracebacks, Ctrl-C, threads, leaks."""
import gc
import inspect
import os
import re
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import flowfeed

N = 200


def sample_x(i):
    """Sample i's x: distinct bytes per sample."""
    return np.arange(12, dtype=np.float32).reshape(3, 4) + np.float32(1000 * i)


def config(load, extra=(), pipeline=None, sampler=None, layout=None, **params):
    load_params = {"callable": load, **params}
    if layout is not None:
        load_params["layout"] = layout
    return {
        "pipeline": {"batch_size": 16, "epochs": 1, "prefetch_depth": 4,
                     "device": "host", **(pipeline or {})},
        "sampler": {"shuffle": True, "seed": 5, **(sampler or {})},
        "nodes": [{"name": "load", "type": "python", "concurrency": 3, "params": load_params},
                  *extra,
                  {"name": "stage", "type": "host_staging"},
                  {"name": "upload", "type": "host_upload"}]}


def reference_order(batch_size=16, shuffle=True, seed=5, epochs=1):
    """The samples of each batch as the sampler orders them, taken from the built-in synthetic
    loader over a data set of the same size."""
    p = flowfeed.Pipeline({
        "pipeline": {"batch_size": batch_size, "epochs": epochs,
                     "device": "host"},
        "sampler": {"shuffle": shuffle, "seed": seed},
        "nodes": [{"name": "load", "type": "synthetic", "params": {"samples": N}},
                  {"name": "stage", "type": "host_staging"},
                  {"name": "upload", "type": "host_upload"}]})
    order = [list(b.samples) for b in p]
    p.close()
    return order


def take_all(pipeline):
    got = []
    for batch in pipeline:
        with batch:
            got.append((list(batch.samples), np.from_dlpack(batch["x"]).copy(),
                        np.from_dlpack(batch["y"]).copy()))
    return got


def check_bytes(got, order):
    assert [s for s, _, _ in got] == order
    for samples, x, y in got:
        assert np.array_equal(x, np.stack([sample_x(i) for i in samples]))
        assert np.array_equal(y, np.array(samples, dtype=y.dtype))


class Squares:
    """A Dataset-like object: __getitem__ and __len__."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"x": sample_x(i), "y": np.int64(i)}


LOADERS = {
    "numpy": (lambda i: {"x": sample_x(i), "y": i}, {"samples": N}),
    "torch": (lambda i: {"x": torch.from_numpy(sample_x(i)), "y": torch.tensor(i)},
              {"samples": N}),
    "tuple": (lambda i: (sample_x(i), i), {"samples": N}),
    "strided": (lambda i: {"x": np.ascontiguousarray(sample_x(i).T).T, "y": i}, {"samples": N}),
    "dataset": (Squares(), {}),
    "batched": (lambda idx: {"x": np.stack([sample_x(i) for i in idx]),
                             "y": np.array(idx, dtype=np.int64)},
                {"samples": N, "batched": True}),
}


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_every_sample_arrives_byte_for_byte_in_the_samplers_order(kind):
    load, params = LOADERS[kind]
    p = flowfeed.Pipeline(config(load, **params))
    check_bytes(take_all(p), reference_order())
    assert p.free_buffers == p.total_buffers


def test_a_registered_name_and_a_module_function_work_from_yaml(tmp_path, monkeypatch):
    flowfeed.register("ff_test_numpy_loader", LOADERS["numpy"][0])
    (tmp_path / "ff_test_loaders.py").write_text(textwrap.dedent("""\
        import numpy as np
        def load(i):
            return {"x": np.arange(12, dtype=np.float32).reshape(3, 4) + np.float32(1000 * i), "y": i}
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("ff_test_numpy_loader", "ff_test_loaders:load"):
        p = flowfeed.Pipeline(textwrap.dedent(f"""\
            pipeline: {{ mode: pull, batch_size: 16, device: host }}
            sampler: {{ shuffle: true, seed: 5 }}
            nodes:
              - {{ name: load, type: python, concurrency: 2, params: {{ callable: "{name}", samples: {N} }} }}
              - {{ name: stage, type: host_staging }}
              - {{ name: upload, type: host_upload }}
            """))
        check_bytes(take_all(p), reference_order())


def test_a_transform_changes_batches_in_place_or_returns_new_arrays():
    def in_place(batch):
        batch["x"] += 1

    def new_arrays(batch):
        return {"x": batch["x"][::-1] * 2, "y": batch["y"]}  # reads the buffer it is copied into

    for fn, expect in ((in_place, lambda x: x + 1), (new_arrays, lambda x: x[::-1] * 2)):
        aug = {"name": "aug", "type": "python_transform", "concurrency": 2,
               "params": {"callable": fn}}
        got = take_all(flowfeed.Pipeline(config(LOADERS["numpy"][0], extra=[aug], samples=N)))
        assert [s for s, _, _ in got] == reference_order()
        for samples, x, y in got:
            assert np.array_equal(x, expect(np.stack([sample_x(i) for i in samples])))
            assert np.array_equal(y, samples)


LOCATED = r"node 'load' \(python, <dict>:\d+\) batch 2 \(epoch 0\): "


def test_a_layout_mismatch_names_node_sample_key_and_both_shapes():
    def load(i):
        shape = (3, 32, 32) if i == 17 else (3, 28, 28)
        return {"x": np.zeros(shape, np.float32), "y": i}

    p = flowfeed.Pipeline(config(load, samples=N, sampler={"shuffle": False},
                                 pipeline={"batch_size": 8},
                                 layout={"x": {"dtype": "float32", "shape": [3, 28, 28]},
                                         "y": {"dtype": "int64", "shape": []}}))
    with pytest.raises(flowfeed.NodeError) as e:
        take_all(p)
    assert re.fullmatch(LOCATED + r"sample 17: key 'x' has shape \[3, 32, 32\] float32, the "
                        r"layout says \[3, 28, 28\] float32", str(e.value)), str(e.value)
    # A transform returning the wrong shape fails its batch with the same text.
    aug = {"name": "aug", "type": "python_transform",
           "params": {"callable": lambda b: {"x": b["x"][:, :2], "y": b["y"]}}}
    with pytest.raises(flowfeed.NodeError) as e:
        take_all(flowfeed.Pipeline(config(LOADERS["numpy"][0], extra=[aug], samples=N)))
    assert re.fullmatch(r"node 'aug' \(python_transform, <dict>:\d+\) batch 0 \(epoch 0\): key "
                        r"'x' has shape \[16, 2, 4\] float32, the layout says \[16, 3, 4\] float32",
                        str(e.value)), str(e.value)


def failing_load(i):
    if i in (20, 23):
        raise ValueError(f"bad sample {i}")
    return {"x": sample_x(i), "y": i}


RAISE_LINE = inspect.getsourcelines(failing_load)[1] + 2


def test_an_exception_fails_the_run_with_its_traceback():
    p = flowfeed.Pipeline(config(failing_load, samples=N, sampler={"shuffle": False},
                                 pipeline={"batch_size": 8}))
    with pytest.raises(flowfeed.NodeError) as e:
        take_all(p)
    text = str(e.value)
    head = (f"sample 20: ValueError: bad sample 20 (at {__file__}:{RAISE_LINE} in failing_load)")
    assert re.match(LOCATED + re.escape(head) + "\nTraceback \\(most recent call last\\):\n",
                    text), text
    assert text.endswith("ValueError: bad sample 20")
    assert p.free_buffers == p.total_buffers


def test_exceptions_are_skipped_and_counted_under_on_error_skip():
    p = flowfeed.Pipeline(config(failing_load, samples=N,
                                 pipeline={"on_error": "skip", "max_skipped": 2}))
    got = take_all(p)
    delivered = [i for s, _, _ in got for i in s]
    assert sorted(delivered) == [i for i in range(N) if i not in (20, 23)]
    for samples, x, y in got:
        assert np.array_equal(x, np.stack([sample_x(i) for i in samples]))
    report = p.report()
    assert report["skipped_samples"] == 2
    assert any(f"ValueError: bad sample 20 (at {__file__}:{RAISE_LINE}" in w
               for w in report["warnings"])
    # One more than max_skipped fails the run.
    p = flowfeed.Pipeline(config(failing_load, samples=N,
                                 pipeline={"on_error": "skip", "max_skipped": 1}))
    with pytest.raises(flowfeed.NodeError, match=r"more than pipeline.max_skipped = 1"):
        take_all(p)


def test_several_bodies_run_at_once():
    # The first three batches meet at a barrier: only three bodies at once (the node's
    # concurrency) get past it.
    barrier = threading.Barrier(3)

    def load(indices):
        if indices[0] < 3 * 16:
            barrier.wait(timeout=20)
        return {"x": np.stack([sample_x(i) for i in indices]),
                "y": np.array(indices, dtype=np.int64)}

    p = flowfeed.Pipeline(config(load, samples=N, batched=True, sampler={"shuffle": False},
                                 pipeline={"threads": 6, "prefetch_depth": 8},
                                 layout=["x: float32 [3, 4]", "y: int64"]))
    check_bytes(take_all(p), reference_order(shuffle=False))


def test_ctrl_c_with_eight_python_bodies_ends_within_a_second(ctrl_c_ends_the_run):
    def load(i):
        time.sleep(0.01)
        return {"x": sample_x(i), "y": i}

    cfg = config(load, samples=100000, pipeline={"threads": 8, "prefetch_depth": 8})
    cfg["nodes"][0]["concurrency"] = 8
    ctrl_c_ends_the_run(flowfeed.Pipeline(cfg))


def test_a_callable_that_does_not_return_is_named_by_the_stall_detector():
    release = threading.Event()

    def load(i):
        if i == 0 and not release.is_set():
            release.wait(30)
        return {"x": sample_x(i), "y": i}

    # A timeout long enough that the body has entered the call on a loaded machine (with 0.3 s
    # it had sometimes not started yet, and the detector said the loader produced nothing).
    p = flowfeed.Pipeline(config(load, samples=N, layout=["x: float32 [3, 4]", "y: int64"],
                                 pipeline={"stall_timeout_s": 1.5}, sampler={"shuffle": False}))
    timer = threading.Timer(4.0, release.set)  # lets the run drain after the stall
    timer.start()
    with pytest.raises(flowfeed.Error) as e:
        take_all(p)
    timer.cancel()
    assert re.fullmatch(r"run stalled: no batch for 1.5 s \(pipeline.stall_timeout_s\): node "
                        r"'load' \(python, <dict>:\d+\) is still processing batch 0 \(epoch 0\)",
                        str(e.value)), str(e.value)


def test_two_pipelines_with_python_nodes_in_one_process():
    a = flowfeed.Pipeline(config(LOADERS["numpy"][0], samples=N))
    b = flowfeed.Pipeline(config(Squares(), sampler={"seed": 9}))
    got_a, got_b = [], []
    for batch_a, batch_b in zip(a, b):
        for batch, got in ((batch_a, got_a), (batch_b, got_b)):
            with batch:
                got.append((list(batch.samples), np.from_dlpack(batch["x"]).copy(),
                            np.from_dlpack(batch["y"]).copy()))
    check_bytes(got_a, reference_order())
    check_bytes(got_b, reference_order(seed=9))


def test_iterable_reads_samples_in_order_each_epoch_anew():
    def stream():
        for i in range(N + 50):  # longer than an epoch: the rest is never read
            yield {"x": sample_x(i), "y": i}

    cfg = config(stream, samples=N, pipeline={"epochs": 2}, sampler={"shuffle": False})
    cfg["nodes"][0].update(type="python_iterable", concurrency=1)
    got = take_all(flowfeed.Pipeline(cfg))
    check_bytes(got, reference_order(shuffle=False, epochs=2))

    cfg["nodes"][0]["params"]["callable"] = stream()  # a generator object: read once only
    with pytest.raises(flowfeed.ConfigError, match=r"<dict>:\d+:\d+: nodes\[0\]\.params\.callable: "
                       r"test_iterable_reads_samples_in_order_each_epoch_anew.<locals>.stream is an iterator, "
                       r"which can be read once"):
        flowfeed.Pipeline(cfg)
    cfg["nodes"][0]["params"]["callable"] = lambda: iter([(sample_x(i), i) for i in range(10)])
    with pytest.raises(flowfeed.NodeError, match=r"the iterable ended after 10 samples; each "
                       r"epoch takes 200 \(params.samples\)"):
        take_all(flowfeed.Pipeline(cfg))


def test_config_errors_name_the_key():
    with pytest.raises(flowfeed.ConfigError) as e:
        flowfeed.Pipeline(config(lambda i: {"x": sample_x(i)}))
    assert re.fullmatch(r"<dict>:\d+:\d+: nodes\[0\]\.params: samples is required for "
                        r"test_config_errors_name_the_key.<locals>.<lambda> \(a function has no size; a Dataset-like object gives "
                        r"__len__\) set the data set's size", str(e.value)), str(e.value)
    # A samples out of range is said once, exactly; before, a second line blamed the callable:
    # "param 'samples' is not set (is it declared in the schema?)".
    for samples, said in ((-1, "-1"), (2**63 - 1, "9223372036854775807")):
        with pytest.raises(flowfeed.ConfigError) as e:
            flowfeed.Pipeline(config(lambda i: {"x": sample_x(i)}, samples=samples))
        assert re.fullmatch(r"<dict>:\d+:\d+: nodes\[0\]\.params\.samples: " + said +
                            r" is out of range \(must be between 0 and 4000000000\)",
                            str(e.value)), str(e.value)
    with pytest.raises(flowfeed.ConfigError, match=r"<dict>:\d+:\d+: nodes\[0\]\.params\.callable: "
                       r"'no_such_loader' is neither a name given to flowfeed.register\(\)"):
        flowfeed.Pipeline(config("no_such_loader", samples=N))
    with pytest.raises(flowfeed.ConfigError, match=r"nodes\[0\]\.params\.callable: "
                       r"'ff_no_such_module:load': importing ff_no_such_module failed: "
                       r"ModuleNotFoundError"):
        flowfeed.Pipeline(config("ff_no_such_module:load", samples=N))
    with pytest.raises(flowfeed.ConfigError, match=r"nodes\[0\]\.params\.layout: 'x: float64 "
                       r"\[3\]': dtype 'float64' is not one of"):
        flowfeed.Pipeline(config(LOADERS["numpy"][0], samples=N, layout=["x: float64 [3]"]))
    with pytest.raises(TypeError, match=r"config\['nodes'\]\[1\]\['params'\]\['callable'\]: a "
                       r"builtin_function_or_method cannot be written in a config"):
        flowfeed.Pipeline(config(LOADERS["numpy"][0], samples=N, extra=[
            {"name": "n", "type": "normalize", "params": {"callable": print}}]))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_no_leak_over_10000_batches():
    held = object()
    xs = np.stack([sample_x(i) for i in range(N)])

    def load(indices):
        assert held is not None
        return {"x": xs[indices], "y": np.array(indices, dtype=np.int64)}

    p = flowfeed.Pipeline(config(load, samples=N, batched=True,
                                 pipeline={"batch_size": 2, "epochs": 100, "prefetch_depth": 8}))
    refs = sys.getrefcount(held)
    count = 0
    for batch in p:
        with batch:
            count += 1
            if count == 2000:
                gc.collect()
                rss = rss_bytes()
                refs = sys.getrefcount(held)
    gc.collect()
    assert count == 10000
    assert sys.getrefcount(held) == refs
    assert rss_bytes() - rss < 4 << 20
    assert p.free_buffers == p.total_buffers
    assert p.report()["allocations_after_build"] == 0


def test_config_md_documents_the_python_types():
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "CONFIG.md")).read()
    for key in ("`python`", "`python_transform`", "`python_iterable`", "`callable`", "`samples`",
                "`batched`", "`layout`"):
        assert key in text


def slow_load(i):
    time.sleep(0.002)  # sleeps release the GIL: the bodies overlap
    return {"x": sample_x(i), "y": i}


def test_dropping_a_running_pipeline_drains_it_without_deadlock():
    # The last reference goes while Python bodies run: the drain waits for them with the GIL
    # released (holding it, the bodies could never finish).
    p = flowfeed.Pipeline(config(slow_load, samples=N, pipeline={"prefetch_depth": 8}))
    it = iter(p)
    next(it).release()
    del it, p
    gc.collect()


def test_the_interpreter_exits_with_a_run_going(tmp_path):
    # Left running at exit, the run is stopped by the atexit hook before the interpreter goes.
    script = tmp_path / "exit_running.py"
    script.write_text(textwrap.dedent(f"""\
        import sys, time
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import flowfeed
        from test_python_nodes import config, slow_load
        p = flowfeed.Pipeline(config(slow_load, samples=100000))
        it = iter(p)
        next(it).release()
        KEEP = (p, it)
        print("exiting", flush=True)
        """))
    import subprocess
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert (done.returncode, done.stdout, done.stderr) == (0, "exiting\n", "")


def test_auto_concurrency_and_the_verdict_name_the_python_loader():
    cfg = config(slow_load, samples=N, pipeline={"prefetch_depth": 8, "epochs": 2})
    cfg["nodes"][0]["concurrency"] = "auto"
    p = flowfeed.Pipeline(cfg)
    got = take_all(p)
    check_bytes(got, reference_order(epochs=2))
    report = p.report()
    first = report["tuning"]["decisions"][0]
    assert (first["knob"], first["from"]) == ("nodes.load.concurrency", 1) and first["to"] > 1
    assert re.search(r"\bload\b", report["verdict"]), report["verdict"]


def test_a_failing_batch_callable_or_transform_skips_its_batch_under_on_error_skip():
    def load(indices):
        if 40 in indices:
            raise RuntimeError("no batch with 40")
        return {"x": np.stack([sample_x(i) for i in indices]),
                "y": np.array(indices, dtype=np.int64)}

    def aug(batch):
        if 100 in batch["y"]:
            raise RuntimeError("no batch with 100")

    p = flowfeed.Pipeline(config(load, samples=N, batched=True, sampler={"shuffle": False},
                                 layout=["x: float32 [3, 4]", "y: int64"],
                                 extra=[{"name": "aug", "type": "python_transform",
                                         "params": {"callable": aug}}],
                                 pipeline={"on_error": "skip", "max_skipped": 2}))
    got = take_all(p)
    order = [s for s in reference_order(shuffle=False) if 40 not in s and 100 not in s]
    check_bytes(got, order)
    report = p.report()
    assert report["skipped_batches"] == 2 and report["skipped_samples"] == 32
    assert any("RuntimeError: no batch with 100" in w for w in report["warnings"])
