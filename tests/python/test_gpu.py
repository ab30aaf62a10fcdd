"""The flowfeed module on the CUDA backend (marked gpu: skipped without a device)."""
import numpy as np
import pytest
import torch
import torch.utils.dlpack

import flowfeed
import flowfeed_testing  # noqa: F401  (the fault node types, for test_nodes=True)

pytestmark = pytest.mark.gpu


def cuda_config(data, extra_nodes="", epochs=1, depth=4):
    return data.config(epochs=epochs, depth=depth, device="cuda", stage="pinned_staging",
                       upload="cuda_upload", extra_nodes=extra_nodes)


def test_bytes_after_from_dlpack_on_a_non_default_stream(data):
    pipeline = flowfeed.Pipeline(cuda_config(data, epochs=2))
    stream = torch.cuda.Stream()
    got = []
    with torch.cuda.stream(stream):
        for batch in pipeline:
            with batch:
                assert batch["x"].__dlpack_device__() == (2, 0)  # kDLCUDA, device 0
                x = torch.from_dlpack(batch["x"])
                y = torch.from_dlpack(batch["y"])
                assert x.is_cuda and x.device.index == 0
                # Copies queued on `stream`, which waits on the batch's ready event; the reuse
                # event is recorded on it when x and y go.
                got.append((np.array(batch.samples), x.clone(), y.clone()))
                del x, y
    stream.synchronize()
    assert len(got) == 2 * 16
    for samples, x, y in got:
        assert np.array_equal(x.cpu().numpy(), data.x[samples])
        assert np.array_equal(y.cpu().numpy(), data.y[samples])
    assert pipeline.free_buffers == pipeline.total_buffers


def late_config(data):
    # late_write fills x with seq + 1000 on the GPU 50 ms after the batch reaches the caller.
    return cuda_config(data, depth=2, extra_nodes="""\
        - { name: late, type: late_write, params: { spin_ms: 50 } }
        """)


def test_consumer_stream_waits_on_the_ready_event(data):
    pipeline = flowfeed.Pipeline(late_config(data), test_nodes=True)
    stream = torch.cuda.Stream()
    got = []
    with torch.cuda.stream(stream):
        for batch in pipeline:
            with batch:
                x = torch.from_dlpack(batch["x"])
                got.append((batch.seq, x.clone()))  # reads at once on `stream`
                del x
    stream.synchronize()
    for seq, x in got:
        assert torch.all(x == seq + 1000).item(), f"batch {seq} was read before it was ready"


def test_reading_without_the_wait_sees_the_old_bytes(data):
    # The control of the test above: stream -1 (no synchronization) reads before late_write ran,
    # so the test above would fail if __dlpack__ did not make the stream wait.
    pipeline = flowfeed.Pipeline(late_config(data), test_nodes=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        batch = next(iter(pipeline))
        x = torch.utils.dlpack.from_dlpack(batch["x"].__dlpack__(stream=-1))
        early = x.clone()
        stream.synchronize()
        del x
        batch.release()
    assert not torch.all(early == batch.seq + 1000).item()
    pipeline.stop()


def test_cuda_array_interface_carries_the_stream(data):
    # CuPy synchronizes on the interface's stream (CUPY_CUDA_ARRAY_INTERFACE_SYNC, on by default);
    # torch.as_tensor ignores it (seen with torch 2.11), so PyTorch users take __dlpack__.
    cupy = pytest.importorskip("cupy")
    pipeline = flowfeed.Pipeline(late_config(data), test_nodes=True)
    got = []
    for batch in pipeline:
        with batch:
            cai = batch["x"].__cuda_array_interface__
            assert cai["version"] == 3 and cai["typestr"] == "<f4" and cai["stream"] not in (None, 0)
            x = cupy.asarray(batch["x"])
            got.append((batch.seq, x.copy()))
            del x
    cupy.cuda.runtime.deviceSynchronize()
    for seq, x in got:
        assert bool(cupy.all(x == seq + 1000))
    assert pipeline.free_buffers == pipeline.total_buffers


def test_cupy_and_jax_import_without_copies(data):
    cupy = pytest.importorskip("cupy")
    pipeline = flowfeed.Pipeline(cuda_config(data))
    with next(iter(pipeline)) as batch:
        samples = np.array(batch.samples)
        a = cupy.from_dlpack(batch["x"])
        assert a.data.ptr == batch["x"].data_ptr
        assert np.array_equal(cupy.asnumpy(a), data.x[samples])
        del a
    pipeline.stop()


def test_jax_imports_without_a_copy(data, monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    import jax.dlpack
    pipeline = flowfeed.Pipeline(cuda_config(data))
    with next(iter(pipeline)) as batch:
        samples = np.array(batch.samples)
        a = jax.dlpack.from_dlpack(batch["x"])
        assert np.array_equal(np.asarray(a), data.x[samples])
        del a
    pipeline.stop()


def test_views_on_a_non_default_stream_deliver_every_batch(data):
    pipeline = flowfeed.Pipeline(cuda_config(data, epochs=2, depth=3))
    stream = torch.cuda.Stream()
    got, objects = [], set()
    views = pipeline.views(["x", "y"], torch.from_dlpack, stream=stream)
    with torch.cuda.stream(stream):
        for _ in range(2):
            for x, y in views:
                assert x.is_cuda and x.device.index == 0
                got.append((x.clone(), y.clone()))  # queued on `stream`, after the wait
                objects.add((id(x), x.shape[0]))
    # The upload pool's 3 buffers, imported once for both epochs, and each epoch's short batch.
    assert len({o for o in objects if o[1] == 64}) == 3
    stream.synchronize()
    assert len(got) == 2 * 16
    for x, y in got:
        samples = y.cpu().numpy()
        assert np.array_equal(x.cpu().numpy(), data.x[samples])
    assert pipeline.free_buffers == pipeline.total_buffers


def test_views_make_the_stream_wait_on_the_ready_event(data):
    # late_write fills x 50 ms after the batch reaches the caller: without the wait, the clone
    # on `stream` would read the bytes before it.
    pipeline = flowfeed.Pipeline(late_config(data), test_nodes=True)
    stream = torch.cuda.Stream()
    got, seq = [], 0
    with torch.cuda.stream(stream):
        for x in pipeline.views("x", torch.from_dlpack, stream=stream):
            got.append((seq, x.clone()))
            seq += 1
    stream.synchronize()
    for seq, x in got:
        assert torch.all(x == seq + 1000).item(), f"batch {seq} was read before it was ready"


# PyTorch's default stream is the legacy default stream (1). flowfeed queues its wait and its reuse
# event for that stream on the calling thread's per-thread default stream, which the legacy stream
# orders with: the tests below read on the default stream and fail if that ordering did not hold.

def test_the_default_stream_waits_on_the_ready_event(data):
    pipeline = flowfeed.Pipeline(late_config(data), test_nodes=True)
    got, seq = [], 0
    for x in pipeline.views("x", torch.from_dlpack, stream=torch.cuda.current_stream()):
        got.append((seq, x.clone()))  # on the default stream
        seq += 1
    torch.cuda.synchronize()
    assert seq == 16
    for seq, x in got:
        assert torch.all(x == seq + 1000).item(), f"batch {seq} was read before it was ready"


SLOW_READ_CYCLES = 40_000_000  # torch.cuda._sleep: about 20 ms on the H200


def test_a_buffer_read_late_on_the_default_stream_is_not_overwritten(data):
    # Each batch is read by work queued on the default stream behind a 20 ms kernel, after the
    # batch went back; with 2 batches in flight the pipeline uploads into that buffer again long
    # before the read, unless the upload waits on the reuse event recorded after the read.
    pipeline = flowfeed.Pipeline(cuda_config(data, epochs=2, depth=2))
    got = []
    for batch in pipeline:
        with batch:
            x = torch.from_dlpack(batch["x"])
            torch.cuda._sleep(SLOW_READ_CYCLES)
            got.append((np.array(batch.samples), x.clone()))
            del x
    torch.cuda.synchronize()
    assert len(got) == 2 * 16
    for samples, x in got:
        assert np.array_equal(x.cpu().numpy(), data.x[samples])
    assert pipeline.free_buffers == pipeline.total_buffers


@pytest.mark.parametrize("depth", [2, 8, 12])
def test_views_read_late_on_the_default_stream_see_their_own_batch(data, depth):
    # The same through Pipeline.views, in order (no shuffle): batch k of an epoch holds samples
    # 64k to 64k+63. At depth 8 and 12 batches go back in groups of 2 and 3 under one event.
    pipeline = flowfeed.Pipeline(data.config(epochs=2, depth=depth, device="cuda",
                                             stage="pinned_staging", upload="cuda_upload",
                                             shuffle=False))
    views = pipeline.views(["x", "y"], torch.from_dlpack, stream=torch.cuda.current_stream())
    got = []
    for _ in range(2):
        for x, y in views:
            torch.cuda._sleep(SLOW_READ_CYCLES)
            got.append((x.clone(), y.clone()))
    torch.cuda.synchronize()
    assert len(got) == 2 * 16
    for j, (x, y) in enumerate(got):
        k = j % 16
        samples = np.arange(64 * k, min(64 * (k + 1), len(data.y)))
        assert np.array_equal(y.cpu().numpy(), samples), f"batch {j} holds another batch's rows"
        assert np.array_equal(x.cpu().numpy(), data.x[samples])
    assert pipeline.free_buffers == pipeline.total_buffers
