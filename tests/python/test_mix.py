"""A `mix` whose sources are a Python loader (a registered callable) and a C++ one (synthetic):
the bytes of both arrive, each Python sample once per epoch, in an order that does not depend on
the number of loader bodies."""

import numpy as np

import flowfeed

PY_SAMPLES = 50


def py_x(i):
    return (np.arange(16, dtype=np.uint32) * 7 + i * 13).astype(np.uint8)


def py_sample(i):
    # y < 0 marks the Python source's rows (synthetic labels are in [0, 10)).
    return {"x": py_x(i), "y": np.int32(-1 - i)}


flowfeed.register("ff_test_mix_source", py_sample)


def mix_config(concurrency):
    return {
        "pipeline": {"batch_size": 8, "epochs": 2, "prefetch_depth": 4, "device": "host"},
        "sampler": {"shuffle": True, "seed": 3},
        "nodes": [
            {"name": "load", "type": "mix", "concurrency": concurrency,
             "sources": [
                 {"type": "python", "weight": 1,
                  "params": {"callable": "ff_test_mix_source", "samples": PY_SAMPLES,
                             "layout": ["x: uint8 [16]", "y: int32"]}},
                 {"type": "synthetic", "weight": 3,
                  "params": {"samples": 1000, "sample_shape": [16], "dtype": "uint8", "seed": 2}},
             ]},
            {"name": "stage", "type": "host_staging"},
            {"name": "upload", "type": "host_upload"},
        ],
    }


def take_rows(concurrency):
    p = flowfeed.Pipeline(mix_config(concurrency))
    rows = []
    for batch in p:
        with batch:
            x = np.from_dlpack(batch["x"]).copy()
            y = np.from_dlpack(batch["y"]).copy()
            rows.extend((batch.epoch, x[r].tobytes(), int(y[r])) for r in range(len(y)))
    p.close()
    return rows


def test_a_python_source_mixed_with_a_cpp_source():
    rows = take_rows(3)
    # first_exhausted: the Python source (50 samples, weight 1 of 4) runs out first: 200 positions
    # an epoch, 50 of them Python's.
    assert len(rows) == 2 * 200
    for epoch in (0, 1):
        mine = [r for r in rows if r[0] == epoch]
        python = sorted(-1 - y for _, _, y in mine if y < 0)
        assert python == list(range(PY_SAMPLES))
        for _, x, y in mine:
            if y < 0:
                assert x == py_x(-1 - y).tobytes()
            else:
                assert y < 10
        assert sum(1 for _, _, y in mine if y >= 0) == 150
    # The same bytes in the same order with one loader body.
    assert take_rows(1) == rows


def py_sample_failing(i):
    if i in (7, 31):
        raise ValueError(f"bad sample {i}")
    return py_sample(i)


flowfeed.register("ff_test_mix_failing_source", py_sample_failing)


def test_rows_a_source_drops_under_on_error_skip_leave_the_mix_batch_and_are_counted_once():
    config = mix_config(2)
    config["pipeline"].update({"on_error": "skip", "max_skipped": 4})
    config["nodes"][0]["sources"][0]["params"]["callable"] = "ff_test_mix_failing_source"
    p = flowfeed.Pipeline(config)
    rows = []
    for batch in p:
        with batch:
            x = np.from_dlpack(batch["x"]).copy()
            y = np.from_dlpack(batch["y"]).copy()
            assert len(batch.samples) == len(y)
            rows.extend((batch.epoch, x[r].tobytes(), int(y[r])) for r in range(len(y)))
    report = p.report()
    p.close()
    # Two samples of the Python source fail in each of the 2 epochs; every other row arrives
    # with its own bytes (the rows after a dropped one moved up, x and y together).
    assert len(rows) == 2 * 200 - 4
    for epoch in (0, 1):
        python = sorted(-1 - y for e, _, y in rows if e == epoch and y < 0)
        assert python == [i for i in range(PY_SAMPLES) if i not in (7, 31)]
    for _, x, y in rows:
        if y < 0:
            assert x == py_x(-1 - y).tobytes()
    assert report["skipped_samples"] == 4
