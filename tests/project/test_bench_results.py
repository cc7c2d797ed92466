"""Benchmark results as data: bench/results/<benchmark>.jsonl records, the helper that appends them
(bench/results_log.py) and the table of the latest ones (bench/latest.py). Nothing here runs a benchmark."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _testpaths import REPO

ROOT = REPO
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
KEYS = {
    "benchmark",
    "date",
    "commit",
    "cpu_model",
    "cpu_flags",
    "threads",
    "cpus",
    "load",
    "results",
    "native",
    "source",
}


def _results_log():
    spec = importlib.util.spec_from_file_location("bench_results_log", BENCH / "results_log.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_results_are_jsonl_only():
    assert sorted(p.name for p in RESULTS.glob("*.json")) == []
    assert sorted(RESULTS.glob("*.jsonl"))


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.jsonl")), ids=lambda p: p.stem)
def test_every_record_has_the_fields(path):
    for record in _records(path):
        assert set(record) == KEYS
        assert record["benchmark"] == path.stem
        assert record["date"] is None or re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["date"])
        assert record["commit"] is None or re.fullmatch(r"[0-9a-f]{7,40}", record["commit"])
        flags = record["cpu_flags"]
        assert flags is None or (
            set(flags) == {"avx2", "avx512", "vnni"} and all(v is None or isinstance(v, bool) for v in flags.values())
        )
        assert isinstance(record["results"], dict) and record["results"]
        assert record["native"] is None or isinstance(record["native"], dict)


def test_append_record_fills_the_machine_fields(tmp_path):
    rl = _results_log()
    out = tmp_path / "x.jsonl"
    results = {"files": {"a.gguf": {"ours": {"tg64_tok_s": 10.0}, "native": {"tg64_tok_s": 8.0}}}}
    native = rl.split_native(results, ("files", "*", "native"))
    assert results == {"files": {"a.gguf": {"ours": {"tg64_tok_s": 10.0}}}}
    assert native == {"files": {"a.gguf": {"native": {"tg64_tok_s": 8.0}}}}
    rl.append_record("decode", results, native=native, threads=2, load_at_start=0.5, out=out)
    rl.append_record("decode", {"second": 1}, out=out)
    first, second = _records(out)
    assert set(first) == KEYS and first["benchmark"] == "decode" and first["threads"] == 2
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", first["date"])
    assert first["load"]["1m_at_start"] == 0.5
    assert rl.merged(first) == {"files": {"a.gguf": {"ours": {"tg64_tok_s": 10.0}, "native": {"tg64_tok_s": 8.0}}}}
    assert rl.latest_record(path=out)["results"] == {"second": 1}
    assert rl.latest_record(path=out, where=lambda r: "files" in r["results"])["native"] == native


def test_split_native_leaves_what_does_not_match():
    rl = _results_log()
    run = {"models": {"m": {"ours": 1, "llamacpp": 2, "ratio": 0.5}}, "setup": {"llamacpp": "kept"}}
    assert rl.split_native(run, ("models", "*", "llamacpp")) == {"models": {"m": {"llamacpp": 2}}}
    assert run == {"models": {"m": {"ours": 1, "ratio": 0.5}}, "setup": {"llamacpp": "kept"}}
    assert rl.split_native(run, ("models", "*", "llama_server")) is None


def test_cpu_info_shape():
    model, flags = _results_log().cpu_info()
    assert model is None or isinstance(model, str)
    assert flags is None or set(flags) == {"avx2", "avx512", "vnni"}


def test_latest_prints_every_benchmark():
    proc = subprocess.run([sys.executable, str(BENCH / "latest.py")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for path in RESULTS.glob("*.jsonl"):
        assert f"== {path.stem}: latest of {len(_records(path))} records" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_latest_views_read_every_record():
    """Not only the latest: an older record of each benchmark still gives rows (the shapes changed over time)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import latest, results_log\n"
        "for p in sorted(results_log.RESULTS_DIR.glob('*.jsonl')):\n"
        "    for r in results_log.read_records(path=p):\n"
        "        peer, rows, notes = latest.VIEWS[p.stem](results_log.merged(r))\n"
        "        assert rows, (p.stem, r['source'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_bench_scripts_parse_and_write_no_old_json(path):
    source = path.read_text(encoding="utf-8")
    ast.parse(source)
    if path.name != "convert_results_once.py":  # the one-off converter names the old files it read
        assert not re.search(r"results[\"'/ ,]+[\"']?\w+\.json\b", source), "writes an old bench/results/*.json"
