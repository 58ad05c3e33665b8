#!/usr/bin/env python3
"""Print a crate's module import graph, from the code, and fail on a circle.

    scripts/modgraph.py [crates/engine/src] [--dot]

A node is a top-level module of the crate (`raid5/read.rs` counts as `raid5`). An edge
`a -> b` means some file of `a` names `crate::b` (in a `use` or in a path), or names an
item the crate root re-exports from `b` (`crate::Array` counts as `array`). Lines inside
`#[cfg(test)]` modules count too: a test that reaches back is still a reach back. Exit
status 1 when the graph has a circle, and the circles are printed.
"""

import os
import re
import sys


def top_module(src, path):
    rel = os.path.relpath(path, src)
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def names_in_use_groups(text):
    """Top-level names reached by `use crate::{a, b::c}` groups."""
    out = set()
    for m in re.finditer(r"\bcrate::\{", text):
        depth, i = 1, m.end()
        start = i
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        body = text[start : i - 1]
        # Only the names at the group's own level: drop nested groups.
        flat, depth = [], 0
        for ch in body:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif depth == 0:
                flat.append(ch)
        for part in "".join(flat).split(","):
            name = part.strip().split("::")[0].split(" as ")[0].strip()
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                out.add(name)
    return out


def root_reexports(src, modules):
    """Names the crate root re-exports (`pub use module::{A, b}`), mapped to their module,
    so that `crate::A` counts as an import of that module."""
    out = {}
    lib = os.path.join(src, "lib.rs")
    if not os.path.exists(lib):
        return out
    text = strip_comments(open(lib, encoding="utf-8").read())
    for m in re.finditer(r"pub\s+use\s+([a-z_][a-z0-9_]*)((?:::[a-z_][a-z0-9_]*)*)::(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)", text):
        module = m.group(1)
        if module not in modules:
            continue
        items = m.group(3).strip("{}")
        for item in items.split(","):
            name = item.strip().split(" as ")[-1].strip()
            if name:
                out[name] = module
    return out


def graph(src):
    modules = set()
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs"):
                p = os.path.join(root, n)
                m = top_module(src, p)
                if m in ("lib", "main"):
                    continue
                modules.add(m)
                files.setdefault(m, []).append(p)
    edges = {m: set() for m in modules}
    reexported = root_reexports(src, modules)
    for m, paths in files.items():
        for p in paths:
            text = strip_comments(open(p, encoding="utf-8").read())
            found = set(re.findall(r"\bcrate::([A-Za-z_][A-Za-z0-9_]*)", text))
            found |= names_in_use_groups(text)
            found = {reexported.get(d, d) if d not in modules else d for d in found}
            edges[m] |= {d for d in found if d in modules and d != m}
    return edges


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    src = args[0] if args else "crates/engine/src"
    edges = graph(src)
    if "--dot" in sys.argv:
        print("digraph modules {")
        for m in sorted(edges):
            for d in sorted(edges[m]):
                print(f'  "{m}" -> "{d}";')
        print("}")
    else:
        for m in sorted(edges):
            print(f"{m} -> {' '.join(sorted(edges[m]))}")
    found = cycles(edges)
    if found:
        print(f"\n{len(found)} circle(s):", file=sys.stderr)
        for comp in found:
            print("  " + " <-> ".join(comp), file=sys.stderr)
        sys.exit(1)
    print(f"\n{len(edges)} modules, no circle", file=sys.stderr)


if __name__ == "__main__":
    main()
