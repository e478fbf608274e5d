#!/usr/bin/env python3
"""Prints the crate's module import graph: every `crate::` path a file in src/
names (in `use` items and inline), resolved to the file of the module it
lands in, then every import circle (strongly connected set of files) and the
largest files. `--check` exits non-zero when there is a circle."""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(__file__), "..", "src")


def module_of(path):
    rel = os.path.relpath(path, SRC)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib"):
        rel = rel[:-1]
    return tuple(rel)


files = {}
for root, _, names in os.walk(SRC):
    for n in names:
        if n.endswith(".rs"):
            p = os.path.join(root, n)
            files[module_of(p)] = p


# Names the lib root re-exports (`pub use crate::a::b::{C, D}`), so that
# `crate::C` counts as an import of the module that defines it.
ROOT = {}


def resolve(parts):
    # The longest prefix of the path that is a module with a file.
    for i in range(len(parts), 0, -1):
        if tuple(parts[:i]) in files:
            return tuple(parts[:i])
    if len(parts) == 1 and parts[0] in ROOT:
        return ROOT[parts[0]]
    return ()


def expand(tree, prefix):
    """Expands a use tree `a::{b, c::{d}}` into paths."""
    tree = tree.strip()
    out = []
    depth, start, items = 0, 0, []
    m = re.match(r"^(.*?)\{(.*)\}$", tree, re.S)
    if not m:
        return [prefix + [x for x in tree.split("::") if x and x != "self"]]
    head = [x for x in m.group(1).split("::") if x]
    body = m.group(2)
    for i, ch in enumerate(body):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    items.append(body[start:])
    for it in items:
        if it.strip():
            out += expand(it, prefix + head)
    return out


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(l.split("//")[0] for l in text.splitlines())


lib = strip_comments(open(os.path.join(SRC, "lib.rs")).read())
for m in re.finditer(r"\bpub use\s+crate::(.*?);", lib, re.S):
    for parts in expand(m.group(1), []):
        parts = [p.split(" as ")[0].strip() for p in parts]
        if len(parts) > 1:
            ROOT[parts[-1]] = resolve(parts[:-1])

edges = {}
for mod, path in files.items():
    text = strip_comments(open(path).read())
    # `#[cfg(test)] mod tests` blocks import freely; leave tests out.
    text = text.split("#[cfg(test)]\nmod tests")[0]
    targets = set()
    for m in re.finditer(r"\buse\s+crate::(.*?);", text, re.S):
        for parts in expand(m.group(1), []):
            parts = [p.split(" as ")[0].strip() for p in parts]
            targets.add(resolve(parts))
    for m in re.finditer(r"(?<!use )\bcrate::((?:\w+::)*\w+)", text):
        targets.add(resolve(m.group(1).split("::")))
    for m in re.finditer(r"\bsuper::((?:\w+::)*\w+)", text):
        base = list(mod[:-1]) if not path.endswith("mod.rs") else list(mod[:-1])
        targets.add(resolve(base + m.group(1).split("::")))
    targets.discard(())
    targets.discard(mod)
    # A module importing its own children is structure, not an arrow up.
    edges[mod] = {t for t in targets if t[: len(mod)] != mod or not mod}


def name(m):
    return "::".join(m) or "lib"


def sccs(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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

    for v in graph:
        if v not in index:
            visit(v)
    return out


# The lib root re-exports everything; it is the top, not part of a circle.
graph = {m: {t for t in ts if m and t} for m, ts in edges.items() if m}
if "--quiet" not in sys.argv:
    for m in sorted(graph):
        print(f"{name(m):28} -> {', '.join(sorted(name(t) for t in graph[m]))}")
circles = sccs(graph)
print(f"\n{len(circles)} import circle(s) among {len(files)} files")
for c in circles:
    print("  circle: " + " <-> ".join(name(m) for m in c))
if not circles:
    # Without a circle every module has a floor: one above the highest
    # module it imports (a module importing nothing is on floor 0), so no
    # import runs from a lower floor to a higher one.
    floor = {}

    def floor_of(m):
        if m not in floor:
            floor[m] = 1 + max((floor_of(t) for t in graph.get(m, ()) if t in graph), default=-1)
        return floor[m]

    for m in graph:
        floor_of(m)
    top = max(floor.values(), default=0)
    print(f"{top + 1} floors (a module's floor: one above the highest module it imports):")
    for f in range(top + 1):
        print(f"  {f:2}: " + ", ".join(sorted(name(m) for m in graph if floor[m] == f)))
sizes = sorted(((sum(1 for _ in open(p)), os.path.relpath(p, os.path.join(SRC, ".."))) for p in files.values()), reverse=True)
print("largest files: " + ", ".join(f"{p} {n}" for n, p in sizes[:5]))
if "--check" in sys.argv and circles:
    sys.exit(1)
