#!/usr/bin/env bash
# Module layering: no import cycles between spillway's top-level modules, and the edges
# that would re-create the old ones are named and refused:
#   * src/policy imports no other spillway module (the sans-IO core is a leaf);
#   * src/net imports no other spillway module (HTTP primitives, shared by proxy and backends);
#   * src/backends never imports crate::proxy (backends only execute);
#   * src/config never imports crate::sim or crate::proxy (config owns its whole schema).
# An "import" is any `crate::<module>` path outside comments, in `use` or inline.
#
# Inside every module folder too (src/config, src/backends, src/sim, ...; and the policy
# crate in src/policy), the files are nodes and a path from one file to another is an
# edge: `crate::config::zones::X` or `super::zones::X` is an edge to zones.rs,
# `crate::config::X` or `super::X` for an item of mod.rs an edge to mod.rs, and in mod.rs
# `zones::X` or `self::zones::X` an edge to zones.rs. Any cycle fails, except in the
# folders of FOLDER_CYCLES_ALLOWED (each with its reason).
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

# Folder graphs: the files of one module folder as nodes.
FOLDER_CYCLES_ALLOWED = {}   # folder -> why its cycle is allowed (none is, today)
CRATES = {"src": [], "src/policy": []}      # crate root folder -> its module path


def module_path(folder):
    """The module path of a folder's mod.rs, or None when the folder is not a module."""
    for root, base in CRATES.items():
        if folder == root:
            return list(base)
    parent = os.path.dirname(folder)
    if not os.path.exists(os.path.join(folder, "mod.rs")):
        return None
    up = module_path(parent)
    return None if up is None else up + [os.path.basename(folder)]


def use_paths(code):
    """Every path of every `use` tree in `code` (braces expanded), with its offset."""
    out = []
    for m in re.finditer(r"\buse\s+([^;]*);", code):
        tree = re.sub(r"\s+", "", m.group(1))
        stack, prefix, cur = [], "", ""
        def flush(c):
            if c:
                out.append((prefix + c, m.start()))
        i = 0
        while i < len(tree):
            ch = tree[i]
            if ch == "{":
                stack.append(prefix)
                prefix = prefix + cur
                cur = ""
            elif ch == "}":
                flush(cur)
                cur = ""
                prefix = stack.pop() if stack else ""
            elif ch == ",":
                flush(cur)
                cur = ""
            else:
                cur += ch
            i += 1
        flush(cur)
    return [(re.sub(r"\bas\b.*$", "", t), pos) for t, pos in out]


def drop_test_modules(code):
    """`code` without its inline `#[cfg(test)] mod x { ... }` blocks (their `super::` is
    the file itself; tests import anything they test)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", code)
        if not m:
            return code
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        # Keep the line count (places of later edges stay right).
        code = code[:m.start()] + "\n" * code.count("\n", m.start(), i) + code[i:]


def strip(path):
    return [seg for seg in path.split("::") if seg and seg != "*"]


folder_bad = []
folder_cycles_seen = {}
for dirpath, dirnames, files in sorted(os.walk(root)):
    dirnames.sort()
    mp = module_path(dirpath)
    if mp is None or dirpath == root:
        continue
    stems = {os.path.splitext(f)[0] for f in files if f.endswith(".rs")}
    stems |= {d for d in dirnames if os.path.exists(os.path.join(dirpath, d, "mod.rs"))}
    is_crate_root = dirpath in CRATES
    nodes = stems - {"lib"} if not is_crate_root else stems
    fedges, fwhere = defaultdict(set), {}
    for f in sorted(files):
        if not f.endswith(".rs"):
            continue
        src = os.path.splitext(f)[0]
        p = os.path.join(dirpath, f)
        code = re.sub(r"//[^\n]*", "", open(p, encoding="utf-8").read())
        code = drop_test_modules(code)
        found = use_paths(code)
        found += [(m.group(0), m.start()) for m in
                  re.finditer(r"\b(?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+", code)]
        if src == "mod":
            found += [(m.group(0), m.start()) for m in
                      re.finditer(r"(?<![:\w])(?:%s)::[A-Za-z_*{]" % "|".join(sorted(stems - {"mod"})) , code)] if stems - {"mod"} else []
        for path, pos in found:
            segs = strip(path)
            dst = None
            if segs and segs[0] == "crate":
                rest = segs[1:]
                if rest[:len(mp)] != mp:
                    continue
                rest = rest[len(mp):]
                dst = (rest[0] if rest and rest[0] in nodes else "mod")
            elif segs and segs[0] == "super":
                if src == "mod" or (len(segs) > 1 and segs[1] == "super"):
                    continue
                dst = segs[1] if len(segs) > 1 and segs[1] in nodes else "mod"
            elif segs and segs[0] == "self":
                if src != "mod" or len(segs) < 2 or segs[1] not in nodes:
                    continue
                dst = segs[1]
            elif src == "mod" and segs and segs[0] in nodes:
                dst = segs[0]
            if dst is None or dst == src or dst not in nodes:
                continue
            fedges[src].add(dst)
            fwhere.setdefault((src, dst), f"{p}:{code.count(chr(10), 0, pos) + 1}")
    index.clear(); low.clear(); on.clear(); stack.clear(); counter[0] = 0
    before = len(sccs)
    edges_saved = edges
    edges = fedges
    for v in sorted(nodes):
        if v not in index:
            strong(v)
    edges = edges_saved
    for comp in sccs[before:]:
        detail = ", ".join(f"{a}->{b} ({fwhere[(a, b)]})" for a in comp for b in comp
                           if b in fedges.get(a, ()))
        msg = f"import cycle in {dirpath} between {', '.join(comp)}: {detail}"
        if dirpath in FOLDER_CYCLES_ALLOWED:
            folder_cycles_seen[dirpath] = True
        else:
            folder_bad.append(msg)
    del sccs[before:]
bad += folder_bad
for d, why in FOLDER_CYCLES_ALLOWED.items():
    if d not in folder_cycles_seen:
        bad.append(f"{d} is allowed cycles ({why}) but has none: drop it from FOLDER_CYCLES_ALLOWED")

if bad:
    print("module layering violated:", file=sys.stderr)
    for b in bad:
        print("  " + b, file=sys.stderr)
    sys.exit(1)
print("module layering: ok (" + "; ".join(f"{k} -> {', '.join(sorted(v))}" for k, v in sorted(edges.items())) + ")")
PY
