"""The backend seam on the CPU: a second device object in the middle of the stack changes nothing.

A `CountingCPU` device (a CPUBackend that copies whatever crosses into it and counts its calls) owns
some layers of a real model, with their KV cache; the logits must be bit-identical to all-CPU, every
weight product of those layers must run on it, and only the hidden state may cross. The same device
stands in for a GPU behind `offload` (fake probe figures), which also gives the `num_gpu` errors.
"""

from __future__ import annotations

import numpy as np
import pytest

from localrt.engine.backends import devices
from localrt import load_model
from localrt.engine.backends.backend import CPUBackend
from localrt.engine.backends.offload import offload, place_layers
from localrt.engine.backends.placement import MIB, GPUOutOfMemory, GPUUnavailable

PROMPT = "The quick brown fox jumps over the lazy dog because"


class CountingCPU(CPUBackend):
    name = "cpu2"

    def __init__(self, index: int = 0) -> None:
        super().__init__()
        self.index = index
        self.linear_weights: list[str] = []
        self.crossings_in = 0
        self.crossings_out = 0
        self.adopted: list[str] = []

    def put(self, a):
        self.crossings_in += 1
        return np.array(a, np.float32, copy=True)  # a copy: nothing may keep using the other device's buffer

    def to_host(self, a):
        self.crossings_out += 1
        return np.array(a, copy=True)

    def zeros(self, shape):
        return np.zeros(shape, np.float32)

    def adopt_layer(self, layer):
        self.adopted.append(layer.attn_q.name)
        return layer

    def linear(self, w, x, out=None):
        self.linear_weights.append(w.name)
        return super().linear(w, x, out)

    def linears(self, ws, x):
        seen = len(self.linear_weights)
        outs = super().linears(ws, x)
        del self.linear_weights[seen:]  # the ones of them that went through linear: each weight once, below
        self.linear_weights += [w.name for w in ws]
        return outs


def _fake_probe(free_bytes: int | None):
    def probe(index: int = 0):
        if free_bytes is None:
            return devices.DeviceReport(None, "test: no GPU here")
        return devices.DeviceReport(devices.GPUInfo(index, "Fake", free_bytes, 2 * free_bytes, "90"), "")

    return probe


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model_path(request, smollm2_path, gemma3_path):
    return smollm2_path if request.param == "smollm2" else gemma3_path


@pytest.fixture(scope="module")
def reference(model_path):
    m = load_model(model_path, num_ctx=128, num_gpu=0)
    ids = m.tokenize(PROMPT)
    out = ids, m.logits(ids), m.config.n_layer
    m.close()
    return out


def test_second_device_in_the_middle_gives_identical_logits(model_path, reference):
    ids, want, n_layer = reference
    m = load_model(model_path, num_ctx=128, num_gpu=0)
    dev = CountingCPU()
    middle = range(n_layer // 3, 2 * n_layer // 3)
    host_k = [m.cache.k[il] for il in middle]
    place_layers(m, dev, middle, output=False)
    got = m.logits(ids)
    np.testing.assert_array_equal(got, want)
    # Every weight product of the middle layers ran on the second device, nothing else did.
    names = {n.split(".")[1] for n in dev.linear_weights}
    assert names == {str(il) for il in middle}
    assert len(dev.linear_weights) == 7 * len(middle)  # q, k, v, o, gate, up, down; one batch
    assert dev.crossings_in == 1 and dev.crossings_out == 1  # in once, out once per forward
    assert all(m.cache.k[il] is not k for il, k in zip(middle, host_k))  # its layers' KV lives on it
    m.close()


def test_second_device_at_the_end_with_output(model_path, reference):
    ids, want, n_layer = reference
    m = load_model(model_path, num_ctx=128, num_gpu=0)
    dev = CountingCPU()
    place_layers(m, dev, range(n_layer - 2, n_layer), output=True)
    np.testing.assert_array_equal(m.logits(ids), want)
    assert dev.linear_weights[-1] in ("output.weight", "token_embd.weight")  # the logits came from it
    m.close()


def test_generate_through_the_seam_matches(smollm2_path):
    def greedy(split: bool):
        m = load_model(smollm2_path, num_ctx=128, num_gpu=0)
        if split:
            place_layers(m, CountingCPU(), range(10, 20), output=False)
        ids = m.tokenize(PROMPT)
        toks = [e.token for e in m.generate(ids, {"temperature": 0, "num_predict": 6}) if hasattr(e, "token")]
        m.close()
        return toks

    assert greedy(True) == greedy(False)


def test_auto_offload_on_fake_memory_figures(model_path, reference):
    ids, want, n_layer = reference
    m = load_model(model_path, num_ctx=128, num_gpu=0)
    made: list[CountingCPU] = []

    def make(index):
        made.append(CountingCPU(index))
        return made[-1]

    # 128 MiB beyond the margin: the scratch plus some of the layers (a few MiB each), not all of them.
    plan = offload(m, -1, probe=_fake_probe(512 * MIB + 128 * MIB), make_device=make)
    assert 0 < len(plan.gpu_layers) < n_layer and not plan.output
    assert plan.gpu_layers == tuple(range(n_layer - len(plan.gpu_layers), n_layer))  # the last ones
    assert m.placement is plan and plan.vram_bytes > 0
    assert made[0].adopted == [f"blk.{il}.attn_q.weight" for il in plan.gpu_layers]
    np.testing.assert_array_equal(m.logits(ids), want)
    m.close()


def test_auto_without_gpu_runs_on_cpu(smollm2_path):
    m = load_model(smollm2_path, num_ctx=64, num_gpu=0)
    plan = offload(m, -1, probe=_fake_probe(None), make_device=pytest.fail)
    assert plan.gpu_layers == () and "test: no GPU here" in plan.reason and not m.weights.devices
    m.close()


def test_explicit_num_gpu_without_gpu_is_an_error(smollm2_path):
    m = load_model(smollm2_path, num_ctx=64, num_gpu=0)
    with pytest.raises(GPUUnavailable, match="num_gpu 4 .*test: no GPU here"):
        offload(m, 4, probe=_fake_probe(None), make_device=pytest.fail)
    with pytest.raises(GPUOutOfMemory, match="num_gpu 31"):
        offload(m, 31, probe=_fake_probe(600 * MIB), make_device=pytest.fail)
    m.close()


def test_load_model_num_gpu(smollm2_path):
    report = devices.probe(0)
    if report.gpu is not None:
        pytest.skip("a GPU is present: this checks the CPU-only behaviour")
    with pytest.raises(GPUUnavailable, match="num_gpu 1 asks for layers on a GPU"):
        load_model(smollm2_path, num_ctx=64, num_gpu=1)
    m = load_model(smollm2_path, num_ctx=64)  # default: automatic, so the CPU here
    assert m.placement.gpu_layers == () and m.placement.vram_bytes == 0
    m.close()
