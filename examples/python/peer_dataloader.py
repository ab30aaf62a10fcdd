#!/usr/bin/env python3
"""The peer of train_mlp.py: the same Fashion-MNIST MLP and optimizer, fed by PyTorch alone.

    python3 examples/python/peer_dataloader.py --mode dataloader [--workers 0] [--data DIR]
    python3 examples/python/peer_dataloader.py --mode resident

dataloader: torch.utils.data.DataLoader with the settings that measured best for small batches:
  the whole set in memory as one tensor, a BatchSampler so that each batch is one indexing call
  (batch_size=None: no per-sample collate), pin_memory=True and non_blocking copies to the GPU,
  no worker processes by default (workers pay a pickle per batch; --workers N to try them).
resident: the whole training set on the GPU, a permutation per epoch, each batch an index_select
  there (no loader at all: the ceiling flowfeed is measured against).

Prints the loss per epoch, steps/s and the test accuracy."""
import os
import sys

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class Batches(Dataset):
    """Indexed by a list of sample indices (from a BatchSampler): returns the whole batch."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, rows):
        rows = torch.as_tensor(rows)
        return self.x[rows], self.y[rows]


def options(parser):
    parser.add_argument("--mode", choices=["dataloader", "resident"], default="dataloader")
    parser.add_argument("--workers", type=int, default=0)


def batches_dataloader(args, x, y, generator):
    sampler = BatchSampler(RandomSampler(range(len(y)), generator=generator), args.batch_size,
                           drop_last=False)
    loader = DataLoader(Batches(x, y), sampler=sampler, batch_size=None, num_workers=args.workers,
                        pin_memory=args.device.startswith("cuda"),
                        persistent_workers=args.workers > 0)
    while True:
        yield ((bx.to(args.device, non_blocking=True), by.to(args.device, non_blocking=True))
               for bx, by in loader)


def batches_resident(args, x, y, generator):
    x, y = x.to(args.device), y.to(args.device)
    while True:
        order = torch.randperm(len(y), generator=generator).to(args.device)
        yield ((x[rows], y[rows]) for rows in order.split(args.batch_size))


def main():
    args = common.arguments(__doc__.splitlines()[0], options)
    x, y = (torch.from_numpy(a) for a in common.read_idx(*common.files(args.data, "train")))
    generator = torch.Generator().manual_seed(42)
    feed = (batches_dataloader if args.mode == "dataloader" else batches_resident)(
        args, x, y, generator)
    model, optimizer = common.model_and_optimizer(args.device)
    timer = common.Timer(args.device)
    for epoch in range(args.epochs):
        timer.start_epoch()
        steps, loss_sum = 0, torch.zeros((), device=args.device)
        for bx, by in next(feed):
            loss_sum += common.step(model, optimizer, bx, by).detach()
            steps += 1
        timer.end_epoch(steps)
        print(f"epoch {epoch}: mean loss {loss_sum.item() / steps:.4f} over {steps} steps",
              flush=True)
    label = args.mode + (f" ({args.workers} workers)" if args.mode == "dataloader" else "")
    print(f"{label}: {timer.summary()}")
    print(f"test accuracy {100 * common.accuracy(model, args.data, args.device):.2f}%")


if __name__ == "__main__":
    main()
