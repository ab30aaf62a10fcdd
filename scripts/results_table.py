#!/usr/bin/env python3
"""The figures' tables in docs/BENCHMARKS.md and README.md, generated from docs/results/records.json.

    python3 scripts/results_table.py --write    # rewrite the tables in place
    python3 scripts/results_table.py --check    # exit 1 when a committed table differs, or when
                                                # README states a figure outside its table

Each table sits between `<!-- records:ID -->` and `<!-- /records -->`; ID is a section of
docs/results/scenarios.json (which records it shows, in which order, and what each measures and
against what) or `readme`. Everything outside the markers is written by hand and left alone."""
import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import records as rec  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"(<!-- records:([a-z_]+) -->\n)(.*?)(<!-- /records -->)", re.S)
# A measured figure in prose: a number followed by a rate, bandwidth, time or multiple unit.
FIGURE = re.compile(r"\d[\d,.]*(?:\s?(?:GB/s|MB/s|M/s|/s\b|µs|us per|steps/s|images/s|windows/s|"
                    r"batches/s)|×)")


def number(x):
    if x is None:
        return "—"
    if abs(x) >= 1000:
        return f"{round(x):,}"
    return f"{x:.4g}"


def unit_text(unit):
    return {"us/batch": "µs per batch", "fraction": "", "of the run's batches": "of the run"}.get(
        unit, unit)


def quantity(x, unit):
    u = unit_text(unit)
    return f"{number(x)} {u}".rstrip()


def span(values):
    lo, hi = min(values), max(values)
    return f"{number(lo)}–{number(hi)}"


def figure_cell(r):
    text = quantity(r["figure"], r["unit"])
    if r.get("runs"):
        text += f"; {span([x['figure'] for x in r['runs']])} over {r['runs_over']}"
    return text


def ratio_cell(r):
    if r["ratio"] is None:
        return "—"
    text = number(r["ratio"])
    ratios = [x["ratio"] for x in r.get("runs", []) if x.get("ratio") is not None]
    if len(ratios) > 1:
        text += f" ({span(ratios)})"
    return text


def target_cell(r):
    t = r["target"]
    if not t:
        return ""
    bound = "≥" if t["bound"] == "at_least" else "≤"
    what = f"{number(t['value'])} × baseline" if t["of"] == "ratio" else quantity(t["value"], r["unit"])
    runs = [x for x in r.get("runs", []) if x.get("figure") is not None]
    if len(runs) > 1:
        met = sum(1 for x in runs if meets(t, x))
        return f"{bound} {what}: " + (f"met on {met} of {len(runs)}" if met >= 2 else
                                      f"**not met** ({met} of {len(runs)})")
    return f"{bound} {what}: " + ("met on its one run" if t["met"] else "**not met**")


def meets(target, run):
    """Whether one run meets the target (a ratio target needs the run's ratio)."""
    x = run.get("ratio") if target["of"] == "ratio" else run["figure"]
    if x is None:
        return False
    return x >= target["value"] if target["bound"] == "at_least" else x <= target["value"]


def baseline_cell(row, r):
    if r["baseline"] is None:
        return row["baseline"]
    return f"{row['baseline']}: {quantity(r['baseline'], r['unit'])}"


def provenance(r):
    def field(key, fmt):
        return fmt(r[key]) if r[key] is not None else f"{key} not published"
    return (field("date", str), field("build", lambda b: f"`{b}`"), field("machine", str),
            field("command", lambda c: f"`{c}`"))


def section_table(rows, records):
    """The table of one BENCHMARKS.md section, and under it each run's date, build, machine and
    command, lettered."""
    runs = []
    lines = ["| scenario | figure | baseline | ratio | target | run |", "|---|---|---|---|---|---|"]
    for row in rows:
        if row["record"] not in records:  # a scenario with no record yet
            lines.append(f"| {row['what']} (`{row['record']}`) | not measured yet | "
                         f"{row['baseline']} | | {row.get('target', '')} | |")
            continue
        r = records[row["record"]]
        key = provenance(r)
        if key not in runs:
            runs.append(key)
        letter = chr(ord("a") + runs.index(key))
        lines.append(f"| {row['what']} (`{row['record']}`) | {figure_cell(r)} | "
                     f"{baseline_cell(row, r)} | {ratio_cell(r)} | {target_cell(r)} | {letter} |")
    lines.append("")
    for i, (date, build, machine, command) in enumerate(runs):
        lines.append(f"- {chr(ord('a') + i)}: {date}, build {build}, {machine}: {command}")
    notes = [(row["record"], records[row["record"]]) for row in rows if row["record"] in records]
    for name, r in notes:
        extra = []
        if r.get("note"):
            extra.append(r["note"])
        for k, v in sorted(r.get("details", {}).items()):
            extra.append(f"{k.replace('_', ' ')} {v}")
        if r.get("runs"):
            extra.append("runs: " + "; ".join(run_text(x, r) for x in r["runs"]))
        if extra:
            lines.append(f"- `{name}`: " + "; ".join(extra))
    return "\n".join(lines) + "\n"


def run_text(run, r):
    label = f"start {run['start']}" if "start" in run else f"run {run.get('run')}"
    text = f"{label} (`{run['build']}`) {quantity(run['figure'], r['unit'])}"
    if run.get("baseline") is not None:
        text += f" against {quantity(run['baseline'], r['unit'])}"
    if run.get("command") and run["command"] != r["command"]:
        text += f" (`{run['command']}`)"
    return text


def readme_table(rows, records):
    lines = ["| scenario | flowfeed | baseline | ratio | measured |", "|---|---|---|---|---|"]
    for row in rows:
        r = records[row["record"]]
        date = r["date"] or "date not published"
        lines.append(f"| {row['what']} | {figure_cell(r)} | {baseline_cell(row, r)} | "
                     f"{ratio_cell(r)} | {date} |")
    return "\n".join(lines) + "\n"


def generate(text, scenarios, records, path):
    sections = {s["id"]: s["rows"] for s in scenarios["sections"]}

    def replace(m):
        ident = m.group(2)
        if ident == "readme":
            body = readme_table(scenarios["readme"], records)
        elif ident in sections:
            body = section_table(sections[ident], records)
        else:
            raise rec.RecordsError(f"{path}: no section '{ident}' in docs/results/scenarios.json")
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(replace, text)


def stray_figures(text, path):
    """Figures stated outside the generated tables: (line number, figure) for each."""
    out = []
    outside = BLOCK.sub(lambda m: m.group(1) + "\n" * m.group(3).count("\n") + m.group(4), text)
    in_code = False
    for n, line in enumerate(outside.split("\n"), 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for m in FIGURE.finditer(line):
            out.append((n, m.group(0)))
    return out


# A rate, bandwidth, time per batch or multiple on a feature page; a target or threshold
# ("≥ 1,000,000 windows/s", "under 20 µs") is no measurement, nor is an example in code or quotes.
PAGE_FIGURE = re.compile(r"\d[\d,.]*\s?(?:[kM]\s)?(?:GB/s|MB/s|M/s|images/s|windows/s|batches/s|steps/s|µs|/s\b)"
                         r"|\d[\d,.]*×(?!\d)")
THRESHOLD = re.compile(r"(target|≥|≤|at least|at most|under|above|below)[^.;:]*$")


def page_figures(path):
    """Measured figures a feature page states: (line number, figure) for each."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    kept, fence = [], False
    for line in lines:  # fenced code (at any indent) becomes blank, line numbers kept
        if line.lstrip().startswith("```"):
            fence = not fence
            kept.append("")
        else:
            kept.append("" if fence else line)
    text = "\n".join(kept)
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    text = re.sub(r"`[^`]*`", blank, text)           # inline code, also across a line break
    text = re.sub(r'"[^"\n]*(?:\n[^"\n]*)?"', blank, text)  # quoted messages
    out = []
    for m in PAGE_FIGURE.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        if THRESHOLD.search(text[max(start, m.start() - 60):m.start()]):
            continue
        out.append((text.count("\n", 0, m.start()) + 1, m.group(0)))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the tables in place")
    mode.add_argument("--check", action="store_true", help="exit 1 when a table differs")
    parser.add_argument("--root", default=ROOT, help="the source tree (default: this one)")
    args = parser.parse_args()
    records_path = os.path.join(args.root, "docs", "results", "records.json")
    try:
        records = rec.load(records_path)
        rec.check(records)
        with open(os.path.join(args.root, "docs", "results", "scenarios.json"), encoding="utf-8") as f:
            scenarios = json.load(f)
        shown = {row["record"] for s in scenarios["sections"] for row in s["rows"]}
        unknown = sorted({row["record"] for row in scenarios["readme"]} - set(records))
        if unknown:
            raise rec.RecordsError("the README's rows in docs/results/scenarios.json name records "
                                   f"that docs/results/records.json does not have: "
                                   f"{', '.join(unknown)}")
        unshown = sorted(set(records) - shown)
        if unshown:
            raise rec.RecordsError(f"records no section of docs/results/scenarios.json shows: "
                                   f"{', '.join(unshown)} (add each to a section)")
    except rec.RecordsError as e:
        print(f"results_table.py: {e}", file=sys.stderr)
        return 1
    failed = False
    for name in ("docs/BENCHMARKS.md", "README.md"):
        path = os.path.join(args.root, name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            new = generate(text, scenarios, records, name)
        except rec.RecordsError as e:
            print(f"results_table.py: {e}", file=sys.stderr)
            return 1
        if args.write and new != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
        elif args.check and new != text:
            old_lines, new_lines = text.split("\n"), new.split("\n")
            n = next(i for i, (a, b) in enumerate(zip(old_lines + [""], new_lines + [""])) if a != b)
            print(f"{name}:{n + 1}: differs from the table generated from "
                  f"docs/results/records.json:\n  committed: {old_lines[n] if n < len(old_lines) else ''}"
                  f"\n  generated: {new_lines[n] if n < len(new_lines) else ''}\n"
                  f"(run python3 scripts/results_table.py --write)", file=sys.stderr)
            failed = True
        if name == "README.md":
            if "<!-- records:readme -->" not in text:
                print(f"{name}: no <!-- records:readme --> table", file=sys.stderr)
                failed = True
            for n, figure in stray_figures(new, name):
                print(f"{name}:{n}: '{figure}' is stated outside the table generated from "
                      f"docs/results/records.json (state figures only there)", file=sys.stderr)
                failed = True
    for path in sorted(glob.glob(os.path.join(args.root, "docs", "*.md"))):
        if os.path.basename(path) == "BENCHMARKS.md":
            continue
        for n, figure in page_figures(path):
            print(f"docs/{os.path.basename(path)}:{n}: '{figure}' is a measured figure on a feature "
                  f"page (link to its record in docs/BENCHMARKS.md, or its run log, instead)",
                  file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
