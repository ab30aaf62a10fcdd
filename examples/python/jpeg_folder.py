#!/usr/bin/env python3
"""A data set written in Python -- a folder of JPEGs (root/<class>/<file>.jpg), decoded by PIL and
augmented by torchvision (RandomResizedCrop(224) and a horizontal flip) -- feeding a small PyTorch
model through flowfeed, and the same class through torch.utils.data.DataLoader, side by side.

    python3 examples/python/jpeg_folder.py --root DIR [--loader both|flowfeed|dataloader]
        [--workers 8] [--batch-size 256] [--epochs 1] [--device cuda|cpu]
    python3 examples/python/jpeg_folder.py --make-demo DIR   # writes a small folder to try it on

JpegFolder is an ordinary map-style Dataset (__len__, __getitem__ -> {"x": uint8 [224, 224, 3],
"y": int64 label}). flowfeed runs its __getitem__ on the pipeline's threads (`concurrency` bodies
at once: PIL's decode and resize release the GIL, so they run in parallel) and writes each sample
straight into a pinned batch buffer, which it uploads and hands to the loop through
Pipeline.views. DataLoader runs it in `--workers` processes and collates. Each loader prints its
images per second and the labels it delivered per epoch (every image once per epoch)."""
import argparse
import os
import time

import numpy as np
import torch
from PIL import Image

try:  # torchvision >= 0.15
    from torchvision.transforms import v2 as transforms
    TRANSFORMS = "torchvision.transforms.v2"
except ImportError:  # Debian 12's torchvision 0.14: the same transforms in v1, on PIL images
    from torchvision import transforms
    TRANSFORMS = "torchvision.transforms"

EXTENSIONS = (".jpg", ".jpeg", ".JPG", ".JPEG")


class JpegFolder(torch.utils.data.Dataset):
    """root/<class>/<file>.jpg; classes in sorted order are labels 0, 1, ..."""

    def __init__(self, root, size=224):
        self.classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
        self.files = [(os.path.join(root, c, f), label)
                      for label, c in enumerate(self.classes)
                      for f in sorted(os.listdir(os.path.join(root, c))) if f.endswith(EXTENSIONS)]
        if not self.files:
            raise ValueError(f"{root}: no <class>/<file>.jpg in it")
        # The random state is torch's global generator (thread-safe), as in DataLoader's main
        # process; augmentations are random, so neither loader repeats them run to run.
        self.augment = transforms.Compose([
            transforms.RandomResizedCrop(size, antialias=True) if TRANSFORMS.endswith("v2")
            else transforms.RandomResizedCrop(size),
            transforms.RandomHorizontalFlip()])

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        path, label = self.files[index]
        with Image.open(path) as image:
            image = self.augment(image.convert("RGB"))
        return {"x": np.array(image, dtype=np.uint8),  # [224, 224, 3], HWC, writable
                "y": np.array(label, dtype=np.int64)}


def make_demo(root, classes=3, per_class=16, seed=0):
    """A small folder of real JPEGs (noise over a gradient per class), 96-320 px a side."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class{c}"), exist_ok=True)
        for i in range(per_class):
            h, w = (int(v) for v in rng.integers(96, 321, size=2))
            base = np.linspace(0, 255, w, dtype=np.float32)[None, :, None] * (c + 1) / classes
            pixels = np.clip(base + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels, "RGB").save(os.path.join(root, f"class{c}", f"{i:04d}.jpg"),
                                                quality=90)
    return root


class Model(torch.nn.Module):
    """A deliberately small CNN: the point is the input path, not the model."""

    def __init__(self, classes):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 5, stride=4), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.head = torch.nn.Linear(32, classes)
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255)

    def forward(self, x):  # x: uint8 [n, 224, 224, 3] on the model's device
        x = (x.permute(0, 3, 1, 2).float() - self.mean) / self.std
        return self.head(self.features(x))


def train_epoch(model, optimizer, batches, classes, device):
    """One epoch over (x, y) batches already on `device`; returns (images, mean loss, images per
    label). Nothing waits for the device inside the loop."""
    loss_sum = torch.zeros((), device=device)
    per_label = torch.zeros(classes, dtype=torch.int64, device=device)
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach() * y.shape[0]
        per_label += torch.bincount(y, minlength=classes)
    images = int(per_label.sum())
    return images, loss_sum.item() / max(images, 1), per_label.tolist()


def flowfeed_epochs(dataset, args):
    """The data set through flowfeed: its __getitem__ on `workers` pipeline threads (at least
    one: the pipeline's threads are not the caller's)."""
    import flowfeed

    cuda = args.device.startswith("cuda")
    pipeline = flowfeed.Pipeline({
        "pipeline": {"batch_size": args.batch_size, "epochs": args.epochs,
                     "prefetch_depth": 8, "device": "cuda" if cuda else "host"},
        "sampler": {"shuffle": True, "seed": 0},
        "nodes": [
            {"name": "load", "type": "python", "concurrency": max(1, args.workers),
             "params": {"callable": dataset, "batched": False,
                        "layout": {"x": {"dtype": "uint8", "shape": [224, 224, 3]},
                                   "y": {"dtype": "int64", "shape": []}}}},
            {"name": "stage", "type": "pinned_staging"},
            {"name": "upload", "type": "cuda_upload"}]})
    # One torch tensor per pool buffer, handed back whenever that buffer holds the batch; the
    # current stream waits for each batch's upload. A view is valid for one step.
    views = pipeline.views(["x", "y"], torch.from_dlpack,
                           stream=torch.cuda.current_stream() if cuda else None)
    for _ in range(args.epochs):
        yield views  # each iteration of views is the next epoch


def dataloader_epochs(dataset, args):
    """The same data set through DataLoader: `workers` processes, pinned batches, copied over."""
    cuda = args.device.startswith("cuda")
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
        pin_memory=cuda, persistent_workers=args.workers > 0,
        generator=torch.Generator().manual_seed(0))
    for _ in range(args.epochs):
        yield ((b["x"].to(args.device, non_blocking=True), b["y"].to(args.device, non_blocking=True))
               for b in loader)


def run(name, epochs, dataset, args):
    torch.manual_seed(1)
    model = Model(len(dataset.classes)).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for epoch, batches in enumerate(epochs(dataset, args)):
        t0 = time.perf_counter()
        images, loss, labels = train_epoch(model, optimizer, batches, len(dataset.classes),
                                           args.device)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        print(f"{name} epoch {epoch}: {images} images, "
              f"{images / seconds:,.1f} images/s, mean loss {loss:.4f}, "
              f"images per label {labels}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="folder of <class>/<file>.jpg")
    parser.add_argument("--make-demo", metavar="DIR", help="write a small JPEG folder and exit")
    parser.add_argument("--loader", choices=["both", "flowfeed", "dataloader"], default="both")
    parser.add_argument("--workers", type=int, default=8,
                        help="flowfeed: the loader's concurrency (0 counts as 1); DataLoader: num_workers")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.make_demo:
        print(f"wrote {make_demo(args.make_demo)}")
        return
    if not args.root:
        parser.error("--root is needed (or --make-demo DIR to write a folder to try)")
    dataset = JpegFolder(args.root)
    print(f"{len(dataset)} images, {len(dataset.classes)} classes, {TRANSFORMS}, {args.device}")
    if args.loader in ("both", "flowfeed"):
        run(f"flowfeed (concurrency {max(1, args.workers)})", flowfeed_epochs, dataset, args)
    if args.loader in ("both", "dataloader"):
        run(f"DataLoader ({args.workers} workers)", dataloader_epochs, dataset, args)


if __name__ == "__main__":
    main()
