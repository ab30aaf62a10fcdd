"""Pipeline.state_dict() / load_state_dict(): the resume cursor of docs/RESUME.md as plain Python
values. A run interrupted after any batch and resumed in a new Pipeline delivers the rest of the
uninterrupted run's batches, sample for sample and byte for byte."""
import copy
import io
import pickle

import numpy as np
import pytest
import torch

import flowfeed


def take(pipeline, count=None):
    """(samples, x bytes, y bytes) of the next `count` batches of the run (all when None), each
    released at once; checks every batch's bytes against the data set."""
    out = []
    if count == 0:
        return out
    for batch in pipeline:
        with batch:
            out.append((tuple(batch.samples), np.asarray(batch["x"]).tobytes(),
                        np.asarray(batch["y"]).tobytes()))
        if count is not None and len(out) == count:
            break
    return out


def round_trip(state):
    """Through pickle and torch.save, as a training script keeps it beside its model."""
    state = pickle.loads(pickle.dumps(state))
    buffer = io.BytesIO()
    torch.save({"data": state}, buffer)
    buffer.seek(0)
    return torch.load(buffer)["data"]


def check_bytes(data, batches):
    for samples, x, y in batches:
        rows = np.array(samples)
        assert x == data.x[rows].tobytes() and y == data.y[rows].tobytes()


@pytest.mark.parametrize("taken", [0, 5, 15, 16, 20, 31, 32])
def test_resume_continues_the_uninterrupted_run_exactly(data, taken):
    # 1000 samples in batches of 64: 16 batches an epoch (the last of 40), two epochs, shuffled.
    config = data.config(epochs=2, batch_size=64)
    whole = take(flowfeed.Pipeline(config))
    assert len(whole) == 32
    check_bytes(data, whole)

    first = flowfeed.Pipeline(config)
    before = take(first, taken)
    state = round_trip(first.state_dict())
    assert state["cursor"]["epoch"] == taken // 16
    assert state["cursor"]["samples"] == (taken % 16) * 64
    first.close()

    resumed = flowfeed.Pipeline(config)
    if taken == len(whole):  # a finished run has nothing left to resume
        with pytest.raises(flowfeed.ConfigError, match="nothing of this run's 2 epochs is left"):
            resumed.load_state_dict(state)
        return
    resumed.load_state_dict(state)
    after = take(resumed)
    assert before + after == whole
    assert resumed.free_buffers == resumed.total_buffers


def test_batches_held_or_in_flight_come_again_released_ones_do_not(data):
    config = data.config(epochs=1, batch_size=64, depth=4)
    whole = [s for s, _, _ in take(flowfeed.Pipeline(config))]
    first = flowfeed.Pipeline(config)
    iterator = iter(first)
    for _ in range(6):
        with next(iterator):
            pass
    held = next(iterator)  # taken, not released: not done yet
    held_samples = tuple(held.samples)
    kept = np.asarray(held["x"])
    assert first.state_dict()["cursor"]["samples"] == 6 * 64
    held.release()  # the array still holds the batch
    assert first.state_dict()["cursor"]["samples"] == 6 * 64
    state = first.state_dict()
    del kept  # now it went back: done
    assert first.state_dict()["cursor"]["samples"] == 7 * 64

    resumed = flowfeed.Pipeline(config)
    resumed.load_state_dict(state)
    after = take(resumed)
    assert after[0][0] == held_samples
    assert whole[:6] + [s for s, _, _ in after] == whole
    check_bytes(data, after)


def samples_of(batches):
    return [s for s, _, _ in batches]


@pytest.mark.parametrize("steps", [10, 40, 70])
def test_two_ranks_resume_as_one_with_the_same_global_batch(data, steps):
    # World 2 x batch 8 resumes as world 1 x batch 16 (RESUME.md: the global batch stays): step k
    # of the new world takes the samples step k of the old one would have. 63 steps an epoch.
    one = data.config(epochs=2, batch_size=16)
    whole = take(flowfeed.Pipeline(one))
    assert len(whole) == 126
    taken, states = [], []
    for rank in (0, 1):
        pipeline = flowfeed.Pipeline(data.config(epochs=2, batch_size=8),
                                     overrides={"sampler.world": 2, "sampler.rank": rank})
        taken.append(take(pipeline, steps))
        states.append(round_trip(pipeline.state_dict()))
        pipeline.stop()  # its TBB worker is free for the next (PYTHON.md, "Several pipelines")
    for k in range(steps):  # each global step: the two ranks' batches together
        assert sorted(taken[0][k][0] + taken[1][k][0]) == sorted(whole[k][0])
        check_bytes(data, [taken[0][k], taken[1][k]])
    assert states[0]["cursor"] == dict(states[1]["cursor"], rank=0)  # ranks in step agree
    assert states[0]["cursor"]["world"] == 2 and states[0]["cursor"]["global_batch"] == 16

    resumed = flowfeed.Pipeline(one)
    resumed.load_state_dict(states[1])
    assert take(resumed) == whole[steps:]


def test_a_state_of_another_sample_order_is_refused_with_the_resume_message(data):
    first = flowfeed.Pipeline(data.config(epochs=2))
    take(first, 3)
    state = first.state_dict()
    other_seed = flowfeed.Pipeline(data.config(epochs=2), overrides={"sampler.seed": 4})
    with pytest.raises(flowfeed.ConfigError) as error:
        other_seed.load_state_dict(state)
    assert str(error.value) == (
        "state_dict: sampler.seed: the checkpoint was written with seed 3, this run has seed 4 "
        "(every epoch's order comes from the seed) set sampler.seed: 3")
    other_batch = flowfeed.Pipeline(data.config(epochs=2, batch_size=32))
    with pytest.raises(flowfeed.ConfigError) as error:
        other_batch.load_state_dict(state)
    assert str(error.value) == (
        "state_dict: cursor.global_batch: the checkpoint was written by world 1 x batch_size 64 = "
        "global batch 64, this run is world 1 x batch_size 32 = 32 (a resume keeps the global "
        "batch, so that every global step trains on the same samples) set pipeline.batch_size: 64")
    unshuffled = flowfeed.Pipeline(data.config(epochs=2, shuffle=False))
    with pytest.raises(flowfeed.ConfigError, match=r"^state_dict: sampler\.shuffle: the checkpoint "
                       r"was written with shuffle: true, this run has shuffle: false"):
        unshuffled.load_state_dict(state)
    # A refused state changes nothing: the pipeline still starts at the beginning.
    assert take(other_seed) == take(flowfeed.Pipeline(data.config(epochs=2),
                                                      overrides={"sampler.seed": 4}))


def mutated(state, path, value):
    state = copy.deepcopy(state)
    *parents, last = path.split(".")
    node = state
    for key in parents:
        node = node[key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return state


CORRUPT = "(the state is corrupt) load a state that Pipeline.state_dict() returned"
NOT_OURS = ("(the state is corrupt or not one that Pipeline.state_dict() returned) load a state "
            "it returned")


@pytest.mark.parametrize("path, value, message", [
    ("format", "flowfeed checkpoint", "format: expected 'flowfeed state', found 'flowfeed "
     "checkpoint' (not a flowfeed state) load a state that Pipeline.state_dict() returned"),
    ("version", 3, "version: 3 is newer than this build reads (version 2; written by a "
     "newer flowfeed) load it with the flowfeed that made it"),
    ("version", 0, "version: 0 is not a state version " + CORRUPT),
    ("cursor.epoch", KeyError, "cursor.epoch: missing (the state is incomplete or not one that "
     "Pipeline.state_dict() returned) load a state it returned"),
    ("cursor.epoch", "1", "cursor.epoch: expected a non-negative integer, found '1' (str) " +
     NOT_OURS),
    ("cursor.epoch", 2**32, "cursor.epoch: 4294967296 is out of range (0 to 4294967295; the state "
     "is corrupt) load a state that Pipeline.state_dict() returned"),
    ("cursor.epoch", 3, "cursor.epoch: the checkpoint is at epoch 3, sample 192 of its order: "
     "nothing of this run's 2 epochs is left after it (allowed: an epoch below pipeline.epochs "
     "with a batch of this rank left in it) raise pipeline.epochs to train further, or start "
     "without pipeline.resume_from"),
    ("cursor.samples", -64, "cursor.samples: -64 is out of range (0 to 18446744073709551615)"),
    ("cursor.samples", 100, "cursor.samples: 100 is not a whole number of global batches of 64 "
     "inside the data set of 1000 samples " + CORRUPT),
    ("cursor.samples", 1024, "cursor.samples: 1024 is not a whole number of global batches of 64 "
     "inside the data set of 1000 samples " + CORRUPT),
    ("cursor.samples", 2.0, "cursor.samples: expected a non-negative integer, found 2.0 (float) " +
     NOT_OURS),
    ("cursor.world", 0, "cursor.world: 0 is out of range (1 to 16777216)"),
    ("cursor.rank", 1, "cursor.rank: 1 is not below cursor.world 1"),
    ("cursor.batch_size", 0, "cursor.batch_size: 0 is out of range (at least 1)"),
    ("cursor.global_batch", 128, "cursor.global_batch: 128 is not cursor.world 1 x "
     "cursor.batch_size 64 " + CORRUPT),
    ("cursor.finished_ahead", [3, 2], "cursor.finished_ahead: [3, 2] is not a list of ascending "
     "positive integers " + CORRUPT),
    ("cursor.finished_ahead", (1,), "cursor.finished_ahead: expected a list of non-negative "
     "integers, found "
     "(1,) (tuple) " + NOT_OURS),
    ("cursor.finished_ahead", [1, 10**6], "cursor.finished_ahead: 1000000 is past the end of the "
     "run: 28 batches of this rank follow the cursor's in 2 epochs (allowed: ascending offsets 1 to "
     "28; the checkpoint is corrupt or from a longer run) resume from a complete checkpoint of this "
     "run"),
    ("sampler.shuffle", 1, "sampler.shuffle: expected True or False, found 1 (int) " + NOT_OURS),
    ("sampler.seed", True, "sampler.seed: expected a non-negative integer, found True (bool) " +
     NOT_OURS),
    ("sampler.dataset_size", 999, "sampler.dataset_size: the checkpoint was written for 999 "
     "samples, this run's data set has 1000 (a resume continues the same sample order) resume "
     "with the same data set"),
    ("nodes", {"train": {"type": "mlp", "state": b"\0"}}, "nodes.train: this pipeline has no "
     "node 'train' that keeps state (the state is from another pipeline) resume from a state of "
     "this pipeline"),
    ("nodes", {"train": {"type": "mlp", "state": "text"}}, "nodes.train.state: expected bytes, "
     "found 'text' (str) " + NOT_OURS),
    ("nodes", [], "nodes: expected a dict, found [] (list) " + NOT_OURS),
])
def test_every_field_of_a_state_is_checked(data, path, value, message):
    pipeline = flowfeed.Pipeline(data.config(epochs=2))
    take(pipeline, 3)
    state = mutated(pipeline.state_dict(), path, value)
    pipeline.stop()
    with pytest.raises(flowfeed.ConfigError) as error:
        pipeline.load_state_dict(state)
    assert str(error.value) == "state_dict: " + message
    assert take(pipeline)[0] == take(flowfeed.Pipeline(data.config(epochs=2)), 1)[0]


def test_an_overflowing_global_batch_is_refused(data):
    # 2^63 x 2 wraps to 0 in 64 bits: the product is checked, not wrapped.
    pipeline = flowfeed.Pipeline(data.config())
    state = pipeline.state_dict()
    state["cursor"].update(world=2, batch_size=2**63, global_batch=0, samples=0)
    with pytest.raises(flowfeed.ConfigError) as error:
        pipeline.load_state_dict(state)
    assert str(error.value) == ("state_dict: cursor.batch_size: 9223372036854775808 x "
                                "cursor.world 2 overflows 64 bits (allowed: a batch_size whose "
                                "product with cursor.world is below 2^64; the state is corrupt) "
                                "load a state that Pipeline.state_dict() returned")


def test_a_state_that_is_not_a_dict_is_refused(data):
    pipeline = flowfeed.Pipeline(data.config())
    with pytest.raises(flowfeed.ConfigError) as error:
        pipeline.load_state_dict([("format", "flowfeed state")])
    assert str(error.value) == ("state_dict: state: expected the dict Pipeline.state_dict() "
                                "returned, found list")


def test_a_state_is_loaded_between_runs_only(data):
    pipeline = flowfeed.Pipeline(data.config(epochs=1))
    start = pipeline.state_dict()
    assert start["cursor"]["samples"] == 0 and start["nodes"] == {}
    take(pipeline, 2)
    with pytest.raises(RuntimeError, match=r"^load_state_dict: a run is going \(call it before "
                       r"the first batch, after the run ended, or after stop\(\)\)$"):
        pipeline.load_state_dict(start)
    mid = pipeline.state_dict()
    rest = take(pipeline)  # the run ends
    assert pipeline.state_dict()["cursor"]["epoch"] == 1  # past the last epoch: nothing left
    pipeline.load_state_dict(mid)
    assert take(pipeline) == rest
    assert take(pipeline) == rest  # like pipeline.resume_from: every later run starts there
    pipeline.close()
    with pytest.raises(ValueError, match="the pipeline was closed"):
        pipeline.state_dict()


def test_a_state_of_order_shards_carries_the_order_and_resumes_it(data):
    # One npy file is one shard: order: shards shuffles its samples in one window.
    shards = {"sampler.order": "shards", "sampler.shuffle_window": 2}
    config = data.config(epochs=2, batch_size=64)
    whole = take(flowfeed.Pipeline(config, overrides=shards))
    first = flowfeed.Pipeline(config, overrides=shards)
    before = take(first, 5)
    state = round_trip(first.state_dict())
    assert state["version"] == 2
    assert (state["sampler"]["order"], state["sampler"]["shuffle_window"],
            state["sampler"]["data_shards"]) == ("shards", 2, 1)
    first.close()
    resumed = flowfeed.Pipeline(config, overrides=shards)
    resumed.load_state_dict(state)
    assert before + take(resumed) == whole
    samples = flowfeed.Pipeline(config)
    with pytest.raises(flowfeed.ConfigError) as error:
        samples.load_state_dict(state)
    assert str(error.value) == (
        "state_dict: sampler.order: the checkpoint was written with order: shards, this run has "
        "order: samples (a resume continues the same sample order) set sampler.order: shards")
    # A state of order: samples is version 1, without the order's fields, as before.
    plain = samples.state_dict()
    assert plain["version"] == 1 and "order" not in plain["sampler"]
