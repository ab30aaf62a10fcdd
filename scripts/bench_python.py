#!/usr/bin/env python3
"""Batches delivered into PyTorch tensors on the GPU, in one process: flowfeed (torch.from_dlpack
per batch, and Pipeline.views: one tensor per pool buffer, on the default stream and on a stream of
the loop's own) against torch.utils.data.DataLoader (0, 4, 8 workers, pin_memory; 0 workers on
both streams too) and raw pinned copies, for 200 KB batches (64 x 784 float32) and 32 MiB batches
(64 x 131072 float32); and what the Python layer adds per batch over a C++ pull loop.

    PYTHONPATH=build/python python3 scripts/bench_python.py [--quick] [--json FILE] [--record FILE]

Every figure is the best of --repeat runs. Without a GPU (or with --device cpu) the "GPU" is the
host: only the overhead figures mean anything then (--quick is the CI smoke run), and --record
(docs/results/records.json: scripts/records.py) writes only those."""
import argparse
import contextlib
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import flowfeed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import records  # noqa: E402

SIZES = {"200KB": 784, "32MiB": 131072}  # floats per sample; 64 samples per batch


def flowfeed_config(features, batches, epochs, device, pinned):
    cuda = device == "cuda"
    return f"""
pipeline: {{ mode: pull, epochs: {epochs}, batch_size: 64, prefetch_depth: 16, device: {"cuda" if cuda else "host"} }}
nodes:
  - {{ name: load, type: memory, params: {{ batches: {batches}, sample_shape: [{features}], dtype: float32, pin: {str(pinned).lower()} }} }}
  - {{ name: stage, type: {"pinned_staging" if cuda else "host_staging"}, concurrency: 2 }}
  - {{ name: upload, type: {"cuda_upload" if cuda else "host_upload"} }}
"""


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed(device, fn):
    sync(device)
    t0 = time.perf_counter()
    n = fn()
    sync(device)
    return n / (time.perf_counter() - t0)


def bench_flowfeed(features, batches, epochs, device, pinned):
    pipeline = flowfeed.Pipeline(flowfeed_config(features, batches, epochs, device, pinned))

    def loop():
        n = 0
        for batch in pipeline:
            x = torch.from_dlpack(batch["x"])  # on the current stream, which waits on the upload
            n += x.shape[0] > 0
            del x
            batch.release()
        return n

    return timed(device, loop)


def side_stream(device):
    """A stream of the loop's own (torch.cuda.stream(s)), or the current stream."""
    return torch.cuda.stream(torch.cuda.Stream()) if device == "cuda" else contextlib.nullcontext()


def bench_flowfeed_views(features, batches, epochs, device, pinned):
    """The same run through Pipeline.views: one torch tensor per pool buffer, no import per batch,
    on the current stream."""
    pipeline = flowfeed.Pipeline(flowfeed_config(features, batches, epochs, device, pinned))
    stream = torch.cuda.current_stream() if device == "cuda" else None

    views = pipeline.views("x", torch.from_dlpack, stream=stream)

    def loop():
        n = 0
        for _ in range(epochs):
            for x in views:
                n += x.shape[0] > 0
        return n

    return timed(device, loop)


class InMemory(Dataset):
    """`count` batches of 64 x features float32 in pageable memory, one item per batch."""

    def __init__(self, features, count):
        self.batches = [torch.rand(64, features) for _ in range(min(count, 16))]
        self.count = count

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        return self.batches[i % len(self.batches)]


def bench_dataloader(features, count, workers, device):
    extra = {"persistent_workers": True, "prefetch_factor": 4} if workers else {}
    loader = DataLoader(InMemory(features, count), batch_size=None, num_workers=workers,
                        pin_memory=device == "cuda", **extra)
    iter(loader)  # start the workers before the clock

    def loop():
        n = 0
        for x in loader:
            n += x.to(device, non_blocking=True).shape[0] > 0
        return n

    return timed(device, loop)


def bench_raw_pinned(features, count, device):
    sources = [torch.rand(64, features).pin_memory() if device == "cuda" else torch.rand(64, features)
               for _ in range(4)]
    targets = [torch.empty(64, features, device=device) for _ in range(4)]

    def loop():
        for i in range(count):
            targets[i % 4].copy_(sources[i % 4], non_blocking=True)
        return count

    return timed(device, loop)


def overhead(batches, repeat):
    """Microseconds per batch: a C++ pull loop, the Python loop, and the Python loop importing x
    into torch, over zero-work batches (one float per sample, batch 1) on the host."""
    config = f"""
pipeline: {{ mode: pull, epochs: 1, batch_size: 1, prefetch_depth: 16, device: host }}
nodes:
  - {{ name: load, type: synthetic, concurrency: 2, params: {{ batches: {batches}, sample_shape: [1] }} }}
  - {{ name: stage, type: host_staging, concurrency: 2 }}
  - {{ name: upload, type: host_upload }}
"""
    pipeline = flowfeed.Pipeline(config)

    def cpp():
        report = pipeline.run_pull_loop()
        return 1e6 / report["batches_per_second"]

    def python_loop(with_torch):
        t0 = time.perf_counter()
        n = 0
        for batch in pipeline:
            if with_torch:
                x = torch.from_dlpack(batch["x"])
                del x
            batch.release()
            n += 1
        return 1e6 * (time.perf_counter() - t0) / n

    def views_loop():
        t0 = time.perf_counter()
        n = 0
        for _ in pipeline.views("x", torch.from_dlpack):
            n += 1
        return 1e6 * (time.perf_counter() - t0) / n

    best = {"cpp_pull_loop": min(cpp() for _ in range(repeat)),
            "python_loop": min(python_loop(False) for _ in range(repeat)),
            "python_loop_from_dlpack": min(python_loop(True) for _ in range(repeat)),
            "python_views": min(views_loop() for _ in range(repeat))}
    best["python_layer_added"] = best["python_loop"] - best["cpp_pull_loop"]
    best["python_views_added"] = best["python_views"] - best["cpp_pull_loop"]
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny counts (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", default="0,4,8")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--record", help="make the figures their scenarios' records in this "
                        "results file, keeping the others (docs/results/records.json)")
    parser.add_argument("--build", help="the build a --record names (default: this tree's commit)")
    parser.add_argument("--machine", help="the machine a --record names (default: described)")
    args = parser.parse_args()
    if args.record and args.quick:
        parser.error("--record with --quick: a quick run is a smoke test, not a measurement")
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    repeat = 1 if args.quick else args.repeat
    workers = [int(w) for w in args.workers.split(",")] if not args.quick else [0]
    results = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "torch": torch.__version__, "sizes": {}}
    for label, features in SIZES.items():
        small = features < 10000
        count = (200 if args.quick else 100000) if small else (8 if args.quick else 2000)
        batches = 64 if small else 16  # distinct batches in the data set
        epochs = max(1, count // batches)
        count = epochs * batches
        bytes_per_batch = 64 * features * 4
        row = {}
        for pinned in (True, False):
            key = "flowfeed_" + ("pinned_in_place" if pinned else "pageable")
            row[key] = max(bench_flowfeed(features, batches, epochs, device, pinned)
                           for _ in range(repeat))
            row[key + "_views"] = max(bench_flowfeed_views(features, batches, epochs, device, pinned)
                                      for _ in range(repeat))
            with side_stream(device):
                row[key + "_views_side_stream"] = max(
                    bench_flowfeed_views(features, batches, epochs, device, pinned)
                    for _ in range(repeat))
        for w in workers:
            n = count if w == 0 else max(count // 20, 8)  # workers are slow: fewer batches
            row[f"dataloader_{w}_workers"] = max(bench_dataloader(features, n, w, device)
                                                 for _ in range(repeat))
        with side_stream(device):
            row["dataloader_0_workers_side_stream"] = max(bench_dataloader(features, count, 0, device)
                                                          for _ in range(repeat))
        row["raw_pinned_copies"] = max(bench_raw_pinned(features, count, device)
                                       for _ in range(repeat))
        results["sizes"][label] = {"bytes_per_batch": bytes_per_batch, "batches_per_second": row}
        print(f"{label} batches ({bytes_per_batch:,} B) into torch on {device}, batches/s (GB/s):")
        for name, rate in row.items():
            print(f"  {name:42s} {rate:12,.0f}  ({rate * bytes_per_batch / 1e9:6.2f} GB/s)")
    if device != "cuda":
        print("(no GPU: 'into torch' is a host tensor here and .to('cpu') copies nothing; only the "
              "figures below compare like with like)")
    results["overhead_us_per_batch"] = overhead(20000 if args.quick else 300000, repeat)
    print("per-batch cost on the host, zero-work batches (us):")
    for name, us in results["overhead_us_per_batch"].items():
        print(f"  {name:42s} {us:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.record:
        write_records(args, device, results)


def target(value, of, figure, baseline):
    x = figure / baseline if of == "ratio" else figure
    return {"value": value, "of": of, "bound": "at_least", "met": x >= value}


def write_records(args, device, results):
    """The scenarios' records (docs/results/BENCHMARKS.md, Python): 200 KB and 32 MiB batches
    against the best DataLoader and raw copies (on a GPU only), and the per-batch cost on the host."""
    command = " ".join(["python3"] + [records.shell_word(a) for a in sys.argv])
    machine = args.machine or records.machine(
        torch.cuda.get_device_name() if device == "cuda" else None)
    out = {}

    def add(name, figure, unit, baseline, tgt=None, note=None):
        extra = {"note": note} if note else {}
        out[name] = records.make(figure, unit, baseline, command, tgt, args.build, machine, **extra)

    if device == "cuda":
        for label, gb in (("200KB", False), ("32MiB", True)):
            size = results["sizes"][label]
            rate = size["batches_per_second"]
            scale = size["bytes_per_batch"] / 1e9 if gb else 1.0
            unit = "GB/s" if gb else "batches/s"
            best = max(v for k, v in rate.items() if k.startswith("dataloader_")) * scale
            views = rate["flowfeed_pinned_in_place_views"] * scale
            if gb:
                raw = rate["raw_pinned_copies"] * scale
                add("python_32MiB_views", views, unit, best, target(1.0, "ratio", views, best),
                    "baseline: the best DataLoader")
                add("python_32MiB_views_vs_raw_copies", views, unit, raw,
                    target(0.9, "ratio", views, raw), "baseline: raw pinned copies")
            else:
                own = rate["flowfeed_pinned_in_place_views_side_stream"]
                dlpack = rate["flowfeed_pinned_in_place"]
                add("python_200KB_views", views, unit, best, target(5, "ratio", views, best),
                    "64 x 784 float32, pinned in place, PyTorch's default stream; baseline: the "
                    "best DataLoader")
                add("python_200KB_views_own_stream", own, unit, best, target(5, "ratio", own, best))
                add("python_200KB_from_dlpack", dlpack, unit, best, None,
                    "torch.from_dlpack per batch; baseline: the best DataLoader")
    us = results["overhead_us_per_batch"]
    note = "zero-work batches on the host; baseline: the C++ pull loop; target: at most 5 us added"
    add("python_views_overhead", us["python_views"], "us/batch", us["cpp_pull_loop"], None, note)
    add("python_loop_overhead", us["python_loop"], "us/batch", us["cpp_pull_loop"], None, note)
    records.write_records(args.record, out)
    print(f"records: {', '.join(out)} in {args.record}")


if __name__ == "__main__":
    sys.exit(main())
