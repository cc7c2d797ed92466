"""simd_kernels.warm: Numba's one-time target start-up can run ahead of, and beside, the first kernel call; a compile
still finds Numba's registries, without SciPy's BLAS probe."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from _testpaths import REPO

ROOT = REPO


def test_start_up_runs_once_and_beside_a_kernel_call_in_a_fresh_process():
    script = textwrap.dedent("""
        import sys
        import numpy as np
        from simd_kernels import ops, warm
        assert "numba.np.arraymath" not in sys.modules  # importing the kernels does not start the target
        thread = warm.init_target_in_background()
        x = np.arange(8, dtype=np.float32).reshape(1, 8)  # a kernel loads from cache while the start-up runs
        out = ops.rms_norm(x, np.ones(8, np.float32), 1e-6, np.empty_like(x))
        thread.join()
        assert warm._done.is_set()
        warm.init_target()  # a no-op now
        want = x / np.sqrt((x.astype(np.float64) ** 2).mean() + 1e-6)
        assert np.allclose(out, want, rtol=1e-6), (out, want)
        print("ok")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_numba_start_up_leaves_scipy_linalg_unimported_and_importable():
    script = textwrap.dedent("""
        import importlib.util, sys
        import numpy as np
        from numba import njit
        from simd_kernels import ops, warm
        warm.init_target()
        x = np.ones((1, 8), np.float32)
        ops.rms_norm(x, np.ones(8, np.float32), 1e-6, np.empty_like(x))
        assert njit(lambda a: a + 1)(1) == 2  # a compile: Numba's pipeline loads every registry of its target
        assert "numba.np.arraymath" in sys.modules and "scipy.linalg" not in sys.modules
        if importlib.util.find_spec("scipy") is not None:  # SciPy installed: still usable, Numba's np.dot too
            import scipy.linalg.cython_blas  # noqa: F401
            dot = njit(lambda a, b: np.dot(a, b))
            assert dot(np.ones(3), np.full(3, 2.0)) == 6.0
        print("ok")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_start_up_freezes_itself_out_of_the_collector_but_not_a_model_loaded_after_it(tmp_path):
    # The start-up state (imports, Numba's and LLVM's objects) is frozen (gc.freeze) as the start-up ends; a model
    # loaded afterwards is not, so that dropping it frees it: a frozen object caught in a reference cycle would never
    # be reclaimed.
    script = textwrap.dedent(f"""
        import gc, sys, weakref
        sys.path.insert(0, "tests")
        from fixtures.decoders import small, write_model
        from localrt import load_model
        write_model({str(tmp_path / "m.gguf")!r}, small())
        assert gc.get_freeze_count() == 0
        model = load_model({str(tmp_path / "m.gguf")!r}, num_ctx=64)  # runs the start-up first
        frozen = gc.get_freeze_count()
        assert frozen > 10_000, frozen
        assert any(o is model for o in gc.get_objects())  # the collector's generations hold it, not the frozen set
        assert len(list(model.generate(model.tokenize("hi"), {{"temperature": 0, "num_predict": 2}}))) >= 2
        ref = weakref.ref(model)
        del model
        gc.collect()
        assert ref() is None
        print("ok")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
