#!/usr/bin/env python3
"""Writes a JPEG benchmark set as WebDataset tar shards, from the sample photographs that ship
with scikit-image (Debian: python3-skimage, python3-pil, python3-numpy).

Every image is a random crop of one of a handful of photographs (astronaut, chelsea, coffee,
rocket, ...), scaled so that its longest side is between --min-side and --max-side pixels
(ImageNet-like), maybe flipped, with a per-channel colour shift, encoded by Pillow at --quality.
Its label (`key.cls`, decimal text) is the index of the photograph it came from (in PHOTOS,
leaving out any this scikit-image does not have on disk; the summary lists those used). The set
is a function of --seed, the options and the photographs: the same arguments write the same
bytes, whatever --workers says. It is derived from a few photographs, so it has their statistics, not ImageNet's.

    scripts/make_image_shards.py --out /tmp/shards --count 20000 --workers 16
"""

import argparse
import io
import json
import os
import sys
import tarfile
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image
import skimage.data

# Colour photographs first; grayscale ones become three equal channels.
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry",
          "retina", "camera", "coins")


_photos = {}


def photo(name):
    """A photograph as uint8 [H, W, 3], loaded once per process."""
    if name not in _photos:
        a = getattr(skimage.data, name)()
        if a.ndim == 2:
            a = np.stack([a, a, a], axis=-1)
        _photos[name] = np.ascontiguousarray(a[..., :3])
    return _photos[name]


def available_photos():
    """The PHOTOS this scikit-image has on disk (some versions download a few on demand)."""
    names = []
    for name in PHOTOS:
        try:
            photo(name)
            names.append(name)
        except Exception as e:  # a missing optional download: leave the photograph out
            print(f"make_image_shards: leaving out {name} ({type(e).__name__})", file=sys.stderr)
    return names


def make_image(args, index):
    """The JPEG bytes and label of image `index`: a function of (seed, index) and the options."""
    rng = np.random.default_rng([args.seed, index])
    label = int(rng.integers(len(args.photos)))
    source = photo(args.photos[label])
    h, w = source.shape[:2]
    # A crop of 20-100% of the photo's area, aspect ratio 3:4 to 4:3.
    area = h * w * rng.uniform(0.2, 1.0)
    ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    ch = int(min(h, max(16, round(np.sqrt(area / ratio)))))
    cw = int(min(w, max(16, round(np.sqrt(area * ratio)))))
    y = int(rng.integers(h - ch + 1))
    x = int(rng.integers(w - cw + 1))
    crop = source[y:y + ch, x:x + cw].astype(np.float32)
    # Colour shift: a gain per channel and one brightness offset.
    crop = crop * rng.uniform(0.8, 1.2, size=3) + rng.uniform(-20, 20)
    image = Image.fromarray(np.clip(crop + 0.5, 0, 255).astype(np.uint8), "RGB")
    longest = int(rng.integers(args.min_side, args.max_side + 1))
    scale = longest / max(ch, cw)
    size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
    image = image.resize(size, Image.BICUBIC)
    if rng.uniform() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=args.quality)
    return out.getvalue(), label


def add_member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_shard(args, shard):
    first = shard * args.per_shard
    last = min(args.count, first + args.per_shard)
    path = os.path.join(args.out, f"{args.prefix}-{shard:05d}.tar")
    stats = {"images": 0, "bytes": 0, "pixels": 0}
    with tarfile.open(path + ".part", "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(first, last):
            jpeg, label = make_image(args, i)
            key = f"{i:08d}"
            add_member(tar, key + ".jpg", jpeg)
            add_member(tar, key + ".cls", str(label).encode())
            stats["images"] += 1
            stats["bytes"] += len(jpeg)
            with Image.open(io.BytesIO(jpeg)) as im:
                stats["pixels"] += im.width * im.height
    os.replace(path + ".part", path)
    return stats


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for the shards (created)")
    p.add_argument("--count", type=int, default=1000, help="images in all")
    p.add_argument("--per-shard", type=int, default=1000, help="images per shard")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quality", type=int, default=90, help="JPEG quality (Pillow)")
    p.add_argument("--min-side", type=int, default=400, help="shortest longest side, px")
    p.add_argument("--max-side", type=int, default=600, help="longest longest side, px")
    p.add_argument("--prefix", default="images", help="shard names: PREFIX-00000.tar, ...")
    p.add_argument("--workers", type=int, default=1, help="processes (the bytes do not change)")
    args = p.parse_args()
    if args.count < 1 or args.per_shard < 1 or not 1 <= args.quality <= 100 or \
            not 16 <= args.min_side <= args.max_side:
        p.error("need count >= 1, per-shard >= 1, 1 <= quality <= 100, 16 <= min-side <= max-side")
    args.photos = available_photos()
    if len(args.photos) < 3:
        p.error(f"scikit-image offers only {args.photos} of {list(PHOTOS)}")
    os.makedirs(args.out, exist_ok=True)
    shards = (args.count + args.per_shard - 1) // args.per_shard
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers) as pool:
            results = list(pool.map(write_shard, [args] * shards, range(shards)))
    else:
        results = [write_shard(args, s) for s in range(shards)]
    total = {k: sum(r[k] for r in results) for k in results[0]}
    summary = {"shards": shards, "images": total["images"], "photos": args.photos,
               "mean_jpeg_bytes": round(total["bytes"] / total["images"]),
               "mean_pixels": round(total["pixels"] / total["images"]), "out": args.out}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
