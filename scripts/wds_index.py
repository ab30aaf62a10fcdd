#!/usr/bin/env python3
"""Writes the index file of WebDataset tar shards, in the format of DALI's wds2idx (v1.2), which
the `webdataset` loader's `index` param reads (docs/REMOTE.md): the sample index of a shard
without reading the shard, so shards named by URL can be fetched during the run.

    python3 scripts/wds_index.py train-000.tar train-001.tar ...     # writes train-000.idx, ...
    python3 scripts/wds_index.py --out-dir idx/ shards/*.tar

The file: `v1.2 N`, then one line per sample (consecutive members that share a key: the member
path up to the first dot of its file name), each member as `extension offset size name`
(`offset`: where its data starts in the tar). An index file that exists is not replaced unless
--force; each is written to a temporary name and renamed when complete."""
import argparse
import os
import sys
import tarfile
import tempfile


def index_name(shard, out_dir):
    """DALI's naming: the shard's path up to the first dot of its file name, then `.idx`."""
    folder, base = os.path.split(shard)
    dot = base.find(".", 1)
    stem = base if dot < 0 else base[:dot]
    return os.path.join(out_dir if out_dir is not None else folder, stem + ".idx")


def split_key(name):
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    return (name, "") if dot < 0 else (name[:dot], name[dot + 1 :])


def samples_of(shard):
    """The shard's samples: lists of (extension, data offset, size, name), in archive order."""
    samples, key = [], None
    with tarfile.open(shard, mode="r:") as tar:
        for m in tar:
            if not m.isreg():
                continue
            if any(c.isspace() for c in m.name):
                raise ValueError(f"member '{m.name}' has a space in its name, which the index "
                                 "format cannot hold")
            k, extension = split_key(m.name)
            if k != key:
                samples.append([])
                key = k
            samples[-1].append((extension or "-", m.offset_data, m.size, m.name))
    return samples


def write_index(shard, path, force):
    if os.path.lexists(path) and not force:
        raise FileExistsError(f"{path} exists (--force replaces it)")
    samples = samples_of(shard)
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".wds_index-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"v1.2 {len(samples)}\n")
            for sample in samples:
                f.write(" ".join(f"{e} {o} {s} {n}" for e, o, s, n in sample) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return len(samples)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shards", nargs="+", help="tar shards")
    p.add_argument("--out-dir", help="where the index files go (default: beside each shard)")
    p.add_argument("--force", action="store_true", help="replace index files that exist")
    a = p.parse_args()
    for shard in a.shards:
        path = index_name(shard, a.out_dir)
        try:
            n = write_index(shard, path, a.force)
        except (OSError, ValueError, tarfile.TarError) as e:
            print(f"wds_index: {shard}: {e}", file=sys.stderr)
            return 1
        print(f"{path}: {n} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
