#!/usr/bin/env bash
# Module layering: no import cycles between spillway's top-level modules, and the edges
# that would re-create the old ones are named and refused:
#   * src/policy imports no other spillway module (the sans-IO core is a leaf);
#   * src/net imports no other spillway module (HTTP primitives, shared by proxy and backends);
#   * src/backends never imports crate::proxy (backends only execute);
#   * src/config never imports crate::sim or crate::proxy (config owns its whole schema).
# An "import" is any `crate::<module>` path outside comments, in `use` or inline.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - "$@" <<'PY'
import os, re, sys
from collections import defaultdict

root = "src"
tops = {os.path.splitext(n)[0] for n in os.listdir(root)
        if n.endswith(".rs") or os.path.isdir(os.path.join(root, n))}
tops -= {"lib", "main"}
edges = defaultdict(set)      # from -> {to}
where = {}                    # (from, to) -> first "file:line"
path_re = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
group_re = re.compile(r"\buse\s+crate::\{([^}]*)\}", re.S)
for dirpath, _, files in os.walk(root):
    for f in files:
        if not f.endswith(".rs"):
            continue
        p = os.path.join(dirpath, f)
        rel = os.path.relpath(p, root).split(os.sep)
        src = os.path.splitext(rel[0])[0]
        if src in ("lib", "main"):
            continue
        text = open(p, encoding="utf-8").read()
        # Drop comments (line and doc comments): links in docs are not imports.
        code = re.sub(r"//[^\n]*", "", text)
        found = [(m.group(1), m.start()) for m in path_re.finditer(code)]
        for m in group_re.finditer(code):
            for item in m.group(1).split(","):
                name = item.strip().split("::")[0].strip()
                if name:
                    found.append((name, m.start()))
        for dst, pos in found:
            if dst in tops and dst != src:
                edges[src].add(dst)
                where.setdefault((src, dst), f"{p}:{code.count(chr(10), 0, pos) + 1}")

forbidden = {
    "policy": tops - {"policy"},
    "net": tops - {"net"},
    "backends": {"proxy"},
    "config": {"sim", "proxy"},
}
bad = []
for src, dsts in sorted(forbidden.items()):
    for dst in sorted(edges.get(src, set()) & dsts):
        bad.append(f"src/{src} must not import crate::{dst} ({where[(src, dst)]})")

# Cycle search over the module graph (Tarjan's SCCs).
index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]
def strong(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in sorted(edges.get(v, ())):
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))
for v in sorted(tops):
    if v not in index:
        strong(v)
for comp in sccs:
    detail = ", ".join(f"{a}->{b} ({where[(a, b)]})" for a in comp for b in comp
                       if b in edges.get(a, ()))
    bad.append(f"import cycle between {', '.join(comp)}: {detail}")

if bad:
    print("module layering violated:", file=sys.stderr)
    for b in bad:
        print("  " + b, file=sys.stderr)
    sys.exit(1)
print("module layering: ok (" + "; ".join(f"{k} -> {', '.join(sorted(v))}" for k, v in sorted(edges.items())) + ")")
PY
