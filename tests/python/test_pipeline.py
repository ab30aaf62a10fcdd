"""The flowfeed module on the host backend: bytes through DLPack, release semantics, errors,
Ctrl-C, several pipelines, reference counting."""
import ctypes
import gc
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
import torch.utils.dlpack

import flowfeed
import flowfeed_testing  # noqa: F401  (the fault node types, for test_nodes=True)


def expected_batches(data, rows):
    return -(-len(data.y) // rows)


def test_every_batch_arrives_byte_for_byte_in_torch_and_numpy(data):
    pipeline = flowfeed.Pipeline(data.config(epochs=2, batch_size=64))
    seen = []
    for _ in range(pipeline.epochs):
        for batch in pipeline.epoch():
            with batch:
                assert batch.keys() == ["x", "y"]
                rows = np.array(batch.samples)
                x = torch.utils.dlpack.from_dlpack(batch["x"])
                y = torch.utils.dlpack.from_dlpack(batch["y"])
                assert x.dtype == torch.float32 and y.dtype == torch.int32
                assert tuple(x.shape) == (len(rows), 8) and x.is_contiguous()
                assert np.array_equal(x.numpy(), data.x[rows])
                assert np.array_equal(y.numpy(), data.y[rows])
                nx = np.from_dlpack(batch["x"])
                assert np.array_equal(nx, data.x[rows])
                assert np.asarray(batch["y"]).tobytes() == data.y[rows].tobytes()
                assert batch["x"].__dlpack_device__() == (1, 0)  # kDLCPU
                seen.append((batch.epoch, batch.index_in_epoch, batch.seq, rows))
                del x, y, nx
    per_epoch = expected_batches(data, 64)
    assert [(e, i, s) for e, i, s, _ in seen] == [
        (s // per_epoch, s % per_epoch, s) for s in range(2 * per_epoch)]
    for epoch in range(2):  # every sample once per epoch, shuffled
        rows = np.concatenate([r for e, _, _, r in seen if e == epoch])
        assert sorted(rows.tolist()) == list(range(len(data.y)))
        assert rows.tolist() != list(range(len(data.y)))
    assert pipeline.free_buffers == pipeline.total_buffers
    report = pipeline.report()
    assert report["batches"] == 2 * per_epoch and report["interrupted"] is False


def test_tensor_keeps_its_batch_until_freed(data):
    pipeline = flowfeed.Pipeline(data.config(epochs=1, depth=4))
    kept = None
    for batch in pipeline:
        x = torch.from_dlpack(batch["x"])
        if batch.seq == 0:
            kept, kept_rows = x, np.array(batch.samples)
        batch.release()
        with pytest.raises(ValueError, match=r"^batch \d+ was released: its tensors can no longer be taken$"):
            batch["x"]
        del x
    # The run's last batch is released but batch 0's tensor is alive: it still holds its buffer.
    assert pipeline.held == 1
    assert pipeline.free_buffers == pipeline.total_buffers - 1  # its upload buffer
    assert np.array_equal(kept.numpy(), data.x[kept_rows])
    del kept
    assert pipeline.held == 0
    assert pipeline.free_buffers == pipeline.total_buffers
    assert pipeline.report()["batches"] == expected_batches(data, 64)


def test_holding_every_batch_stalls_with_the_held_batches_named(data):
    # 1 s: each of the three batches must come within it on a busy machine too.
    pipeline = flowfeed.Pipeline(data.config(depth=3, shuffle=False),
                                 overrides={"pipeline.stall_timeout_s": 1})
    kept = []
    with pytest.raises(flowfeed.Error) as error:
        for batch in pipeline:
            kept.append(torch.from_dlpack(batch["x"]))
            if batch.seq < 2:
                batch.release()
    assert str(error.value) == (
        "run stalled: the caller holds all 3 batches the pipeline may have in flight "
        "(pipeline.prefetch_depth) and none came back for 1 s: "
        "batch 0 (epoch 0: released, 1 exported tensor alive); "
        "batch 1 (epoch 0: released, 1 exported tensor alive); "
        "batch 2 (epoch 0: not released, 1 exported tensor alive); "
        "a batch goes back once it was released and every tensor taken from it was freed "
        "(release batches and drop tensors kept across steps, or raise pipeline.prefetch_depth)")
    del batch
    kept.clear()
    # The run goes on from where it stalled once the batches are back.
    count = 3
    for batch in pipeline:
        count += 1
        batch.release()
    assert count == expected_batches(data, 64)
    assert pipeline.free_buffers == pipeline.total_buffers


def test_config_error_has_the_full_text(data, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(data.config().replace("concurrency: 2", "concurency: 2"))
    with pytest.raises(flowfeed.ConfigError) as error:
        flowfeed.Pipeline(path)
    assert str(error.value) == (
        f"{path}:4:30: nodes[0].concurency: unknown key (did you mean 'concurrency'?)")
    assert isinstance(error.value, flowfeed.Error) and isinstance(error.value, RuntimeError)
    with pytest.raises(flowfeed.ConfigError) as error:
        flowfeed.Pipeline(data.config(), overrides={"pipeline.prefetch_depth": 0})
    assert str(error.value) == ("--set pipeline.prefetch_depth=0: pipeline.prefetch_depth: 0 is out "
                                "of range (must be between 1 and 4096)")


def test_a_run_mode_config_is_refused_when_stepped(data):
    config = data.config().replace("mode: pull", "mode: run") + \
        "  - { name: train, type: discard }\n"
    pipeline = flowfeed.Pipeline(config)
    with pytest.raises(flowfeed.ConfigError, match=r"^<string>:\d+:\d+: pipeline\.mode: Pipeline::start\(\) "
                       r"hands batches to the caller's loop, and this pipeline has mode: run"):
        pipeline.epoch()


def test_run_error_has_the_full_text(data):
    config = data.config(extra_nodes="""\
        - { name: boom, type: fault_transform, params: { mode: throw, at_batch: 5 } }
        """)
    pipeline = flowfeed.Pipeline(config, test_nodes=True)
    taken = 0
    with pytest.raises(flowfeed.NodeError) as error:
        for batch in pipeline:
            taken += 1
            batch.release()
    assert str(error.value) == (
        "node 'boom' (fault_transform, <string>:7) batch 5 (epoch 0): "
        "fault_transform: injected failure at batch 5")
    assert taken <= 5  # the failure ends the run: batches still in flight are not handed out
    pipeline.stop()
    assert pipeline.free_buffers == pipeline.total_buffers


def test_data_error_is_a_data_error(tmp_path):
    (tmp_path / "x.npy").write_bytes(b"not an npy file")
    np.save(tmp_path / "y.npy", np.arange(4, dtype=np.int32))
    config = f"""
pipeline: {{ mode: pull, device: host }}
nodes:
  - {{ name: load, type: npy, params: {{ features: {tmp_path}/x.npy, labels: {tmp_path}/y.npy }} }}
  - {{ name: upload, type: host_upload }}
"""
    with pytest.raises(flowfeed.DataError, match=r"x\.npy"):
        flowfeed.Pipeline(config)


def interrupt_mid_epoch(data):
    """Batch 5 takes 1.5 s in a node; SIGINT comes 0.3 s after batch 4 was taken, while the loop
    waits inside the pipeline for batch 5. The loader runs serially here: at concurrency 2 batch 5
    can finish loading first and enter the serial `slow` node ahead of batch 4 (order is only
    restored at the end), so batch 4 would come out after the stall, the rest of the run right
    after it, and the timer would be cancelled before it fired."""
    config = data.config(epochs=3, extra_nodes="""\
        - { name: slow, type: fault_transform, params: { mode: stall, at_batch: 5, stall_s: 1.5 } }
        """)
    pipeline = flowfeed.Pipeline(config, overrides={"nodes.load.concurrency": 1}, test_nodes=True)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    taken = []
    try:
        with pytest.raises(KeyboardInterrupt):
            for batch in pipeline:
                taken.append(batch.seq)
                batch.release()
                if batch.seq == 4:
                    timer.start()
    finally:
        timer.cancel()
    assert taken == [0, 1, 2, 3, 4]
    assert pipeline.free_buffers == pipeline.total_buffers
    report = pipeline.report()
    assert report["interrupted"] is True
    assert report["batches"] < 3 * expected_batches(data, 64)
    # The pipeline runs again afterwards.
    assert sum(1 for _ in pipeline.epoch()) == expected_batches(data, 64)


def test_ctrl_c_mid_epoch_raises_keyboard_interrupt_and_drains(data):
    interrupt_mid_epoch(data)


def test_ctrl_c_raises_even_after_a_native_library_replaced_pythons_handler(data):
    # What a native library can do when it loads (seen with CuPy on the GPU machine): put a SIGINT
    # handler of its own in front of Python's without chaining to it. Here libc's srand stands in
    # for it (it ignores the signal); Python would never raise KeyboardInterrupt on its own.
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signal.SIGINT, ctypes.cast(libc.srand, ctypes.c_void_p).value)
    try:
        interrupt_mid_epoch(data)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own again


def test_two_pipelines_in_one_process(data, tmp_path):
    first = flowfeed.Pipeline(data.config(batch_size=50, shuffle=False))
    second = flowfeed.Pipeline(data.config(batch_size=100))
    a, b = iter(first), iter(second)
    got_a, got_b = [], []
    for _ in range(10):
        for it, got in ((a, got_a), (b, got_b)):
            with next(it) as batch:
                x = torch.from_dlpack(batch["x"]).clone()
                got.append((np.array(batch.samples), x))
    for got, rows in ((got_a, 50), (got_b, 100)):
        for samples, x in got:
            assert len(samples) == rows and np.array_equal(x.numpy(), data.x[samples])
    assert [s.tolist() for s, _ in got_a] == [list(range(i * 50, i * 50 + 50)) for i in range(10)]
    first.stop()
    second.stop()
    assert first.free_buffers == first.total_buffers
    assert second.free_buffers == second.total_buffers


def test_no_leak_after_10000_batches(data):
    config = data.config(epochs=20, batch_size=2, depth=8)
    pipeline = flowfeed.Pipeline(config)
    baseline = sys.getrefcount(pipeline)
    count = 0
    for batch in pipeline:
        x = torch.from_dlpack(batch["x"])
        y = np.from_dlpack(batch["y"])
        capsule = batch["x"].__dlpack__()  # never consumed: its destructor frees the tensor
        count += int(x.shape[0] == y.shape[0])
        del x, y, capsule
        batch.release()
    del batch
    gc.collect()
    assert count == 10000
    assert sys.getrefcount(pipeline) == baseline
    assert pipeline.held == 0
    assert pipeline.free_buffers == pipeline.total_buffers
    assert not [o for o in gc.get_objects() if type(o) in (flowfeed.Batch, flowfeed.Tensor)]
    report = pipeline.report()
    assert report["batches"] == 10000 and report["allocations_after_build"] == 0


def test_host_tensors_refuse_cuda_streams(data):
    pipeline = flowfeed.Pipeline(data.config())
    with next(iter(pipeline)) as batch:
        with pytest.raises(ValueError, match="the batch is in host memory, where the stream must be None"):
            batch["x"].__dlpack__(stream=5)
        with pytest.raises(BufferError):
            batch["x"].__dlpack__(copy=True)
        assert not hasattr(batch["x"], "__cuda_array_interface__")
        with pytest.raises(KeyError, match="the batch has no tensor 'z' \\(it has 'x', 'y'\\)"):
            batch["z"]
    pipeline.stop()
    assert pipeline.free_buffers == pipeline.total_buffers


def test_python_layer_and_cpp_loop_deliver_the_same_run(data):
    pipeline = flowfeed.Pipeline(data.config(epochs=2))
    cpp = pipeline.run_pull_loop()
    py = sum(1 for b in pipeline for _ in [b.release()])
    assert cpp["batches"] == py == 2 * expected_batches(data, 64)


def test_a_pipeline_is_stepped_by_one_thread_at_a_time(data):
    config = data.config(extra_nodes="""\
        - { name: slow, type: fault_transform, params: { mode: stall, at_batch: 0, stall_s: 1.0 } }
        """)
    pipeline = flowfeed.Pipeline(config, test_nodes=True)
    it = iter(pipeline)
    first = []
    waiter = threading.Thread(target=lambda: first.append(next(it).seq))
    waiter.start()
    time.sleep(0.3)  # the thread now waits for batch 0 (1 s in the slow node)
    with pytest.raises(RuntimeError) as error:
        pipeline.stop()
    assert str(error.value) == (
        "the pipeline is in use: another thread waits for its next batch (step a pipeline from "
        "one thread at a time)")
    waiter.join()
    assert first == [0]
    pipeline.stop()
    assert pipeline.free_buffers == pipeline.total_buffers


def test_views_deliver_every_batch_byte_for_byte_and_reuse_one_tensor_per_buffer(data):
    pipeline = flowfeed.Pipeline(data.config(epochs=2, batch_size=64, depth=3))
    per_epoch = expected_batches(data, 64)
    reference = flowfeed.Pipeline(data.config(epochs=2, batch_size=64, depth=3))
    expected = []
    for _ in range(2):
        for batch in reference.epoch():
            with batch:
                expected.append(np.array(batch.samples))
    seen, objects = [], set()
    views = pipeline.views(["x", "y"], torch.from_dlpack)
    for epoch in range(2):
        for x, y in views:
            rows = expected[len(seen)]
            assert x.dtype == torch.float32 and tuple(x.shape) == (len(rows), 8)
            assert np.array_equal(x.numpy(), data.x[rows])
            assert np.array_equal(y.numpy(), data.y[rows])
            assert pipeline.held == 1  # this batch only: the one before went back
            seen.append(rows)
            objects.add((id(x), len(rows)))
        assert len(seen) == (epoch + 1) * per_epoch
    # 16 batches an epoch through the upload pool's 3 buffers: one tensor per buffer for the full
    # batches, imported once for both epochs, and one per epoch's short last batch (1000 = 15 * 64
    # + 40 rows; the buffer it lands in may differ).
    assert len({o for o in objects if o[1] == 64}) == 3
    assert 1 <= len({o for o in objects if o[1] == 40}) <= 2
    assert pipeline.held == 0 and pipeline.free_buffers == pipeline.total_buffers
    assert pipeline.report()["batches"] == 2 * per_epoch
    # A new Views object imports afresh (a new run's first epoch here).
    assert not {o[0] for o in objects} & {id(x) for x in pipeline.views("x", torch.from_dlpack)}
    pipeline.stop()


@pytest.mark.parametrize("depth,group", [(8, 2), (12, 3), (40, 8)])
def test_views_give_batches_back_in_groups_of_a_quarter_of_the_depth(data, depth, group):
    pipeline = flowfeed.Pipeline(data.config(epochs=2, depth=depth, shuffle=False))
    views = pipeline.views(["x", "y"], torch.from_dlpack)
    held, n = [], 0
    for epoch in range(2):
        for x, y in views:
            k = n % 16
            rows = np.arange(64 * k, min(64 * (k + 1), len(data.y)))
            assert np.array_equal(y.numpy(), rows) and np.array_equal(x.numpy(), data.x[rows])
            held.append(pipeline.held)
            n += 1
        # The epoch's end gives back what was left; the next epoch's first batch is taken already.
        assert pipeline.held == (1 if epoch == 0 else 0)
    assert n == 32
    # This batch and up to group - 1 read before it: once `group` were read, they go back together
    # as the next batch is taken.
    assert held[:group + 1] == list(range(1, group + 1)) + [1] and max(held) == group
    assert pipeline.free_buffers == pipeline.total_buffers


def test_views_of_one_name_yield_the_tensor_itself_and_take_numpy(data):
    pipeline = flowfeed.Pipeline(data.config(epochs=1, shuffle=False))
    got = [x.copy() for x in pipeline.views("y", np.from_dlpack)]
    assert np.array_equal(np.concatenate(got), data.y)


def test_a_view_kept_past_its_step_holds_the_buffer_not_the_batch(data):
    # The documented contract: a view is the pool buffer; it shows whichever batch filled it last.
    pipeline = flowfeed.Pipeline(data.config(epochs=1, depth=2, shuffle=False))
    kept = [x for x in pipeline.views("y", torch.from_dlpack)]
    assert pipeline.held == 0 and pipeline.free_buffers == pipeline.total_buffers
    assert len({id(x) for x in kept}) == 3  # two buffers, and the short batch's
    del pipeline
    gc.collect()
    assert int(kept[-1][0]) == 960  # the pipeline's memory lives as long as a view does


def test_views_errors_have_the_full_text(data):
    pipeline = flowfeed.Pipeline(data.config(epochs=1))
    with pytest.raises(KeyError, match=r"the batch has no tensor 'z' \(it has 'x', 'y'\)"):
        next(iter(pipeline.views(["x", "z"], torch.from_dlpack)))
    with pytest.raises(TypeError, match=r"^views: importer must be callable \(e.g. torch.from_dlpack\)$"):
        pipeline.views("x", "torch")
    with pytest.raises(ValueError, match=r"^views: name at least one tensor \(e\.g\. \['x', 'y'\]\)$"):
        pipeline.views([], torch.from_dlpack)
    with pytest.raises(ValueError, match=r"^stream 5: the batch is in host memory, where the stream must be None \(or -1\)$"):
        next(iter(pipeline.views("x", torch.from_dlpack, stream=5)))
    pipeline.stop()
    assert pipeline.held == 0 and pipeline.free_buffers == pipeline.total_buffers


CHAINING_HANDLER = r"""
#include <signal.h>
#include <string.h>
static struct sigaction previous;
static void on_signal(int sig, siginfo_t* info, void* context) {
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction) previous.sa_sigaction(sig, info, context);
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
  }
}
int install(void) {
  struct sigaction mine;
  memset(&mine, 0, sizeof mine);
  mine.sa_sigaction = on_signal;
  mine.sa_flags = SA_SIGINFO;
  sigemptyset(&mine.sa_mask);
  return sigaction(SIGINT, &mine, &previous);
}
"""


def test_ctrl_c_raises_when_a_native_handler_chains_back_to_flowfeeds(data, tmp_path):
    # A native library that loads after a run started (JAX and CuPy on the GPU machine) puts its
    # own handler in front of flowfeed's and chains to it; the next run puts flowfeed's in front
    # again, chaining to the library's: one Ctrl-C then goes flowfeed -> library -> flowfeed.
    # It must raise KeyboardInterrupt once, not recurse until the stack overflows.
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the chaining handler")
    source = tmp_path / "chain.c"
    source.write_text(CHAINING_HANDLER)
    library = tmp_path / "libchain.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    first = flowfeed.Pipeline(data.config(epochs=1))
    assert sum(1 for _ in first.epoch()) == expected_batches(data, 64)  # flowfeed's handler is in
    try:
        assert ctypes.CDLL(str(library)).install() == 0
        interrupt_mid_epoch(data)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own again


def test_auto_knobs_are_tuned_for_the_python_loop_and_reported():
    # A loader of 4 ms a batch at one body against a loop of about 1 ms: the tuner gives the
    # loader the bodies the loop needs, and names the loop in its reasons.
    config = """
pipeline: { mode: pull, epochs: 1, batch_size: 64, prefetch_depth: auto, threads: 8, device: host }
nodes:
  - { name: load, type: synthetic, concurrency: auto, params: { batches: 240, sample_shape: [64], delay_ms: 4 } }
  - { name: stage, type: host_staging, concurrency: 2 }
  - { name: upload, type: host_upload }
"""
    pipeline = flowfeed.Pipeline(config)
    count = 0
    for batch in pipeline:
        time.sleep(0.001)
        count += 1
        batch.release()
    assert count == 240
    tuning = pipeline.report()["tuning"]
    assert tuning["active"] is True and tuning["budget"]["within_budget"] is True
    first = tuning["decisions"][0]
    assert first["knob"] == "nodes.load.concurrency" and first["from"] == 1
    assert first["why"].startswith("the caller's loop waits "), first["why"]
    assert tuning["settled"]["nodes.load.concurrency"] >= 3
    assert "  - { name: load, concurrency: " in tuning["yaml"]
