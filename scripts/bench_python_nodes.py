#!/usr/bin/env python3
"""Python callables as flowfeed loader nodes against torch.utils.data.DataLoader, in one process,
the same callable on both sides, samples delivered into tensors on the GPU (--device cpu: host).

  (a) images: PIL decode + torchvision RandomResizedCrop(224) + horizontal flip -> uint8
      [224, 224, 3], over the JPEGs of scripts/make_image_shards.py (tar members read into memory),
      batch 256. Figure: images/s.
  (b) cheap: numpy slices of a memory-mapped float32 [n, 784] array, batch 64 (200 KB batches);
      per sample (fn(i)) and per batch (fn(indices), DataLoader through a BatchSampler).
      Figure: batches/s.
  (c) no-op: a callable that returns the same tiny sample; the cost per call beyond the
      callable's own time, flowfeed's python loader against its C++ `synthetic` loader of the same
      shape, and the RSS, refcounts and gc objects before and after --calls-batches batches
      (memory "flat": RSS within 5 MiB, no refcount growth; --record's target needs both).

flowfeed: a `python` loader node (each --concurrency setting, e.g. 4,8,16: the best counts, as
DataLoader's best --workers setting does), pinned_staging, cuda_upload, batches
taken through Pipeline.views. DataLoader: --workers settings (0, 8, 16), pin_memory on CUDA,
persistent workers, each batch copied with .to(device, non_blocking=True). Beside them, for (a)
and (b), the callable alone on a plain pool of as many Python threads as each --concurrency
setting (concurrent.futures, results dropped): what the GIL lets that callable do on these
cores with no framework at all. Every rate is measured
over --epochs epochs from the start of iteration (DataLoader's workers, when it has some, started by
an untimed epoch before; flowfeed's run starts on the first iteration, so neither has prefetched),
best of --repeat. One JSON record
per scenario on stdout (figure, baseline = the best DataLoader setting, ratio, command, date,
machine); progress on stderr. --record FILE also makes each its scenario's record
(python_nodes_<scenario>) in a results file (docs/results/records.json: scripts/records.py),
keeping the other records.

    python3 scripts/make_image_shards.py --out /tmp/shards --count 10000 --per-shard 500 --workers 16
    PYTHONPATH=build/python python3 scripts/bench_python_nodes.py --shards /tmp/shards \\
        --concurrency 16 --workers 0,8,16 > bench_python_nodes.jsonl
    PYTHONPATH=build/python python3 scripts/bench_python_nodes.py --device cpu --quick --shards DIR
"""
import argparse
import datetime
import gc
import glob
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

import flowfeed

try:  # torchvision >= 0.15
    from torchvision.transforms import v2 as transforms
    TRANSFORMS = "torchvision.transforms.v2"
except ImportError:  # Debian 12's torchvision 0.14
    from torchvision import transforms
    TRANSFORMS = "torchvision.transforms"


def log(message):
    print(message, file=sys.stderr, flush=True)


# ---- the callables (the same objects go to both sides) ----

class JpegImages(Dataset):
    """(a): JPEG bytes held in memory; __getitem__ decodes, crops, flips -> uint8 HWC, label."""

    def __init__(self, shards, limit):
        self.jpegs, self.labels = [], []
        for path in sorted(glob.glob(os.path.join(shards, "*.tar"))):
            members = {}
            with tarfile.open(path) as tar:
                for member in tar:
                    if member.isfile():
                        members[member.name] = tar.extractfile(member).read()
            for name in sorted(n for n in members if n.endswith(".jpg")):
                self.jpegs.append(members[name])
                self.labels.append(int(members[name[:-4] + ".cls"]))
                if len(self.jpegs) == limit:
                    break
            if len(self.jpegs) == limit:
                break
        if not self.jpegs:
            raise SystemExit(f"bench_python_nodes: no <key>.jpg tar members in {shards}/*.tar "
                             "(write them with scripts/make_image_shards.py --out DIR)")
        crop = (transforms.RandomResizedCrop(224, antialias=True) if TRANSFORMS.endswith("v2")
                else transforms.RandomResizedCrop(224))
        self.augment = transforms.Compose([crop, transforms.RandomHorizontalFlip()])

    def __len__(self):
        return len(self.jpegs)

    def __getitem__(self, i):
        with Image.open(io.BytesIO(self.jpegs[i])) as image:
            image = self.augment(image.convert("RGB"))
        return {"x": np.array(image, dtype=np.uint8), "y": np.array(self.labels[i], dtype=np.int64)}


IMAGE_LAYOUT = {"x": {"dtype": "uint8", "shape": [224, 224, 3]}, "y": {"dtype": "int64", "shape": []}}


class MappedRows(Dataset):
    """(b): rows of a memory-mapped float32 [n, 784] .npy; fn(i) -> a row (a view, no copy)."""

    def __init__(self, path, samples):
        if not os.path.exists(path):
            data = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(samples, 784))
            for start in range(0, samples, 4096):
                stop = min(samples, start + 4096)
                data[start:stop] = np.arange(start, stop, dtype=np.float32)[:, None]
            data.flush()
            del data
        self.x = np.load(path, mmap_mode="c")  # copy-on-write: writable views, file untouched
        self.y = np.arange(len(self.x), dtype=np.int64) % 10

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i, ...]}  # [784] view, 0-d view


class MappedBatches(Dataset):
    """(b), per batch: fn(indices) -> the rows (numpy fancy indexing: one gather per batch)."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, indices):
        indices = np.asarray(indices)
        return {"x": self.rows.x[indices], "y": self.rows.y[indices]}

    # flowfeed's batched loader calls __getitems__ (torch's name for it); DataLoader, through a
    # BatchSampler with batch_size=None, calls __getitem__ with the list: the same function.
    __getitems__ = __getitem__


ROW_LAYOUT = {"x": {"dtype": "float32", "shape": [784]}, "y": {"dtype": "int64", "shape": []}}


class NoOp(Dataset):
    """(c): returns the same tiny sample every call (x float32 [1], y int32, as `synthetic`)."""

    def __init__(self, samples):
        self.samples = samples
        self.sample = {"x": np.zeros(1, np.float32), "y": np.zeros((), np.int32)}

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        return self.sample


NOOP_LAYOUT = {"x": {"dtype": "float32", "shape": [1]}, "y": {"dtype": "int32", "shape": []}}


# ---- the two sides ----

def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def flowfeed_pipeline(load, batch, epochs, device, depth=16):
    cuda = device == "cuda"
    return flowfeed.Pipeline({
        "pipeline": {"batch_size": batch, "epochs": epochs, "prefetch_depth": depth,
                     "device": "cuda" if cuda else "host"},
        "sampler": {"shuffle": True, "seed": 0},
        "nodes": [load, {"name": "stage", "type": "pinned_staging"},
                  {"name": "upload", "type": "cuda_upload"}]})


def python_load(callable_, layout, concurrency, batched=False):
    return {"name": "load", "type": "python", "concurrency": concurrency,
            "params": {"callable": callable_, "batched": batched, "layout": layout}}


def flowfeed_rate(load, batch, epochs, device):
    """Samples/s through a pipeline with `load` into torch on `device` over `epochs` epochs, timed
    from the start of the run (the pipeline is built before the clock; nothing is prefetched
    before it, as DataLoader's workers start on iter()). Returns (rate, the pipeline's report)."""
    pipeline = flowfeed_pipeline(load, batch, epochs, device)
    stream = torch.cuda.current_stream() if device == "cuda" else None
    views = pipeline.views(["x", "y"], torch.from_dlpack, stream=stream)
    sync(device)
    t0 = time.perf_counter()
    samples = 0
    for _ in range(epochs):
        for x, _y in views:  # the first iteration starts the run
            samples += x.shape[0]
    sync(device)
    rate = samples / (time.perf_counter() - t0)
    report = pipeline.report()
    del views, pipeline
    return rate, report


def dataloader_rate(dataset, batch, epochs, workers, device, batched=False):
    """Samples/s through DataLoader into torch on `device`, as flowfeed_rate."""
    extra = {"persistent_workers": True} if workers else {}
    generator = torch.Generator().manual_seed(0)
    if batched:
        sampler = BatchSampler(RandomSampler(range(len(dataset)), generator=generator), batch, False)
        loader = DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=workers,
                            pin_memory=device == "cuda", **extra)
    else:
        loader = DataLoader(dataset, batch_size=batch, shuffle=True, generator=generator,
                            num_workers=workers, pin_memory=device == "cuda", **extra)

    def epoch():
        n = 0
        for b in loader:
            x = b["x"].to(device, non_blocking=True)
            b["y"].to(device, non_blocking=True)
            n += x.shape[0]
        return n

    if workers:
        epoch()  # the workers' start (persistent), untimed; they prefetch again only on iter()
    sync(device)
    t0 = time.perf_counter()
    samples = sum(epoch() for _ in range(epochs))
    sync(device)
    return samples / (time.perf_counter() - t0)


def threads_rate(fn, count, epochs, threads):
    """Samples/s of `fn` called for every index on a plain pool of Python threads, results
    dropped: no flowfeed, no copies, no GPU; the GIL's ceiling for this callable on these cores."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(threads) as pool:
        t0 = time.perf_counter()
        for _ in range(epochs):
            for _ in pool.map(fn, range(count), chunksize=64):
                pass
        return count * epochs / (time.perf_counter() - t0)


def compare(args, name, unit, per, flowfeed_fn, dataloader_fn, threads_fn=None):
    """Runs both sides (best of --repeat); per: samples per reported unit (1: samples, 64: the
    batches of (b)). Returns the record."""
    ffs = {}
    for c in args.concurrency:
        ffs[c] = max(flowfeed_fn(c)[0] for _ in range(args.repeat)) / per
        log(f"{name}: flowfeed (concurrency {c}) {ffs[c]:,.1f} {unit}")
    concurrency = max(ffs, key=ffs.get)
    ff = ffs[concurrency]
    dl = {}
    for w in args.workers:
        dl[w] = max(dataloader_fn(w) for _ in range(args.repeat)) / per
        log(f"{name}: DataLoader ({w} workers) {dl[w]:,.1f} {unit}")
    best = max(dl, key=dl.get)
    threads = {}
    for c in args.concurrency if threads_fn else []:
        threads[f"{c} threads"] = max(threads_fn(c) for _ in range(args.repeat)) / per
        log(f"{name}: the callable alone on {c} Python threads "
            f"{threads[f'{c} threads']:,.1f} {unit}")
    return {"scenario": name, "unit": unit, "figure": ff, "baseline": dl[best],
            "baseline_setting": f"DataLoader {best} workers", "ratio": ff / dl[best],
            "flowfeed": {"concurrency": concurrency, unit: ff,
                         "settings": {f"concurrency {c}": r for c, r in ffs.items()}},
            "dataloader": {f"{w} workers": r for w, r in dl.items()},
            "python_threads": threads}


# ---- (c): per-call cost and memory ----

def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def own_time_us(fn, calls):
    """The callable's own time per call, in a bare Python loop."""
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    return 1e6 * (time.perf_counter() - t0) / calls


def refcounts(noop):
    gc.collect()
    counts = {f"sample[{k!r}]": sys.getrefcount(v) for k, v in noop.sample.items()}
    counts["sample"] = sys.getrefcount(noop.sample)
    counts["callable"] = sys.getrefcount(noop)
    return counts


MEMORY_FLAT_BYTES = 5 << 20


def noop_memory(args):
    """RSS, gc objects and refcounts over --calls-batches batches of the no-op loader: from batch
    1,000 (pools and caches warm) to the end of the run, refcounts after the pipeline is gone."""
    noop = NoOp(args.batch * args.calls_batches)
    refs = refcounts(noop)
    pipeline = flowfeed_pipeline(python_load(noop, NOOP_LAYOUT, max(args.concurrency)), args.batch,
                                 1, args.device)
    warm = min(1000, args.calls_batches // 2)
    batches, start = 0, None
    views = pipeline.views("x", torch.from_dlpack)
    for x in views:
        batches += 1
        if batches == warm:
            gc.collect()
            start = (rss_bytes(), len(gc.get_objects()))
    del x  # a view keeps its pipeline (and so the callable) alive
    gc.collect()
    end = (rss_bytes(), len(gc.get_objects()))
    del views, pipeline
    after = refcounts(noop)
    growth = {k: after[k] - refs[k] for k in refs}
    # The (c): RSS within 5 MiB and no refcount growth over the run.
    flat = end[0] - start[0] <= MEMORY_FLAT_BYTES and not any(growth.values())
    return {"batches": batches, "measured_from_batch": warm,
            "rss_growth_bytes": end[0] - start[0], "gc_objects_growth": end[1] - start[1],
            "refcount_growth": growth, "flat": flat}


def noop_scenario(args):
    """Microseconds per sample: flowfeed's python loader (one body, so calls do not overlap)
    against its C++ synthetic loader of the same shape; what is left after the callable's own
    time is the cost per call. DataLoader's time per sample beside it, less the same own time."""
    batch = args.batch
    noop = NoOp(batch * args.noop_batches)
    synthetic = {"name": "load", "type": "synthetic", "concurrency": 1,
                 "params": {"samples": len(noop), "sample_shape": [1], "dtype": "float32"}}
    cost = {}
    for label, load in (("python", python_load(noop, NOOP_LAYOUT, 1)), ("synthetic", synthetic)):
        cost[label] = min(1e6 / flowfeed_rate(load, batch, args.epochs, args.device)[0]
                          for _ in range(args.repeat))
    own = min(own_time_us(noop.__getitem__, len(noop)) for _ in range(args.repeat))
    added = cost["python"] - cost["synthetic"] - own
    log(f"c_noop: per sample: python loader {cost['python']:.3f} us, synthetic "
        f"{cost['synthetic']:.3f} us, the callable's own {own:.3f} us: {added:.3f} us per call added")
    fewer = NoOp(max(8, args.noop_batches // 8) * batch)  # DataLoader is slower per sample
    dl = {}
    for w in args.workers:
        dl[w] = min(1e6 / dataloader_rate(fewer, batch, 1, w, args.device)
                    for _ in range(args.repeat))
        log(f"c_noop: DataLoader ({w} workers) {dl[w]:.3f} us per sample")
    best = min(dl, key=dl.get)
    memory = noop_memory(args)
    log(f"c_noop: memory: {memory}")
    return {"scenario": "c_noop", "unit": "us per call added", "figure": added,
            "baseline": dl[best] - own, "baseline_setting": f"DataLoader {best} workers",
            "ratio": added / (dl[best] - own) if dl[best] > own else None,
            "lower_is_better": True,
            "flowfeed": {"python_loader_us_per_sample": cost["python"],
                         "synthetic_loader_us_per_sample": cost["synthetic"],
                         "callable_own_us": own, "concurrency": 1},
            "dataloader": {f"{w} workers": {"us_per_sample": us} for w, us in dl.items()},
            "memory": memory}


# ---- main ----

def machine(device):
    info = {"host": platform.node(), "cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "torch": torch.__version__,
            "numpy": np.__version__, "transforms": TRANSFORMS, "device": device}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        info["commit"] = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--scenarios", default="a,b,c", help="any of a, b, c")
    parser.add_argument("--shards", help="(a): folder of make_image_shards.py's *.tar")
    parser.add_argument("--images", type=int, default=10000, help="(a): images used")
    parser.add_argument("--rows", type=int, default=65536, help="(b): rows of the mapped array")
    parser.add_argument("--data", default=None, help="(b): where the mapped .npy goes (temp)")
    parser.add_argument("--noop-batches", type=int, default=4096,
                        help="(c): batches per epoch of the timed runs")
    parser.add_argument("--calls-batches", type=int, default=100000,
                        help="(c): batches of the memory run")
    parser.add_argument("--batch", type=int, default=256, help="(a), (c): samples per batch")
    parser.add_argument("--concurrency", default="16",
                        help="flowfeed's loader bodies (a, b); several, e.g. 4,8,16: the best")
    parser.add_argument("--workers", default="0,8,16", help="DataLoader num_workers settings")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--record", help="make each scenario's figure its record in this results "
                        "file, keeping the others (docs/results/records.json)")
    parser.add_argument("--build", help="the build a --record names (default: the commit)")
    parser.add_argument("--machine", help="the machine a --record names (default: described)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (a run-through: 512 images, 8192 rows, 64 and 2,000 batches)")
    args = parser.parse_args()
    args.device = "cuda" if args.device.startswith("cuda") else "cpu"
    args.workers = [int(w) for w in args.workers.split(",")]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if args.record and args.quick:
        parser.error("--record with --quick: a quick run is a smoke test, not a measurement")
    if args.quick:
        args.images, args.rows = min(args.images, 512), 8192
        args.noop_batches, args.calls_batches = 64, 2000
        args.epochs, args.repeat = 1, 1
    scenarios = set(args.scenarios.split(","))
    if "a" in scenarios and not args.shards:
        parser.error("(a) needs --shards DIR (scripts/make_image_shards.py --out DIR), "
                     "or --scenarios b,c")
    common = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": machine(args.device)}
    records = []

    def emit(record):  # each scenario's record on stdout as soon as it is measured
        records.append(record)
        print(json.dumps({**record, **common}), flush=True)

    if "a" in scenarios:
        images = JpegImages(args.shards, args.images)
        log(f"a_images: {len(images)} images from {args.shards}, {TRANSFORMS}")
        emit({**compare(
            args, "a_images", "images/s", 1,
            lambda c: flowfeed_rate(python_load(images, IMAGE_LAYOUT, c), args.batch, args.epochs,
                                    args.device),
            lambda w: dataloader_rate(images, args.batch, args.epochs, w, args.device),
            lambda c: threads_rate(images.__getitem__, len(images), args.epochs, c)),
            "images": len(images)})
    if "b" in scenarios:
        with tempfile.TemporaryDirectory(dir=args.data) as folder:
            rows = MappedRows(os.path.join(folder, "rows.npy"), args.rows)
            batches = MappedBatches(rows)
            sizes = {"rows": len(rows), "batch_bytes": 64 * 784 * 4}
            emit({**compare(
                args, "b_rows_per_sample", "batches/s", 64,
                lambda c: flowfeed_rate(python_load(rows, ROW_LAYOUT, c), 64, args.epochs,
                                        args.device),
                lambda w: dataloader_rate(rows, 64, args.epochs, w, args.device),
                lambda c: threads_rate(rows.__getitem__, len(rows), args.epochs, c)), **sizes})
            emit({**compare(
                args, "b_rows_per_batch", "batches/s", 64,
                lambda c: flowfeed_rate(python_load(batches, ROW_LAYOUT, c, True), 64, args.epochs,
                                        args.device),
                lambda w: dataloader_rate(batches, 64, args.epochs, w, args.device, batched=True)),
                **sizes})
            del rows, batches
    if "c" in scenarios:
        emit(noop_scenario(args))
    if args.record:
        write_records(args, records)
    return 0


# Each scenario's target: (value, of, bound).
TARGETS = {"a_images": (1.5, "ratio", "at_least"), "b_rows_per_sample": (3, "ratio", "at_least"),
           "b_rows_per_batch": (3, "ratio", "at_least"), "c_noop": (3, "figure", "at_most")}


def write_records(args, found):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import records
    command = " ".join(["python3"] + [records.shell_word(a) for a in sys.argv])
    machine = args.machine or records.machine(
        torch.cuda.get_device_name() if args.device == "cuda" else None)
    out = {}
    for r in found:
        value, of, bound = TARGETS[r["scenario"]]
        x = r["ratio"] if of == "ratio" else r["figure"]
        met = x is not None and (x >= value if bound == "at_least" else x <= value)
        if r["scenario"] == "c_noop":
            met = met and r["memory"]["flat"]  # and memory flat over the run (details: memory)
        details = {k: v for k, v in r.items()
                   if k not in ("scenario", "unit", "figure", "baseline", "ratio")}
        record = records.make(r["figure"], r["unit"], r["baseline"], command,
                              {"value": value, "of": of, "bound": bound, "met": met},
                              args.build, machine, details=details)
        record["ratio"] = r["ratio"]
        out["python_nodes_" + r["scenario"]] = record
    records.write_records(args.record, out)
    log(f"records: {', '.join(out)} in {args.record}")


if __name__ == "__main__":
    sys.exit(main())
