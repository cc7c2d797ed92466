"""Windows (and other non-Linux) readiness, issue 46: the offline kit installs on Windows, so no runtime module may
use a Linux- or POSIX-only facility unguarded. This test reads every runtime source file and fails on such a use
(fcntl and friends, os.sysconf / confstr / fork / killpg ..., POSIX-only signals, madvise, glibc's malloc calls,
/proc paths) that is not inside a `try` catching the error it raises or an `if` on the platform or `hasattr`. The
few uses guarded otherwise are listed with why; the guarded paths are then run with the facility taken away."""

from __future__ import annotations

import ast
import os
from _testpaths import REPO


ROOTS = ["localrt", "simd_kernels", "store", "gguf_io", "quant", "modelfile", "cli.py"]
MODULES = {"fcntl", "msvcrt", "resource", "termios", "pwd", "grp", "tty", "pty"}
ATTRS = {
    ("os", a)
    for a in (
        "confstr",
        "sysconf",
        "getloadavg",
        "killpg",
        "setsid",
        "fork",
        "getuid",
        "geteuid",
        "sched_getaffinity",
        "sched_setaffinity",
        "getpgid",
        "O_NOFOLLOW",
        "O_DIRECTORY",
        "mkfifo",
        "chown",
        "statvfs",
    )
}
ATTRS |= {
    ("signal", a)
    for a in (
        "SIGKILL",
        "SIGHUP",
        "SIGUSR1",
        "SIGUSR2",
        "SIGQUIT",
        "SIGCHLD",
        "SIGPIPE",
        "SIGALRM",
        "alarm",
        "setitimer",
    )
}
METHODS = {"madvise", "malloc_trim", "mallopt"}
CATCHES = {
    "Exception",
    "BaseException",
    "OSError",
    "AttributeError",
    "ImportError",
    "ModuleNotFoundError",
    "ValueError",
    "NotImplementedError",
}
# (file, use): guarded by something this lexical check cannot see
GUARDED_ELSEWHERE = {
    ("localrt/engine/backends/heap.py", ".malloc_trim"): "runs only when _done, i.e. _glibc() found glibc",
    ("localrt/engine/backends/heap.py", ".mallopt"): "in _mallopt, which returns before it when _glibc() is None",
    ("localrt/engine/backends/resident.py", ".madvise"): "to_huge_pages returns first without MADV_HUGEPAGE",
    ("localrt/engine/backends/sysmem.py", "'/proc/meminfo'"): "a default argument, opened inside a try",
    ("simd_kernels/llvm_pages.py", "'/proc/self/smaps'"): "a default argument; release() catches OSError",
}


def _guarded(stack: list[ast.AST]) -> bool:
    for node in reversed(stack):
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                if handler.type is None:
                    return True
                kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
                if CATCHES & {getattr(k, "id", getattr(k, "attr", "")) for k in kinds}:
                    return True
        if isinstance(node, (ast.If, ast.IfExp)):
            test = ast.dump(node.test)
            if any(word in test for word in ("platform", "os.name", "'name'", "hasattr", "getattr")):
                return True
    return False


def _uses(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import) and MODULES & {a.name.split(".")[0] for a in node.names}:
        return "import " + ",".join(a.name for a in node.names)
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in MODULES:
        return f"from {node.module}"
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and (node.value.id, node.attr) in ATTRS:
            return f"{node.value.id}.{node.attr}"
        if node.attr in METHODS:
            return f".{node.attr}"
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/proc/"):
        return repr(node.value)
    return None


def _unguarded(tree: ast.AST, rel: str) -> list[tuple[int, str]]:
    found = []

    def walk(node: ast.AST, stack: list[ast.AST]) -> None:
        for child in ast.iter_child_nodes(node):
            use = _uses(child)
            if use and (rel, use) not in GUARDED_ELSEWHERE and not _guarded(stack + [node]):
                found.append((child.lineno, use))
            walk(child, stack + [node])

    walk(tree, [])
    return found


def _sources():
    for root in ROOTS:
        path = REPO / root
        yield from ([path] if path.suffix == ".py" else sorted(path.rglob("*.py")))


def test_no_unguarded_linux_only_use_in_the_runtime():
    bad = [
        f"{p.relative_to(REPO)}:{line}: {use}"
        for p in _sources()
        for line, use in _unguarded(ast.parse(p.read_text()), str(p.relative_to(REPO)))
    ]
    assert not bad, "unguarded platform-specific uses:\n" + "\n".join(bad)


def test_the_check_sees_an_unguarded_use():
    tree = ast.parse(
        "import os\nimport fcntl\nos.sysconf('x')\ntry:\n    os.confstr('y')\nexcept ValueError:\n"
        "    pass\nif hasattr(os, 'fork'):\n    os.fork()\n"
    )
    assert [use for _, use in _unguarded(tree, "x.py")] == ["import fcntl", "os.sysconf"]


# ---- the guarded paths, with the facility taken away ------------------------------------------------------------


def test_memory_without_sysconf_proc_or_windows(monkeypatch, tmp_path):
    from localrt.engine.backends import sysmem

    monkeypatch.delattr(sysmem.os, "sysconf")
    assert sysmem.physical_memory() == sysmem.GUESS
    assert sysmem.available_memory(str(tmp_path / "no-meminfo")) == sysmem.GUESS


def test_memory_from_proc_where_there_is_one(tmp_path):
    from localrt.engine.backends import sysmem

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemAvailable:    512 kB\n")
    assert sysmem.available_memory(str(meminfo)) == 512 * 1024


def test_glibc_only_calls_are_no_ops_elsewhere(monkeypatch):
    from localrt.engine.backends import heap
    from localrt.serve import malloc

    monkeypatch.setattr(heap, "_done", False)
    heap.release_freed_memory()  # nothing to call
    monkeypatch.delattr(malloc.os, "confstr")
    assert malloc.limit_arenas() is False
    malloc.release_after_big_body()


def test_llvm_pages_without_proc(monkeypatch):
    from simd_kernels import llvm_pages

    def no_proc(*_a, **_k):
        raise FileNotFoundError("/proc/self/smaps")

    monkeypatch.setattr(llvm_pages, "_ranges", None)
    monkeypatch.setattr(llvm_pages, "clean_mappings", no_proc)
    llvm_pages.release()
    assert llvm_pages._ranges == []


def test_madvise_is_a_no_op_where_ctypes_cannot_open_libc(monkeypatch):
    """On Windows ctypes.CDLL(None) raises TypeError: the madvise users (llvm_pages.release, the resident weights'
    page drop) return without raising, and the failed lookup is tried once, not on every call."""
    import ctypes

    import numpy as np

    from localrt.engine.backends import resident
    from simd_kernels import llvm_pages
    from simd_kernels.madvise import libc_madvise

    calls = []

    def windows_cdll(name, *a, **k):
        calls.append(name)
        raise TypeError("LoadLibrary() argument 1 must be str, not None")

    libc_madvise.cache_clear()
    try:
        monkeypatch.setattr(ctypes, "CDLL", windows_cdll)
        monkeypatch.setattr(llvm_pages, "_ranges", [(0, 4096)])
        llvm_pages.release()
        resident._drop_pages(np.zeros(1 << 16, dtype=np.uint8))
        assert libc_madvise() is None
        assert calls == [None]  # remembered after the first try
    finally:
        libc_madvise.cache_clear()  # the next caller looks up the real one


def test_the_daemon_lock_takes_the_windows_path_without_fcntl(monkeypatch, tmp_path):
    """Without fcntl the lock uses msvcrt.locking (a stand-in here, as Windows' own is not on this machine)."""
    import builtins
    import importlib
    import sys
    import types

    held: set[int] = set()

    def locking(fd, mode, nbytes):
        if mode == fake.LK_NBLCK:
            if fd in held:
                raise OSError(13, "busy")
            held.add(fd)
        else:
            held.discard(fd)

    fake = types.ModuleType("msvcrt")
    fake.LK_NBLCK, fake.LK_UNLCK, fake.locking = 2, 0, locking
    real_import = builtins.__import__

    def without_fcntl(name, *args, **kwargs):
        if name == "fcntl":
            raise ImportError("no fcntl here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setitem(sys.modules, "msvcrt", fake)
    monkeypatch.setattr(builtins, "__import__", without_fcntl)
    monkeypatch.delitem(sys.modules, "localrt.serve.lockfile", raising=False)
    lockfile = importlib.import_module("localrt.serve.lockfile")
    try:
        assert lockfile.fcntl is None
        fd = os.open(tmp_path / "l", os.O_RDWR | os.O_CREAT)
        assert lockfile._try_lock(fd) and not lockfile._try_lock(fd)  # a second claim is refused, not an error
        lockfile._unlock(fd)
        assert lockfile._try_lock(fd)
        os.close(fd)
    finally:
        monkeypatch.undo()
        sys.modules.pop("localrt.serve.lockfile", None)
        importlib.import_module("localrt.serve.lockfile")  # the real one again, for the tests after this one
