#!/usr/bin/env python3
"""Import circles of a Rust crate, file by file.

Usage: python3 tools/import_cycles.py crates/engine/src [--folders]

Every `crate::a::b` path in a file (use statements and inline paths, comments and string
literals stripped) is an edge from that file to the file that defines module `a::b` (or `a`, the
longest prefix that is a module file). The strongly connected components with more than one
file are the import circles; each is printed with the folders it spans. Exit status 1 when a
circle spans more than one module folder (the engine's rule, issue 49), 0 otherwise.
"""

import re
import sys
from pathlib import Path


def strip(src: str) -> str:
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = re.sub(r'r#*"(?:.|\n)*?"#*', '""', src)
    src = re.sub(r'"(?:\\.|[^"\\])*"', '""', src)
    return src


def module_of(root: Path, f: Path) -> tuple:
    rel = f.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def expand_use(body: str) -> list:
    """`a::{b, c::{d}}` -> [a::b, a::c::d] (paths only, aliases dropped)."""
    body = body.strip()
    m = re.match(r"^([\w:]*?)\{(.*)\}$", body, flags=re.S)
    if not m:
        return [re.split(r"\s+as\s+", body)[0].strip()]
    prefix, inner = m.group(1), m.group(2)
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    out = []
    for it in items:
        it = it.strip()
        if it:
            out += [prefix + p for p in expand_use(it)]
    return out


def main() -> int:
    root = Path(sys.argv[1])
    files = sorted(root.rglob("*.rs"))
    mods = {module_of(root, f): f for f in files}
    edges = {f: set() for f in files}
    for f in files:
        src = strip(f.read_text())
        me = module_of(root, f)
        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", src):
            paths += expand_use(m.group(1))
        paths += re.findall(r"\bcrate::[\w:]+", src)
        paths += ["super::" + p for p in re.findall(r"\bsuper::([\w:]+)", src)]
        paths += ["self::" + p for p in re.findall(r"\bself::([\w:]+)", src)]
        for p in paths:
            p = p.strip()
            if p.startswith("crate::"):
                segs = p[len("crate::"):].split("::")
            elif p.startswith("super::"):
                segs = list(me[:-1]) + p[len("super::"):].split("::")
            elif p.startswith("self::") and f.name in ("mod.rs", "lib.rs"):
                segs = list(me) + p[len("self::"):].split("::")
            else:
                continue
            for n in range(len(segs), 0, -1):
                t = mods.get(tuple(segs[:n]))
                if t is not None:
                    if t != f:
                        edges[f].add(t)
                    break
    # Tarjan's strongly connected components.
    index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            sccs.append(comp)

    for v in files:
        if v not in index:
            visit(v)
    bad = 0
    circles = [c for c in sccs if len(c) > 1]
    for c in sorted(circles, key=len, reverse=True):
        folders = sorted({str(p.parent.relative_to(root)) or "." for p in c})
        spans = len(folders) > 1
        bad += spans
        print(f"{'SPANS' if spans else 'within'} {len(c)} files, folders {folders}: "
              + ", ".join(sorted(str(p.relative_to(root)) for p in c)))
    print(f"{len(files)} files, {len(circles)} circles, {bad} spanning more than one folder")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
