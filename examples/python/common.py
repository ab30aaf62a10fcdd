"""What train_mlp.py and peer_dataloader.py share: the model, the optimizer, the data files and the
test-set evaluation, so that the two differ only in how batches reach the model."""
import argparse
import gzip
import os
import time

import numpy as np
import torch

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"


def arguments(description, extra=None):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", default=os.environ.get("FLOWFEED_FASHION_MNIST_DIR", DEFAULT_DIR),
                        help="folder of the Fashion-MNIST .gz files (env FLOWFEED_FASHION_MNIST_DIR)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    if extra:
        extra(parser)
    return parser.parse_args()


def files(folder, split):
    prefix = "train" if split == "train" else "t10k"
    return (os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"),
            os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"))


def read_idx(images, labels):
    """The IDX files as float32 [n, 784] (pixel / 255, as flowfeed's idx loader) and int64 [n]."""
    with gzip.open(images, "rb") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float32) / 255
    with gzip.open(labels, "rb") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    return x, y


def model_and_optimizer(device):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, optimizer


def step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x.reshape(x.shape[0], -1)), y.long())
    loss.backward()
    optimizer.step()
    return loss


@torch.no_grad()
def accuracy(model, folder, device):
    x, y = read_idx(*files(folder, "test"))
    logits = model(torch.from_numpy(x).to(device))
    return (logits.argmax(1).cpu() == torch.from_numpy(y)).float().mean().item()


class Timer:
    """Steps per second over all epochs and over the epochs after the first (steady)."""

    def __init__(self, device):
        self.device = device
        self.epoch_times = []
        self.epoch_steps = []

    def sync(self):
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def start_epoch(self):
        self.sync()
        self.t0 = time.perf_counter()

    def end_epoch(self, steps):
        self.sync()
        self.epoch_times.append(time.perf_counter() - self.t0)
        self.epoch_steps.append(steps)

    def summary(self):
        total = sum(self.epoch_steps) / sum(self.epoch_times)
        later = self.epoch_steps[1:] or self.epoch_steps
        steady = sum(later) / sum(self.epoch_times[1:] or self.epoch_times)
        return f"{total:,.0f} steps/s overall, {steady:,.0f} steps/s after the first epoch"
