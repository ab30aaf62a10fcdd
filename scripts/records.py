"""The results records (docs/results/records.json): one current record per benchmark scenario.

A record holds what a run measured and how: figure, unit, baseline, ratio (figure / baseline),
target, command, date (UTC, YYYY-MM-DD), build (git commit) and machine. A record measured on
several machine starts (or several runs) keeps them under `runs`, one entry each, with
`runs_over` saying what they span; the record's own figure is the latest of them. A field whose
value was not published is null and named in `missing`. `note` and `details` are optional.

write_record() replaces one scenario's record and keeps the others; the file is replaced
atomically (a temporary file beside it, fsync, rename), so a reader sees the old file or the new
one, never a half-written one. pipeline_bench --record (apps/pipeline_bench/record.cpp) writes
the same format."""
import datetime
import json
import os
import platform
import re
import socket
import subprocess
import tempfile

REQUIRED = ("figure", "unit", "baseline", "ratio", "target", "command", "date", "build", "machine")
PROVENANCE = ("command", "date", "build", "machine")


class RecordsError(Exception):
    pass


def load(path):
    """The records of `path` ({} when it does not exist); RecordsError when it is not a records file."""
    if not os.path.exists(path):
        return {}
    if not os.path.isfile(path):  # a FIFO would block the read; a device cannot be replaced
        raise RecordsError(f"{path}: not a regular file (a records file is replaced whole)")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as e:
        raise RecordsError(f"{path}:{e.lineno}:{e.colno}: not JSON ({e.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), dict):
        raise RecordsError(f"{path}: not a records file (no \"records\" object)")
    return data["records"]


def problems(name, record):
    """What is wrong with one record, as a list of messages (empty: nothing)."""
    out = []
    if not isinstance(record, dict):
        return [f"{name}: not an object"]
    for key in REQUIRED:
        if key not in record:
            out.append(f"{name}: no {key}")
    if out:
        return out
    if not isinstance(record["figure"], (int, float)):
        out.append(f"{name}: figure is not a number")
    missing = record.get("missing", [])
    for key in PROVENANCE:
        if record[key] is None and key not in missing:
            out.append(f"{name}: {key} is null but not listed in missing")
        if record[key] is not None and key in missing:
            out.append(f"{name}: {key} is listed in missing but has a value")
    figure, baseline, ratio = record["figure"], record["baseline"], record["ratio"]
    if isinstance(baseline, (int, float)) and baseline and isinstance(ratio, (int, float)):
        expected = figure / baseline
        if abs(ratio - expected) > max(0.0015, 0.02 * abs(expected)):
            out.append(f"{name}: ratio {ratio} is not figure / baseline ({expected:.4g})")
    for run in record.get("runs", []):
        if not isinstance(run.get("figure"), (int, float)):
            out.append(f"{name}: a run without a figure")
    if "runs" in record and not record.get("runs_over"):
        out.append(f"{name}: runs without runs_over (what they span)")
    return out


def check(records):
    """RecordsError listing every problem of every record."""
    found = [p for name in sorted(records) for p in problems(name, records[name])]
    if found:
        raise RecordsError("\n".join(found))


def dump(records):
    return json.dumps({"records": records}, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_record(path, name, record):
    """Replaces the record `name` of `path` (creating the file) and keeps the others."""
    write_records(path, {name: record})


def write_records(path, new):
    """Replaces the records named in `new` ({name: record}) in one replacement of the file."""
    found = [p for name in sorted(new) for p in problems(name, new[name])]
    if found:
        raise RecordsError("\n".join(found))
    records = load(path)
    records.update(new)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(dump(records))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def shell_word(word):
    """`word` as a shell reads it back (quoted when it holds more than plain characters)."""
    plain = re.fullmatch(r"[A-Za-z0-9_./=:,+@%-]+", word)
    return word if plain else "'" + word.replace("'", "'\\''") + "'"


def build_id():
    """The source tree's commit (short hash, `-dirty` when tracked files differ), or None."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short=7", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


def machine(device_name=None):
    """This machine in words: the device (when given), host cores, memory and CPU model."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = ""
    try:
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB memory"
    except (ValueError, OSError):
        pass
    host = f"{os.cpu_count()} host cores ({cpu}){memory}, {socket.gethostname()}"
    return f"{device_name}, {host}" if device_name else host


def make(figure, unit, baseline, command, target=None, build=None, machine_name=None, **extra):
    """A record of a run made now, by this process."""
    record = {
        "figure": figure, "unit": unit, "baseline": baseline,
        "ratio": figure / baseline if baseline else None,
        "target": target, "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "build": build if build is not None else build_id(),
        "machine": machine_name if machine_name is not None else machine(),
    }
    missing = [k for k in PROVENANCE if record[k] is None]
    if missing:
        record["missing"] = missing
    record.update(extra)
    return record
