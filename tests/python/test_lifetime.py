"""Arrays and tensors taken from a batch stay readable however the pipeline goes (PYTHON.md,
"Lifetime"): close(), stop(), del, a failed run, interpreter shutdown. Each case runs in a
subprocess, which would die of SIGSEGV if the pool's memory went with the pipeline."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import flowfeed
import flowfeed_testing  # noqa: F401  (the fault node types, for test_nodes=True)

SCRIPT = textwrap.dedent("""\
    import gc, sys
    import numpy as np, torch, flowfeed, flowfeed_testing
    folder, how = sys.argv[1], sys.argv[2]
    # Batches of 1 MiB: the pool's buffers are mapped pages of their own, unmapped when freed.
    n, features = 256, 4096
    x = np.arange(n * features, dtype=np.float32).reshape(n, features)
    np.save(folder + "/x.npy", x)
    np.save(folder + "/y.npy", np.arange(n, dtype=np.int32))
    config = f'''
    pipeline: {{ mode: pull, epochs: 1, batch_size: 64, prefetch_depth: 2, device: host }}
    nodes:
      - {{ name: load, type: npy, params: {{ features: {folder}/x.npy, labels: {folder}/y.npy }} }}
      - {{ name: upload, type: host_upload }}
      - {{ name: boom, type: fault_transform, params: {{ mode: throw, at_batch: 3 }} }}
    '''
    if how != "failed run":
        config = config[:config.index("  - { name: boom")]
    pipeline = flowfeed.Pipeline(config, test_nodes=True)
    batch = next(iter(pipeline))
    rows = np.array(batch.samples)
    array = np.asarray(batch["x"])                  # __array_interface__
    tensor = torch.from_dlpack(batch["y"])          # DLPack
    view = next(iter(pipeline.views("x", np.from_dlpack))) if how == "close views" else None
    expected = x[rows].sum()

    def read(when):
        # After stop() or a failed run the batch went back (PYTHON.md): its memory stays, but the
        # draining run may have filled it with another batch. Otherwise it holds its bytes.
        kept = how not in ("stop", "failed run")
        assert array.sum() == expected or not kept, when
        assert tensor.sum().item() == int(rows.sum()) or not kept, when
        if view is not None:
            view.sum()
        print("read", when, flush=True)

    if how in ("close", "close views"):
        batch.release()
        pipeline.close()
    elif how == "stop":
        pipeline.stop()
    elif how == "del":
        del batch, pipeline
        gc.collect()
    elif how == "failed run":
        try:
            for b in pipeline:
                b.release()
        except flowfeed.NodeError:
            pass
        del batch, pipeline
        gc.collect()
    if how == "shutdown":
        # The array outlives everything: the interpreter frees the pipeline and it in any order.
        class ReadAtExit:
            def __del__(self):
                read("at shutdown")
        sys.modules["__main__"].reader = ReadAtExit()
    else:
        read("after " + how)
        del array, tensor, view
        gc.collect()
    print("done", flush=True)
    """)


@pytest.mark.parametrize("how", ["close", "close views", "stop", "del", "failed run",
                                 "shutdown"])
def test_arrays_from_a_batch_stay_readable_after_the_pipeline_goes(tmp_path, how):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), how],
                            capture_output=True, text=True, timeout=120, env=os.environ)
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout
    if how != "shutdown":
        assert f"read after {how}" in result.stdout


def test_a_closed_pipeline_hands_out_nothing_more_while_an_array_holds_it(data):
    pipeline = flowfeed.Pipeline(data.config(epochs=2))
    iterator = iter(pipeline)
    batch = next(iterator)
    rows = np.array(batch.samples)
    array = np.asarray(batch["x"])
    pipeline.close()
    assert list(iterator) == []  # the run stopped: no batch after close()
    with pytest.raises(ValueError, match="^the pipeline was closed$"):
        pipeline.epoch()
    with pytest.raises(ValueError, match="^the pipeline was closed$"):
        pipeline.state_dict()
    assert np.array_equal(array, data.x[rows])  # the held batch keeps its bytes
    del batch, array
