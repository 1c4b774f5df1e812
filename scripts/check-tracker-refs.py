#!/usr/bin/env python3
"""Code, tests, docs and errors name behaviours, never a tracker's numbers.

Scans every tracked text file (CHANGELOG.md and recorded test data excepted) for
"issue N", "item N" and `itemN_` test names, also when a comment wraps between the word
and the number. Prints file:line for each and exits 1 when there is any.
"""
import re
import subprocess
import sys

PAT = re.compile(r"\b(issues?|items?)\s*\n?\s*(?://[!/]?|#|\*|>)?\s*#?\d+\b|\bitem\d+_", re.I)
SKIP = ("CHANGELOG.md",)


def main():
    files = subprocess.check_output(["git", "ls-files"], text=True).split("\n")
    found = 0
    for f in files:
        if not f or f in SKIP or f.startswith("tests/data/"):
            continue
        try:
            text = open(f, encoding="utf-8").read()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        for m in PAT.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            print(f"{f}:{line}: {m.group(0)!r} — name the behaviour, not a tracker number")
            found += 1
    print(f"check-tracker-refs: {found} found", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
