#!/usr/bin/env python3
"""Where the Python path's time goes on the GPU, in one process.

    PYTHONPATH=build/python python3 scripts/python_breakdown.py [mlp|small|all] (data in .data/)

mlp: the Fashion-MNIST MLP step of examples/python/train_mlp.py fed by flowfeed, with timers around
next(), the two torch.from_dlpack calls, the step and release(), at the default thread count and
at pipeline.threads 2 and 4, beside the resident and `.cuda()`-per-batch loops (epochs 2-4 timed).
small: 200 KB batches (64 x 784 float32, pinned in place, depth 8 and 16) taken by the C++ pull
loop, by a Python loop that only releases them, that also makes the tensor object, and that also
imports it with torch.from_dlpack."""
import os, sys, time, json
import torch
sys.path.insert(0, "examples/python")
import common, flowfeed

dev = "cuda"
data = ".data"
images, labels = common.files(data, "train")
out = {}

def mlp(threads=None, depth=None, do_step=True, epochs=4, two=True):
    ov = {"pipeline.epochs": epochs, "pipeline.device": "cuda", "nodes.load.params.images": images,
          "nodes.load.params.labels": labels}
    if threads is not None: ov["pipeline.threads"] = threads
    if depth is not None: ov["pipeline.prefetch_depth"] = depth
    p = flowfeed.Pipeline("configs/fashion_mnist_pull.yaml", overrides=ov)
    model, opt = common.model_and_optimizer(dev)
    tn = td = ts = tr = 0.0; steps = 0
    torch.cuda.synchronize(); t_all = None
    for e in range(epochs):
        if e == 1: torch.cuda.synchronize(); t_all = time.perf_counter(); tn = td = ts = tr = 0.0; steps = 0
        it = iter(p.epoch())
        while True:
            a = time.perf_counter()
            try: batch = next(it)
            except StopIteration: break
            b = time.perf_counter()
            x = torch.from_dlpack(batch["x"])
            y = torch.from_dlpack(batch["y"]) if two else None
            c = time.perf_counter()
            if do_step: common.step(model, opt, x, y)
            d = time.perf_counter()
            del x, y
            batch.release()
            e2 = time.perf_counter()
            tn += b - a; td += c - b; ts += d - c; tr += e2 - d; steps += 1
    torch.cuda.synchronize(); el = time.perf_counter() - t_all
    r = dict(steps_s=steps / el, next_us=1e6*tn/steps, dlpack_us=1e6*td/steps, step_us=1e6*ts/steps, release_us=1e6*tr/steps)
    p.close()
    return r

def resident(cuda_per_batch=False, epochs=4):
    x, y = (torch.from_numpy(a) for a in common.read_idx(images, labels))
    model, opt = common.model_and_optimizer(dev)
    g = torch.Generator().manual_seed(42)
    if not cuda_per_batch:
        x, y = x.to(dev), y.to(dev)
    else:
        x, y = x.pin_memory(), y.pin_memory()
    ts = 0.0; steps = 0; t_all = None
    for e in range(epochs):
        if e == 1: torch.cuda.synchronize(); t_all = time.perf_counter(); ts = 0.0; steps = 0
        order = torch.randperm(len(y), generator=g)
        if not cuda_per_batch: order = order.to(dev)
        for rows in order.split(64):
            if cuda_per_batch:
                bx, by = x[rows].to(dev, non_blocking=True), y[rows].to(dev, non_blocking=True)
            else:
                bx, by = x[rows], y[rows]
            c = time.perf_counter(); common.step(model, opt, bx, by); ts += time.perf_counter() - c; steps += 1
    torch.cuda.synchronize(); el = time.perf_counter() - t_all
    return dict(steps_s=steps / el, step_us=1e6*ts/steps)

what = sys.argv[1] if len(sys.argv) > 1 else "all"
if what in ("mlp", "all"):
  out["resident"] = resident()
  out["cuda_per_batch"] = resident(True)
  out["flowfeed"] = mlp()
  out["flowfeed_threads2"] = mlp(threads=2)
  out["flowfeed_threads4"] = mlp(threads=4)
  out["flowfeed_nostep"] = mlp(do_step=False)
  out["resident_again"] = resident()
  out["flowfeed_again"] = mlp()
  for k, v in out.items(): print(k, {a: round(b, 2) for a, b in v.items()}, flush=True)

# 200 KB batches: C++ pull loop vs Python variants
def small(variant, depth=8, threads=None, batches=64, epochs=1500):
    cfg = f"""
pipeline: {{ mode: pull, epochs: {epochs}, batch_size: 64, prefetch_depth: {depth}, device: cuda{', threads: %d' % threads if threads else ''} }}
nodes:
  - {{ name: load, type: memory, params: {{ batches: {batches}, sample_shape: [784], dtype: float32, pin: true }} }}
  - {{ name: stage, type: pinned_staging, concurrency: 2 }}
  - {{ name: upload, type: cuda_upload }}
"""
    p = flowfeed.Pipeline(cfg)
    if variant == "cpp":
        r = p.run_pull_loop(); p.close(); return r["batches_per_second"]
    torch.cuda.synchronize(); t0 = time.perf_counter(); n = 0
    for batch in p:
        if variant == "dlpack":
            x = torch.from_dlpack(batch["x"]); del x
        elif variant == "capsule":
            c = batch["x"]; del c
        batch.release(); n += 1
    torch.cuda.synchronize(); r = n / (time.perf_counter() - t0); p.close(); return r

if what in ("small", "all"):
    for v in ("cpp", "release", "capsule", "dlpack"):
        for d in (8, 16):
            print("small", v, "depth", d, round(small(v, depth=d)), flush=True)
    print("small dlpack threads4", round(small("dlpack", threads=4)), flush=True)
