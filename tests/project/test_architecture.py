"""The layout's rules, checked on the source: no import cycles, leaves stay leaves, the engine knows no HTTP or
scheduler, and no source file is over 500 lines. Imports are read with `ast` (lazy imports inside functions
count too: a cycle through a function body is still a cycle)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from _testpaths import REPO

ROOT = REPO
PACKAGES = ("localrt", "gguf_io", "quant", "simd_kernels", "modelfile", "store")
LEAVES = ("gguf_io", "quant", "modelfile", "store")  # never import localrt
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    mods = {}
    for top in PACKAGES:
        for p in (ROOT / top).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in mods:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name and not name.startswith(t + "."):  # a module may import its own package
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return defaultdict(set, {name: _imports(name, p, mods) for name, p in mods.items()})


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in list(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_one():
    assert _cycles(defaultdict(set, {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})) == [["a", "b", "c"]]


def test_leaves_never_import_localrt():
    bad = {
        m: sorted(t for t in deps if t.startswith("localrt"))
        for m, deps in _graph().items()
        if m.split(".")[0] in LEAVES + ("simd_kernels",)
    }
    assert {m: d for m, d in bad.items() if d} == {}


def test_the_engine_knows_no_http_scheduler_or_distribution():
    above = ("localrt.serve", "localrt.runtime", "localrt.distribution", "localrt.cli", "localrt.models")
    bad = {
        m: sorted(t for t in deps if t.startswith(above))
        for m, deps in _graph().items()
        if m.startswith(("localrt.engine", "localrt.api"))
    }
    assert {m: d for m, d in bad.items() if d} == {}


def test_no_source_file_over_500_lines():
    files = [p for top in PACKAGES for p in (ROOT / top).rglob("*.py")] + [ROOT / "cli.py"]
    long = {
        str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}
