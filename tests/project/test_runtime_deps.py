"""Every package the daemon and the CLI import at run time is a runtime dependency, not only an extra's.

The README's first command installs `localrt` with no extras: a runtime module that imports a package only
`[dev]` brings (jsonschema once did) kills the daemon on a fresh machine while every test passes. This reads
each runtime module's imports with `ast`, maps them to their distributions, and requires each to be in the
closure of `[project] dependencies`. Imports inside `try: ... except ImportError` are optional by
construction (readline, msvcrt); the only other exception is the `cuda` extra's CuPy, which the code reaches
only after localrt.engine.backends.devices has probed for it."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path
from _testpaths import REPO

ROOT = REPO
FIRST_PARTY = {"localrt", "gguf_io", "quant", "simd_kernels", "modelfile", "store", "cli"}
RUNTIME_SOURCES = ["cli.py", *FIRST_PARTY - {"cli"}]
OPTIONAL_EXTRA_IMPORTS = {"cupy": "cuda"}  # top-level module -> the extra that provides it


def _requirement_name(req: str) -> str:
    return re.split(r"[ ;<>=!~\[(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _runtime_closure() -> set[str]:
    """Distribution names reachable from localrt's dependencies, extras excluded at every level."""
    seen: set[str] = set()
    todo = [_requirement_name(r) for r in md.requires("localrt") or [] if "extra ==" not in r]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo.extend(_requirement_name(r) for r in reqs if "extra ==" not in r)
    return seen


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside the body of a try whose handlers catch ImportError / ModuleNotFoundError (or everything)."""
    child, p = node, parents.get(node)
    while p is not None:
        if isinstance(p, ast.Try) and child in p.body:
            for h in p.handlers:
                names = [h.type] if not isinstance(h.type, ast.Tuple) else list(h.type.elts)
                if h.type is None or any(
                    getattr(n, "id", None) in ("ImportError", "ModuleNotFoundError", "Exception") for n in names
                ):
                    return True
        child, p = p, parents.get(p)
    return False


def _imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [node.module]
        else:
            continue
        for m in mods:
            yield m.split(".")[0], node.lineno, _guarded(node, parents)


def _runtime_files() -> list[Path]:
    files: list[Path] = []
    for src in RUNTIME_SOURCES:
        p = ROOT / src
        files.extend([p] if p.is_file() else sorted(p.rglob("*.py")))
    return files


def test_runtime_imports_are_runtime_dependencies():
    closure = _runtime_closure()
    owners = md.packages_distributions()
    bad = []
    for path in _runtime_files():
        for top, line, guarded in _imports(path):
            if top in FIRST_PARTY or top in sys.stdlib_module_names or guarded:
                continue
            if top in OPTIONAL_EXTRA_IMPORTS:
                continue
            dists = {d.lower().replace("_", "-") for d in owners.get(top, [])}
            if not dists & closure:
                bad.append(
                    f"{path.relative_to(ROOT)}:{line} imports {top} ({', '.join(sorted(dists)) or 'not installed'})"
                )
    assert not bad, "runtime modules import packages that are not runtime dependencies:\n" + "\n".join(bad)


def test_the_check_sees_an_extra_only_import(tmp_path):
    """The checker itself: an unguarded import of a dev-only package is found, a guarded one is not."""
    (tmp_path / "m.py").write_text("import jsonschema_nope\ntry:\n    import readline\nexcept ImportError:\n    pass\n")
    found = list(_imports(tmp_path / "m.py"))
    assert found == [("jsonschema_nope", 1, False), ("readline", 3, True)]
    assert "pytest" not in _runtime_closure()  # dev extra only
    assert "numpy" in _runtime_closure()
