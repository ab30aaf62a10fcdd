#!/usr/bin/env bash
# Warm .npy files to the GPU by row size and order: `io: mmap` (the loader copies rows out of the
# page cache into pinned buffers), `io: mmap, pin: true` (the upload copies runs of rows of
# 512 KiB or more straight from the page-locked mapping) and `io: pread`, in order and shuffled.
# Each file is 1 GiB of uint8 rows (4 KiB, 16 KiB, 64 KiB, 512 KiB), read into the page cache
# first; batches of 32 MiB, 16 loaders, depth 32, 3 epochs; prints the runner's GB/s uploaded.
#   scripts/bench_npy_rows.sh [RUNNER] [DIR]
# RUNNER: pipeline_runner (default build/apps/pipeline_runner/pipeline_runner); DIR: where the
# files go (default /var/tmp/flowfeed_npy_rows, 4 GiB). Needs python3 with numpy and a GPU.
set -euo pipefail
runner=${1:-build/apps/pipeline_runner/pipeline_runner}
dir=${2:-/var/tmp/flowfeed_npy_rows}
mkdir -p "$dir"
rows=(4096 16384 65536 524288)
python3 - "$dir" "${rows[@]}" <<'PY'
import sys
import numpy as np
out = sys.argv[1]
for row in map(int, sys.argv[2:]):
    n = (1 << 30) // row
    x = np.lib.format.open_memmap(f"{out}/r{row}.npy", mode="w+", dtype=np.uint8, shape=(n, row))
    x[:] = 7
    x.flush()
    del x
    np.save(f"{out}/r{row}-y.npy", (np.arange(n) % 10).astype(np.int32))
PY
for row in "${rows[@]}"; do
  cat "$dir/r$row.npy" >/dev/null  # into the page cache
  for shuffle in false true; do
    for io in "mmap" "mmap, pin: true" "pread"; do
      cat >"$dir/run.yaml" <<YAML
pipeline: { epochs: 3, batch_size: $(((32 << 20) / row)), prefetch_depth: 32, device: cuda }
sampler: { shuffle: $shuffle }
nodes:
  - { name: load, type: npy, concurrency: 16, params: { features: $dir/r$row.npy, labels: $dir/r$row-y.npy, io: $io } }
  - { name: stage, type: pinned_staging }
  - { name: upload, type: cuda_upload }
  - { name: train, type: device_discard }
YAML
      echo "rows of $row bytes, shuffle: $shuffle, io: $io: $("$runner" "$dir/run.yaml" 2>&1 |
        grep -o '[0-9.]* GB/s uploaded')"
    done
  done
done
