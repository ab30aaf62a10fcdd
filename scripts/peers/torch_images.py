#!/usr/bin/env python3
"""The PyTorch peer of `pipeline_bench images`: images/s delivered to the GPU by a torch Dataset
over the same WebDataset shards (scripts/make_image_shards.py), the way a vision training script
usually feeds a GPU: decode in DataLoader workers (PIL, or torchvision.io.decode_jpeg),
transforms.v2 RandomResizedCrop(224) + RandomHorizontalFlip + ToDtype(float32, scale=True) +
Normalize(ImageNet), DataLoader(num_workers, pin_memory=True, batch_size=256), then
`.to(device, non_blocking=True)`. Prints one JSON row.

    scripts/peers/torch_images.py --shards /tmp/shards --decoder pil --workers 16

Needs torch and torchvision (transforms.v2: torchvision >= 0.16); runs on the CPU without a GPU
(--device cpu, e.g. as a smoke test).
"""

import argparse
import glob
import io
import json
import os
import sys
import tarfile
import time

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def index_shards(paths):
    """(path, offset, size, label) per sample: the tar headers only, read once."""
    samples = []
    for path in paths:
        jpgs, labels = {}, {}
        with tarfile.open(path, "r:") as tar:
            for m in tar:
                if not m.isfile():
                    continue
                key, _, ext = m.name.rpartition(".")
                if ext in ("jpg", "jpeg"):
                    jpgs[key] = (m.offset_data, m.size)
                elif ext == "cls":
                    labels[key] = int(tar.extractfile(m).read())
        for key, (offset, size) in jpgs.items():
            if key not in labels:
                raise ValueError(f"{path}: sample {key} has no .cls label")
            samples.append((path, offset, size, labels[key]))
    return samples


class ShardDataset:
    """A map-style torch Dataset: sample i's JPEG is read at its offset and decoded here."""

    def __init__(self, samples, decoder, transform):
        self.samples = samples
        self.decoder = decoder
        self.transform = transform
        self.files = {}  # per worker process: one open file per shard

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        import torch
        path, offset, size, label = self.samples[i]
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = open(path, "rb")
        f.seek(offset)
        data = f.read(size)
        if self.decoder == "pil":
            from PIL import Image
            image = Image.open(io.BytesIO(data)).convert("RGB")
        else:
            import torchvision.io
            image = torchvision.io.decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                                               mode=torchvision.io.ImageReadMode.RGB)
        return self.transform(image), label


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", required=True, help="a directory of .tar shards, or a glob")
    p.add_argument("--decoder", choices=["pil", "torchvision"], default="pil")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="DataLoader num_workers")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--limit", type=int, default=0, help="use the first N samples (0: all)")
    p.add_argument("--warmup", type=int, default=2,
                   help="batches not timed (worker start-up); the rate is over the rest")
    p.add_argument("--device", default="auto", help="cuda, cuda:N, cpu or auto")
    args = p.parse_args()

    try:
        import torch
        import torchvision
        from torchvision.transforms import v2
    except ImportError as e:
        print(f"torch_images: needs torch and torchvision with transforms.v2 ({e})",
              file=sys.stderr)
        return 77

    paths = sorted(glob.glob(os.path.join(args.shards, "*.tar"))
                   if os.path.isdir(args.shards) else glob.glob(args.shards))
    if not paths:
        print(f"torch_images: no .tar shards at {args.shards}", file=sys.stderr)
        return 2
    samples = index_shards(paths)
    if args.limit:
        samples = samples[:args.limit]
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    transform = v2.Compose([
        v2.ToImage(),
        v2.RandomResizedCrop(224, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(MEAN, STD),
    ])
    dataset = ShardDataset(samples, args.decoder, transform)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
        pin_memory=device.startswith("cuda"), drop_last=False,
        persistent_workers=args.workers > 0)

    images = 0
    batches = 0
    last = None
    start = time.perf_counter() if args.warmup == 0 else None
    for _ in range(args.epochs):
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            batches += 1
            if batches == args.warmup:
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                start = time.perf_counter()
            elif batches > args.warmup:
                images += x.shape[0]
            last = x
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    end = time.perf_counter()
    checksum = float(last[0].float().mean()) if last is not None else 0.0
    seconds = end - start if start is not None else 0.0
    rate = images / seconds if seconds > 0 else 0.0
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"
    row = {
        "name": f"images.torch.{args.decoder}",
        "figure": round(rate, 1),
        "unit": "images/s",
        "details": {
            "decoder": args.decoder, "workers": args.workers, "batch_size": args.batch_size,
            "samples": len(samples), "epochs": args.epochs, "batches": batches,
            "timed_images": images, "seconds": round(seconds, 3), "device": f"{device} ({name})",
            "torch": torch.__version__, "torchvision": torchvision.__version__,
            "x_dtype": str(last.dtype) if last is not None else None,
            "x_shape": list(last.shape) if last is not None else None,
            "first_image_mean": round(checksum, 4),
        },
    }
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
