#!/usr/bin/env python3
"""The Fashion-MNIST MLP of examples/python trained twice in one process, fed by flowfeed
(Pipeline.views on the current stream) and by tensors resident on the GPU, epoch by epoch in turn
(resident first on even epochs, flowfeed first on odd ones), each with a model of its own: steps/s
of each feed after the first epoch, the ratio for every epoch, their median, and the test accuracy
of both models.

    PYTHONPATH=build/python python3 scripts/bench_training.py [--epochs 10] [--repeat 1]
        [--threads N] [--data DIR] [--record FILE]

PyTorch's eager step moves by tens of percent from one process to the next on the same machine,
and by several percent from one second to the next within one, so the two feeds take turns an
epoch at a time. --threads sets pipeline.threads. Without a GPU (or with --device cpu) both feeds
train on the host: a smoke run, not a measurement. --record FILE makes the last run the
python_training_views record of a results file (docs/results/records.json: scripts/records.py),
every run of the process under its `runs`, keeping the other records."""
import os
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
import common  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import records  # noqa: E402
import flowfeed  # noqa: E402
import peer_dataloader  # noqa: E402


class Feed:
    """One model and its optimizer, trained one epoch per call, timed by common.Timer."""

    def __init__(self, args):
        self.args = args
        self.model, self.optimizer = common.model_and_optimizer(args.device)
        self.timer = common.Timer(args.device)

    def epoch(self):
        self.timer.start_epoch()
        steps = 0
        for x, y in self.batches():
            common.step(self.model, self.optimizer, x, y)
            steps += 1
        self.timer.end_epoch(steps)

    def rate(self, epoch):
        return self.timer.epoch_steps[epoch] / self.timer.epoch_times[epoch]

    def steady(self):
        return sum(self.timer.epoch_steps[1:]) / sum(self.timer.epoch_times[1:])

    def accuracy(self):
        return common.accuracy(self.model, self.args.data, self.args.device)


class Resident(Feed):
    """peer_dataloader.py --mode resident: the set on the GPU, a permutation per epoch."""
    name = "resident"

    def __init__(self, args):
        super().__init__(args)
        x, y = (torch.from_numpy(a) for a in common.read_idx(*common.files(args.data, "train")))
        self.epochs = peer_dataloader.batches_resident(args, x, y,
                                                       torch.Generator().manual_seed(42))

    def batches(self):
        return next(self.epochs)


class Flowfeed(Feed):
    name = "flowfeed"

    def __init__(self, args):
        super().__init__(args)
        images, labels = common.files(args.data, "train")
        cuda = args.device.startswith("cuda")
        overrides = {"pipeline.epochs": args.epochs, "pipeline.batch_size": args.batch_size,
                     "pipeline.device": "cuda" if cuda else "host",
                     "nodes.load.params.images": images, "nodes.load.params.labels": labels}
        if args.threads:
            overrides["pipeline.threads"] = args.threads
        self.pipeline = flowfeed.Pipeline(os.path.join(ROOT, "configs", "fashion_mnist_pull.yaml"),
                                          overrides=overrides)
        self.views = self.pipeline.views(["x", "y"], torch.from_dlpack,
                                         stream=torch.cuda.current_stream() if cuda else None)

    def batches(self):
        return self.views  # iterating it gives the next epoch


def main():
    def options(parser):
        parser.add_argument("--repeat", type=int, default=1)
        parser.add_argument("--threads", type=int, default=0)
        parser.add_argument("--record", help="make the result the python_training_views record "
                            "in this results file, keeping the others")
        parser.add_argument("--build", help="the build a --record names (default: the commit)")
        parser.add_argument("--machine", help="the machine a --record names (default: described)")
    args = common.arguments(__doc__.splitlines()[0], options)
    if args.record and not args.device.startswith("cuda"):
        sys.exit("--record needs a GPU run: on the host both feeds train on the CPU, a smoke run, "
                 "not a measurement")
    if args.epochs < 2:
        sys.exit("--epochs must be at least 2 (the first epoch is not timed)")
    medians = []
    runs = []
    for r in range(args.repeat):
        resident, fed = Resident(args), Flowfeed(args)
        for e in range(args.epochs):
            for feed in ((resident, fed) if e % 2 == 0 else (fed, resident)):
                feed.epoch()
        fed.pipeline.close()
        ratios = [fed.rate(e) / resident.rate(e) for e in range(1, args.epochs)]
        medians.append(statistics.median(ratios))
        runs.append({"run": r + 1, "build": args.build or records.build_id(),
                     "figure": fed.steady(), "baseline": resident.steady(),
                     "ratio": fed.steady() / resident.steady(), "median_by_epoch": medians[-1],
                     "test_accuracy": fed.accuracy(), "resident_test_accuracy": resident.accuracy()})
        print(f"run {r}: flowfeed {fed.steady():,.0f} steps/s, resident {resident.steady():,.0f} "
              f"steps/s after the first epoch: {fed.steady() / resident.steady():.3f}; by epoch " +
              ", ".join(f"{q:.3f}" for q in ratios) + f" (median {medians[-1]:.3f}); "
              f"test accuracy flowfeed {100 * fed.accuracy():.2f}%, "
              f"resident {100 * resident.accuracy():.2f}%", flush=True)
    if args.repeat > 1:
        print("median ratio by run: " + ", ".join(f"{m:.3f}" for m in medians))
    if args.record:
        last = runs[-1]
        machine = args.machine or records.machine(
            torch.cuda.get_device_name() if args.device.startswith("cuda") else None)
        extra = {"runs": runs, "runs_over": f"{len(runs)} runs in one process"} if len(runs) > 1 else {}
        record = records.make(
            last["figure"], "steps/s", last["baseline"],
            " ".join(["python3"] + [records.shell_word(a) for a in sys.argv]),
            {"value": 0.97, "of": "ratio", "bound": "at_least", "met": last["ratio"] >= 0.97},
            args.build, machine,
            note="the MLP of examples/python fed by Pipeline.views, against the same data resident "
                 "on the GPU, epoch by epoch in turn",
            details={"test_accuracy": round(last["test_accuracy"], 4),
                     "resident_test_accuracy": round(last["resident_test_accuracy"], 4)},
            **extra)
        records.write_record(args.record, "python_training_views", record)
        print(f"record: python_training_views in {args.record}")


if __name__ == "__main__":
    main()
