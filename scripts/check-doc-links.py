#!/usr/bin/env python3
"""Check the manual's links: every relative link and #anchor in README.md, docs/*.md and
the mdBook pages under docs/src/ points at a file of the repository, and an anchor at a
heading of the Markdown file it names; every page under docs/src/ is in SUMMARY.md and
every page SUMMARY.md lists exists, once.

Anchors are the ids mdBook (and GitHub) give headings: lower case, letters, digits, `-`
and `_` kept, spaces turned into `-`, everything else dropped; a repeated heading gets
`-1`, `-2`, ... Links inside code (fenced blocks, `inline code`) are not links. External
links (`https:`, `mailto:`) are not fetched.

Usage: scripts/check-doc-links.py   (from anywhere; exit status 1 names every broken link
as file:line: target: why)
"""
import os
import re
import sys

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), ".."))
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def slug(text):
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return "".join(c if (c.isalnum() or c in "_-") else "-" if c.isspace() else "" for c in text)


def lines_outside_code(text):
    """(line number, line) for every line outside fenced code, inline code blanked."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * 3
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            yield n, re.sub(r"`+[^`]*`+", "``", line)


_anchors = {}


def anchors(path):
    if path not in _anchors:
        ids = set()
        # From the raw lines: a heading's inline code counts for its id.
        with open(path, encoding="utf-8") as f:
            fence = None
            seen = {}
            for line in f.read().split("\n"):
                m = re.match(r"^\s*(```+|~~~+)", line)
                if m:
                    fence = None if fence else m.group(1)
                    continue
                if fence:
                    continue
                m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
                if m:
                    s = slug(m.group(2))
                    k = seen.get(s, 0)
                    seen[s] = k + 1
                    ids.add(s if k == 0 else f"{s}-{k}")
        _anchors[path] = ids
    return _anchors[path]


def markdown_files():
    files = [os.path.join(ROOT, "README.md")]
    docs = os.path.join(ROOT, "docs")
    for dirpath, dirnames, names in os.walk(docs):
        dirnames[:] = [d for d in dirnames if d != "book"]
        files += [os.path.join(dirpath, n) for n in names if n.endswith(".md")]
    return sorted(files)


def main():
    problems = []
    for path in markdown_files():
        rel = os.path.relpath(path, ROOT)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for n, line in lines_outside_code(text):
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                where = f"{rel}:{n}: {target}"
                if not os.path.realpath(dest).startswith(ROOT):
                    problems.append(f"{where}: points outside the repository")
                    continue
                if not os.path.exists(dest):
                    problems.append(f"{where}: no such file")
                    continue
                if anchor:
                    if not dest.endswith(".md"):
                        problems.append(f"{where}: an anchor into a file that is not Markdown")
                    elif anchor not in anchors(dest):
                        problems.append(f"{where}: no heading with the id `{anchor}` in {os.path.relpath(dest, ROOT)}")
    # SUMMARY.md lists every page, and every page it lists exists.
    src = os.path.join(ROOT, "docs", "src")
    summary = os.path.join(src, "SUMMARY.md")
    listed = {}
    with open(summary, encoding="utf-8") as f:
        for n, line in lines_outside_code(f.read()):
            for m in LINK.finditer(line):
                page = os.path.normpath(os.path.join(src, m.group(1).partition("#")[0]))
                if page in listed:
                    # mdbook refuses a summary that lists one file twice.
                    problems.append(f"docs/src/SUMMARY.md:{n}: {os.path.relpath(page, ROOT)} is listed twice (first on line {listed[page]})")
                else:
                    listed[page] = n
    for dirpath, _, names in os.walk(src):
        for name in names:
            p = os.path.normpath(os.path.join(dirpath, name))
            if name.endswith(".md") and p != summary and p not in listed:
                problems.append(f"{os.path.relpath(p, ROOT)}: a page that docs/src/SUMMARY.md does not list")
    for p in problems:
        print(p)
    print(f"check-doc-links: {len(markdown_files())} files, {len(problems)} broken", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
