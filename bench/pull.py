"""Pull throughput over loopback vs a plain file copy of the same bytes.

A mirror (the registry routes over a store, served by uvicorn on 127.0.0.1 as the daemon serves them) holds one
model with a blob of --mb megabytes; each run pulls it into a fresh store (download in parallel ranges, sha256
verify, rename) and is compared with `shutil.copyfile` of the blob file to the same disk. The best of --runs is
reported for both, as bytes per second, with the ratio. Appends one record per run to bench/results/pull.jsonl
(bench/results_log.py; --out: another JSONL file).

    python bench/pull.py [--mb 256] [--runs 3] [--streams 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402

import store as st  # noqa: E402
from localrt import config as cfg  # noqa: E402
from localrt.distribution import download as dl  # noqa: E402
from localrt.distribution import pull as pl  # noqa: E402
from localrt.distribution import transport as tr  # noqa: E402
from localrt.serve.daemon import free_port  # noqa: E402
from localrt.distribution.registry import registry_routes  # noqa: E402
from store import manifests as mf  # noqa: E402
from results_log import append_record  # noqa: E402


def make_mirror_store(root: Path, n_bytes: int) -> tuple[st.Store, str]:
    s = st.Store(root)
    blob = s.write_blob(_random_stream(n_bytes))
    conf = s.write_blob(mf.config_blob(model_family="llama"))
    s.put_manifest(
        "bench:1",
        mf.build(mf.Layer(mf.CONFIG_MEDIA_TYPE, conf.digest, conf.size), [mf.Layer(mf.MODEL, blob.digest, blob.size)]),
    )
    return s, blob.digest


class _random_stream:
    """n pseudo-random bytes (incompressible) without holding them all in memory."""

    def __init__(self, n: int):
        self.left = n
        self.block = os.urandom(1 << 20)

    def read(self, k: int = -1) -> bytes:
        k = min(self.left, len(self.block) if k is None or k < 0 else min(k, len(self.block)))
        self.left -= k
        return self.block[:k] if k else b""


def serve_forever(root: str, port: int) -> None:
    """The mirror process: registry routes over the store at `root`, as the daemon serves them."""
    s = st.Store(root)
    config = cfg.load({"LOCALRT_HOST": f"127.0.0.1:{port}"})
    app = Starlette(routes=registry_routes(lambda: s, config))
    uvicorn.Server(
        uvicorn.Config(app, host=config.host, port=port, log_level="warning", access_log=False, lifespan="off")
    ).run()


def start_mirror(root: Path) -> tuple[subprocess.Popen, str]:
    """A separate process, as a mirror on another machine or a daemon would be (no shared GIL with the client)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(root), "--port", str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                return proc, f"127.0.0.1:{port}"
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("mirror did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--streams", type=int, default=dl.STREAMS)
    ap.add_argument("--part-mb", type=int, default=dl.PART_MIN >> 20)
    ap.add_argument("--out", default=None, help="append the record to this JSONL file, not bench/results/pull.jsonl")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve_forever(args.serve, args.port)
        return
    load_at_start = os.getloadavg()[0]
    dl.STREAMS = tr.STREAMS = args.streams  # download's streams per blob, transport's connection pool
    dl.PART_MIN = args.part_mb << 20
    n = args.mb << 20
    with tempfile.TemporaryDirectory(prefix="pullbench-") as tmp:
        tmp = Path(tmp)
        mirror, digest = make_mirror_store(tmp / "mirror", n)
        proc, host = start_mirror(mirror.root)
        try:
            copy_s, verified_s, pull_s = [], [], []
            src_file = mirror.blob_path(digest)
            for i in range(args.runs):
                dst = tmp / f"copy-{i}"
                t0 = time.perf_counter()
                shutil.copyfile(src_file, dst)
                with open(dst, "rb+") as f:
                    os.fsync(f.fileno())  # the pull fsyncs its blob too
                copy_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                with open(dst, "rb") as f:
                    st.digest.of_stream(f)
                verified_s.append(copy_s[-1] + time.perf_counter() - t0)
                dst.unlink()
                target = st.Store(tmp / f"pulled-{i}")
                t0 = time.perf_counter()
                events = list(pl.pull(target, f"{host}/library/bench:1", insecure=True))
                pull_s.append(time.perf_counter() - t0)
                assert events[-1] == {"status": "success"}
                shutil.rmtree(target.root)
        finally:
            proc.terminate()
            proc.wait(10)
    copy_bps, pull_bps, verified_bps = n / min(copy_s), n / min(pull_s), n / min(verified_s)
    result = {
        "bench": "pull over loopback vs file copy",
        "bytes": n,
        "runs": args.runs,
        "streams": args.streams,
        "part_bytes": dl.PART_MIN,
        "copy_seconds": [round(x, 4) for x in copy_s],
        "pull_seconds": [round(x, 4) for x in pull_s],
        "copy_MBps": round(copy_bps / 1e6, 1),
        "pull_MBps": round(pull_bps / 1e6, 1),
        "ratio": round(pull_bps / copy_bps, 3),
        "copy_then_sha256_MBps": round(verified_bps / 1e6, 1),
        "ratio_vs_copy_then_sha256": round(pull_bps / verified_bps, 3),
        "goal_ratio": 0.7,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "notes": "pull = HTTP range download from a mirror process (uvicorn/h11) read with http.client, sha256 "
        "trailing + fsync + rename; copy = shutil.copyfile + fsync (in-kernel, no hashing); copy_then_sha256 "
        "adds the hash a verified copy needs. Both read from the page cache. The mirror process, the "
        "client and the hash share the machine's cores.",
    }
    print(json.dumps(result, indent=1))
    append_record("pull", result, load_at_start=load_at_start, out=args.out)


if __name__ == "__main__":
    main()
