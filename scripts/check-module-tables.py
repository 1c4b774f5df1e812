#!/usr/bin/env python3
"""Module docs that list files stay true.

For every `lib.rs`, `main.rs` and `mod.rs` under src/ (the policy crate's `mod.rs` too),
each submodule it declares (`mod x;` / `pub mod x;`, test-only modules excepted) must be
named in its `//!` module doc — as [`x`], `x`, `x.rs` or `x/` — and every `x.rs` the doc
names must exist beside it. Run from anywhere; prints one line per problem and exits 1.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)


def declared(text):
    """Submodules declared in `text`, without those under #[cfg(test)]."""
    out = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = DECL.match(line)
        if not m:
            continue
        attrs = []
        j = i - 1
        while j >= 0 and lines[j].strip().startswith(("#[", "///", "//")):
            attrs.append(lines[j].strip())
            j -= 1
        if any(a.startswith("#[cfg(test") or a.startswith("#[cfg(all(test") for a in attrs):
            continue
        out.append((i + 1, m.group(1)))
    return out


def main():
    problems = []
    for dirpath, _, names in os.walk(os.path.join(ROOT, "src")):
        for name in names:
            if name not in ("lib.rs", "main.rs", "mod.rs"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, ROOT)
            text = open(path, encoding="utf-8").read()
            doc = "\n".join(l[3:] for l in text.split("\n") if l.startswith("//!"))
            for line, m in declared(text):
                spelled = (f"[`{m}`]", f"`{m}`", f"`{m}.rs`", f"`{m}/`", f"{m}.rs")
                if not any(s in doc for s in spelled):
                    problems.append(f"{rel}:{line}: module `{m}` is not named in the module doc's list")
            for f in sorted(set(re.findall(r"`(\w+)\.rs`", doc))):
                if f in ("lib", "main", "mod"):
                    continue
                if not os.path.exists(os.path.join(dirpath, f + ".rs")) and not os.path.isdir(os.path.join(dirpath, f)):
                    problems.append(f"{rel}: the module doc names `{f}.rs`, which is not in {os.path.relpath(dirpath, ROOT)}/")
    for p in problems:
        print(p)
    print(f"check-module-tables: {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
