#!/usr/bin/env python3
"""Trains the Fashion-MNIST MLP (784-256-10, batch 64, SGD lr 0.01 momentum 0.9) in PyTorch, fed
by flowfeed: the pipeline loads, stages and uploads; each batch reaches the model through DLPack
without a copy (Pipeline.views: one torch tensor per pool buffer), on the model's stream.

    PYTHONPATH=build/python python3 examples/python/train_mlp.py [--epochs 10] [--data DIR]

Prints the loss per epoch, steps/s and the test accuracy. peer_dataloader.py is the same script
fed by torch.utils.data.DataLoader (or by tensors resident on the GPU)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import flowfeed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    args = common.arguments(__doc__.splitlines()[0])
    images, labels = common.files(args.data, "train")
    pipeline = flowfeed.Pipeline(
        os.path.join(ROOT, "configs", "fashion_mnist_pull.yaml"),
        overrides={"pipeline.epochs": args.epochs, "pipeline.batch_size": args.batch_size,
                   "pipeline.device": "cuda" if args.device.startswith("cuda") else "host",
                   "nodes.load.params.images": images, "nodes.load.params.labels": labels})
    model, optimizer = common.model_and_optimizer(args.device)
    timer = common.Timer(args.device)
    stream = torch.cuda.current_stream() if args.device.startswith("cuda") else None
    # x and y are imported into torch once per pool buffer and come back whenever that buffer
    # holds the batch; the current stream waits on each batch's upload, and a batch goes back to
    # the pipeline when the next one is taken (after the step's work queued on the stream).
    views = pipeline.views(["x", "y"], torch.from_dlpack, stream=stream)
    for epoch in range(args.epochs):
        timer.start_epoch()
        steps, loss_sum = 0, torch.zeros((), device=args.device)
        for x, y in views:  # the next epoch
            loss_sum += common.step(model, optimizer, x, y).detach()
            steps += 1
        timer.end_epoch(steps)
        print(f"epoch {epoch}: mean loss {loss_sum.item() / steps:.4f} over {steps} steps",
              flush=True)
    report = pipeline.report()
    print(f"flowfeed: {timer.summary()}; the loop waited for data "
          f"{100 * report['train']['stall_fraction']:.1f}% of the time")
    print(f"test accuracy {100 * common.accuracy(model, args.data, args.device):.2f}%")


if __name__ == "__main__":
    main()
