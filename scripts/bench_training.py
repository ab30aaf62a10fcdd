#!/usr/bin/env python3
"""The Fashion-MNIST MLP of examples/python in one process, fed by flowfeed (Pipeline.views) and by
tensors resident on the GPU, in rounds that begin and end with a resident run (the flowfeed runs
in between, in reverse order every other round), each run a fresh model: steps/s after the first
epoch, each flowfeed run's ratio to the resident runs of its round, and the test accuracy of every
run.

    PYTHONPATH=build/python python3 scripts/bench_training.py [--rounds 2] [--epochs 10]
        [--threads config,2] [--data DIR]

--threads: the flowfeed runs of a round, by pipeline.threads ("config": as configured). Without a
GPU (or with --device cpu) both feeds train on the host: a smoke run, not a measurement.

PyTorch's eager step moves by tens of percent from one process to the next on the same machine, so
the two feeds are compared in the same process, one run after the other."""
import os
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
import common  # noqa: E402
import flowfeed  # noqa: E402


def run_flowfeed(args, threads):
    images, labels = common.files(args.data, "train")
    cuda = args.device.startswith("cuda")
    overrides = {"pipeline.epochs": args.epochs, "pipeline.batch_size": args.batch_size,
                 "pipeline.device": "cuda" if cuda else "host",
                 "nodes.load.params.images": images, "nodes.load.params.labels": labels}
    if threads != "config":
        overrides["pipeline.threads"] = int(threads)
    pipeline = flowfeed.Pipeline(os.path.join(ROOT, "configs", "fashion_mnist_pull.yaml"),
                                 overrides=overrides)
    model, optimizer = common.model_and_optimizer(args.device)
    timer = common.Timer(args.device)
    views = pipeline.views(["x", "y"], torch.from_dlpack,
                           stream=torch.cuda.current_stream() if cuda else None)
    for _ in range(args.epochs):
        timer.start_epoch()
        steps = 0
        for x, y in views:
            common.step(model, optimizer, x, y)
            steps += 1
        timer.end_epoch(steps)
    pipeline.close()
    return timer, common.accuracy(model, args.data, args.device)


def run_resident(args):
    x, y = (torch.from_numpy(a).to(args.device)
            for a in common.read_idx(*common.files(args.data, "train")))
    generator = torch.Generator().manual_seed(42)
    model, optimizer = common.model_and_optimizer(args.device)
    timer = common.Timer(args.device)
    for _ in range(args.epochs):
        order = torch.randperm(len(y), generator=generator).to(args.device)
        timer.start_epoch()
        steps = 0
        for rows in order.split(args.batch_size):
            common.step(model, optimizer, x[rows], y[rows])
            steps += 1
        timer.end_epoch(steps)
    return timer, common.accuracy(model, args.data, args.device)


def steady(timer):
    return sum(timer.epoch_steps[1:]) / sum(timer.epoch_times[1:])


def main():
    def options(parser):
        parser.add_argument("--rounds", type=int, default=2)
        parser.add_argument("--threads", default="config")
    args = common.arguments(__doc__.splitlines()[0], options)
    if args.epochs < 2:
        sys.exit("--epochs must be at least 2 (the first epoch is not timed)")
    variants = args.threads.split(",")
    ratios = {v: [] for v in variants}
    for r in range(args.rounds):
        middle = variants if r % 2 == 0 else variants[::-1]
        resident, flowfed = [], {}
        for feed in ["resident"] + middle + ["resident"]:
            if feed == "resident":
                timer, acc = run_resident(args)
                resident.append(steady(timer))
                label = "resident"
            else:
                timer, acc = run_flowfeed(args, feed)
                flowfed[feed] = steady(timer)
                label = f"flowfeed (pipeline.threads: {feed})"
            print(f"round {r}: {label:34s} {steady(timer):8,.0f} steps/s after the first epoch, "
                  f"test accuracy {100 * acc:.2f}%", flush=True)
        for feed, rate in flowfed.items():
            ratios[feed].append(rate / statistics.mean(resident))
    for feed, rs in ratios.items():
        print(f"flowfeed (pipeline.threads: {feed}) / resident of the same round: " +
              ", ".join(f"{r:.3f}" for r in rs) + f"; median {statistics.median(rs):.3f}")


if __name__ == "__main__":
    main()
