"""Device discovery with fake CuPy modules (no GPU needed), and the one-line CPU fallback log."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from localrt.engine.backends import devices


class _Runtime:
    def __init__(self, count=1, free=3 << 30, total=8 << 30, fail=None):
        self.count, self.free, self.total, self.fail = count, free, total, fail

    def getDeviceCount(self):
        if self.fail:
            raise self.fail
        return self.count

    def memGetInfo(self):
        return self.free, self.total

    def getDeviceProperties(self, index):
        return {"name": b"Fake GPU", "major": 9, "minor": 0}


class _Device:
    def __init__(self, index):
        self.index = index

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _fake_cupy(**kw):
    return SimpleNamespace(cuda=SimpleNamespace(runtime=_Runtime(**kw), Device=_Device))


def test_gpu_reported_with_memory():
    r = devices.probe(0, cupy=_fake_cupy())
    assert r.reason == "" and r.gpu == devices.GPUInfo(0, "Fake GPU", 3 << 30, 8 << 30, "90")


def test_no_device_is_a_reason_not_an_exception():
    r = devices.probe(0, cupy=_fake_cupy(fail=RuntimeError("cudaErrorNoDevice")))
    assert r.gpu is None and "cudaErrorNoDevice" in r.reason
    assert devices.probe(0, cupy=_fake_cupy(count=0)).reason == "CUDA sees no device"


def test_main_gpu_out_of_range():
    r = devices.probe(2, cupy=_fake_cupy(count=1))
    assert r.gpu is None and "main_gpu 2 does not exist" in r.reason


def test_missing_cupy_says_how_to_install(monkeypatch):
    def no_cupy(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(devices.importlib, "import_module", no_cupy)
    r = devices.probe(0)
    assert r.gpu is None and "localrt[cuda]" in r.reason


def test_real_probe_never_raises():
    r = devices.probe(0)
    assert (r.gpu is None) == bool(r.reason)


def test_fallback_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(devices, "_logged", devices.threading.Event())
    report = devices.DeviceReport(None, "CuPy is not installed")
    with caplog.at_level(logging.INFO, logger="localrt.devices"):
        devices.log_cpu_fallback(report)
        devices.log_cpu_fallback(report)
        devices.log_cpu_fallback(devices.DeviceReport(devices.GPUInfo(0, "g", 1, 2, "90"), ""))
    lines = [r.getMessage() for r in caplog.records if r.name == "localrt.devices"]
    assert lines == ["no usable GPU, running on the CPU: CuPy is not installed"]
