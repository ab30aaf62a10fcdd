"""Every relative link of README.md and docs/ leads somewhere: the file exists, and a #fragment
names a heading of the Markdown file it points into (GitHub's anchor of that heading)."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, in_code = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            elif not in_code and line.startswith("#"):
                found.add(anchor(line.lstrip("#")))
    return found


def broken_links():
    pages = [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    broken = []
    for page in pages:
        in_code = False
        with open(page, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for n, line in enumerate(lines, 1):
            if line.startswith("```"):
                in_code = not in_code
            if in_code:
                continue
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # https:, mailto:
                path, _, fragment = target.partition("#")
                full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                where = f"{os.path.relpath(page, ROOT)}:{n}: {target}"
                if not os.path.exists(full):
                    broken.append(f"{where}: no such file")
                elif fragment and full.endswith(".md") and fragment not in anchors(full):
                    broken.append(f"{where}: no heading with that anchor")
    return broken


def test_every_relative_link_leads_somewhere():
    assert broken_links() == []


def test_a_link_to_a_heading_that_went_away_is_found(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("see [it](docs/A.md#gone) and [b](docs/B.md)\n")
    (tmp_path / "docs" / "A.md").write_text("# A\n\n## Still here (really)\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", str(tmp_path))
    assert broken_links() == ["README.md:1: docs/A.md#gone: no heading with that anchor",
                              "README.md:1: docs/B.md: no such file"]
    assert anchor("## Still here (really)".lstrip("#")) == "still-here-really"
