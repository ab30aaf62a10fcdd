"""scripts/results_table.py and scripts/records.py on a copy of the tree's README, BENCHMARKS.md
and records: a figure changed or added by hand is caught, with the file, the line and the fix."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "results_table.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import records  # noqa: E402


@pytest.fixture
def tree(tmp_path):
    """A root holding copies of what results_table.py reads and writes."""
    for name in ("README.md", "docs/BENCHMARKS.md", "docs/results/records.json",
                 "docs/results/scenarios.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    return tmp_path


def check(root):
    return subprocess.run([sys.executable, SCRIPT, "--check", "--root", str(root)],
                          capture_output=True, text=True)


def line_of(path, text):
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if text in line:
            return n, line
    raise AssertionError(f"{text!r} not in {path}")


def test_the_committed_tables_are_what_the_records_give():
    r = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def test_a_readme_figure_that_differs_from_its_record_fails(tree):
    readme = tree / "README.md"
    n, line = line_of(readme, "| 32 MiB batches, data set pinned in place | 55.12 GB/s |")
    readme.write_text(readme.read_text(encoding="utf-8").replace(line, line.replace("55.12", "56.12")),
                      encoding="utf-8")
    r = check(tree)
    assert r.returncode == 1
    generated = line
    edited = line.replace("55.12", "56.12")
    assert r.stderr == (f"README.md:{n}: differs from the table generated from "
                        f"docs/results/records.json:\n  committed: {edited}\n  generated: {generated}\n"
                        f"(run python3 scripts/results_table.py --write)\n")


def test_a_readme_figure_no_record_has_fails(tree):
    readme = tree / "README.md"
    text = readme.read_text(encoding="utf-8")
    readme.write_text(text.replace("## Documentation", "It reaches 61.5 GB/s.\n\n## Documentation"),
                      encoding="utf-8")
    n, _ = line_of(readme, "It reaches 61.5 GB/s.")
    r = check(tree)
    assert r.returncode == 1
    assert r.stderr == (f"README.md:{n}: '61.5 GB/s' is stated outside the table generated from "
                        f"docs/results/records.json (state figures only there)\n")


def test_a_changed_record_changes_both_tables(tree):
    path = tree / "docs/results/records.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["records"]["overhead"]["figure"] = 3.5
    data["records"]["overhead"]["ratio"] = 3.5 / 1.74
    path.write_text(json.dumps(data), encoding="utf-8")
    r = check(tree)
    assert r.returncode == 1
    assert r.stderr.startswith("docs/BENCHMARKS.md:")
    r = subprocess.run([sys.executable, SCRIPT, "--write", "--root", str(tree)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "| 3.5 µs per batch | a bare oneTBB chain: 1.74 µs per batch | 2.011 |" in \
        (tree / "README.md").read_text(encoding="utf-8")
    assert "| zero-work batches through 4 nodes (`overhead`) | 3.5 µs per batch |" in \
        (tree / "docs/BENCHMARKS.md").read_text(encoding="utf-8")
    assert check(tree).returncode == 0


def test_a_record_no_section_shows_is_refused(tree):
    path = tree / "docs/results/records.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["records"]["new_scenario"] = dict(data["records"]["overhead"])
    path.write_text(json.dumps(data), encoding="utf-8")
    r = check(tree)
    assert r.returncode == 1
    assert r.stderr == ("results_table.py: records no section of docs/results/scenarios.json shows: "
                        "new_scenario (add each to a section)\n")


def test_provenance_not_published_must_be_said(tree):
    path = tree / "docs/results/records.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["records"]["seed"]["build"] = None
    path.write_text(json.dumps(data), encoding="utf-8")
    r = check(tree)
    assert r.returncode == 1
    assert r.stderr == "results_table.py: seed: build is null but not listed in missing\n"
    data["records"]["seed"]["missing"] = ["build"]
    path.write_text(json.dumps(data), encoding="utf-8")
    subprocess.run([sys.executable, SCRIPT, "--write", "--root", str(tree)], check=True)
    assert "build not published" in (tree / "docs/BENCHMARKS.md").read_text(encoding="utf-8")


def test_a_ratio_that_is_not_figure_over_baseline_is_refused(tree):
    path = tree / "docs/results/records.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["records"]["seed"]["ratio"] = 1.2
    path.write_text(json.dumps(data), encoding="utf-8")
    r = check(tree)
    assert r.returncode == 1
    assert r.stderr == "results_table.py: seed: ratio 1.2 is not figure / baseline (1.011)\n"


def test_write_record_replaces_one_record_and_keeps_the_others(tree):
    path = str(tree / "docs/results/records.json")
    before = records.load(path)
    new = records.make(2.5, "us/batch", 1.25, "pipeline_bench overhead", build="abc1234",
                       machine_name="a test machine")
    records.write_record(path, "overhead", new)
    after = records.load(path)
    assert after["overhead"] == new
    assert after["overhead"]["ratio"] == 2.0
    del before["overhead"], after["overhead"]
    assert after == before
    assert sorted(os.listdir(tree / "docs/results")) == ["records.json", "scenarios.json"]


def test_a_failed_write_leaves_the_file_as_it_was(tree):
    path = tree / "docs/results/records.json"
    old = path.read_bytes()
    bad = records.make(1.0, "s", 1.0, "x", build="abc1234", machine_name="m", details={"x": object()})
    with pytest.raises(TypeError):
        records.write_record(str(path), "seed", bad)
    assert path.read_bytes() == old
    assert sorted(os.listdir(tree / "docs/results")) == ["records.json", "scenarios.json"]


def test_a_file_that_is_not_a_records_file_is_refused(tree):
    path = tree / "docs/results/records.json"
    path.write_text("{\"results\": []}\n", encoding="utf-8")
    with pytest.raises(records.RecordsError) as e:
        records.write_record(str(path), "seed", records.make(1.0, "s", 1.0, "x", build="b",
                                                            machine_name="m"))
    assert str(e.value) == f"{path}: not a records file (no \"records\" object)"
    assert path.read_text(encoding="utf-8") == "{\"results\": []}\n"


def test_a_fifo_is_refused_not_read(tmp_path):
    fifo = tmp_path / "records.json"
    os.mkfifo(fifo)
    with pytest.raises(records.RecordsError) as e:
        records.write_record(str(fifo), "seed", records.make(1.0, "s", 1.0, "x", build="b",
                                                            machine_name="m"))
    assert str(e.value) == f"{fifo}: not a regular file (a records file is replaced whole)"


def test_a_target_is_shown_with_the_runs_it_held_on(tree):
    subprocess.run([sys.executable, SCRIPT, "--write", "--root", str(tree)], check=True)
    text = (tree / "docs/BENCHMARKS.md").read_text(encoding="utf-8")
    # One run: not "met" without saying on how little; several: on how many.
    assert "| 0.999 | ≥ 0.95 × baseline: met on its one run | a |" in text
    assert "| 1.057 (1.031–1.087) | ≥ 0.9 × baseline: met on 4 of 4 | a |" in text
    path = tree / "docs/results/records.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    for run in data["records"]["storage_warm_mmap_pinned"]["runs"][1:]:
        run["ratio"] = 0.8
    path.write_text(json.dumps(data), encoding="utf-8")
    subprocess.run([sys.executable, SCRIPT, "--write", "--root", str(tree)], check=True)
    text = (tree / "docs/BENCHMARKS.md").read_text(encoding="utf-8")
    assert "≥ 0.9 × baseline: **not met** (1 of 4)" in text


def test_a_measured_figure_on_a_feature_page_fails(tree):
    page = tree / "docs" / "TRAINING.md"
    page.write_text("# Training\n\nThe target is 30,000 steps/s; the runner prints\n"
                    "`42,000 steps/s` and says \"1 body gives 242 batches/s\".\n\n"
                    "```\n45,464 steps/s\n```\n", encoding="utf-8")
    assert check(tree).returncode == 0
    page.write_text(page.read_text(encoding="utf-8") + "\nIt ran at 42,230 steps/s on the H200.\n",
                    encoding="utf-8")
    r = check(tree)
    assert r.returncode == 1
    assert r.stderr == ("docs/TRAINING.md:10: '42,230 steps/s' is a measured figure on a feature "
                        "page (link to its record in docs/BENCHMARKS.md, or its run log, instead)\n")
