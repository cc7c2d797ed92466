"""A gemma3 file as Ollama's library ships it: the vision tower and its projector inside the text model's GGUF
(tensors `v.*` and `mm.*`, metadata `gemma3.vision.*` and `gemma3.mm.tokens_per_image`, as Ollama's
convert/convert_gemma3.go writes them). This runtime runs the text model only (localrt.engine.compat): the logits
are those of the same file without the vision tensors, the load says so once, the memory estimate leaves the tower
out, and through a real daemon `create` accepts the file, `show` lists its vision keys but not the `vision`
capability, and a request with images is refused."""

from __future__ import annotations

import dataclasses
import hashlib
import logging

import httpx
import numpy as np
import pytest

from fixtures import decoders
from _daemon_fakes import pinned_daemon
from localrt.engine.loader import load_model
from localrt.runtime.service import estimate_memory

CASE = decoders.CASES["gemma3"]
VE, VF, PATCH, IMAGE = 32, 64, 4, 16  # the tower's width, feed-forward width, patch and image sizes (pixels)
VISION_KEYS = {
    "vision.block_count": 1,
    "vision.embedding_length": VE,
    "vision.feed_forward_length": VF,
    "vision.image_size": IMAGE,
    "vision.patch_size": PATCH,
    "vision.num_channels": 3,
    "vision.attention.head_count": 2,
    "vision.attention.layer_norm_epsilon": 1e-6,
    "mm.tokens_per_image": 4,
}
LOG_LINE = "gemma3: {n} vision tensors ignored: this runtime runs the text model only"


def vision_tensors() -> dict[str, np.ndarray]:
    """Ollama's names for a one-block SigLIP tower and Gemma 3's projector; matrices F16 as Ollama keeps them."""
    rng = np.random.default_rng(99)

    def t(*shape, dtype=np.float16):
        return rng.standard_normal(shape).astype(dtype)

    out = {
        "v.patch_embedding.weight": t(VE, 3, PATCH, PATCH),
        "v.patch_embedding.bias": t(VE, dtype=np.float32),
        "v.position_embedding.weight": t((IMAGE // PATCH) ** 2, VE),
    }
    for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
        out[f"v.blk.0.{proj}.weight"], out[f"v.blk.0.{proj}.bias"] = t(VE, VE), t(VE, dtype=np.float32)
    for norm in ("layer_norm1", "layer_norm2"):
        out[f"v.blk.0.{norm}.weight"], out[f"v.blk.0.{norm}.bias"] = t(VE, dtype=np.float32), t(VE, dtype=np.float32)
    out["v.blk.0.mlp.fc1.weight"], out["v.blk.0.mlp.fc2.weight"] = t(VF, VE), t(VE, VF)
    out["v.post_layernorm.weight"] = t(VE, dtype=np.float32)
    out["mm.mm_input_projection.weight"] = t(VE, CASE.n_embd)
    out["mm.mm_soft_emb_norm.weight"] = t(VE, dtype=np.float32)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(the text-only gemma3 file, the same weights with Ollama's embedded vision tower)"""
    root = tmp_path_factory.mktemp("gemma3")
    plain = decoders.write(root / "text.gguf", CASE)
    ollama_style = decoders.write(
        root / "ollama.gguf", dataclasses.replace(CASE, extra=VISION_KEYS), more=vision_tensors()
    )
    return plain, ollama_style


def _ignored_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "vision tensors ignored" in r.getMessage()]


def _logits(path) -> np.ndarray:
    model = load_model(path, num_ctx=CASE.n_ctx, num_gpu=0)
    try:
        return model.logits(decoders.IDS)
    finally:
        model.close()


def test_the_text_model_runs_as_without_the_tower_and_says_so_once(files, caplog):
    plain, ollama_style = files
    with caplog.at_level(logging.INFO, logger="localrt.engine"):
        want = _logits(plain)
        assert _ignored_lines(caplog) == []
        got = _logits(ollama_style)
    assert _ignored_lines(caplog) == [LOG_LINE.format(n=len(vision_tensors()))]
    np.testing.assert_array_equal(got, want)
    with np.load(decoders.DATA / "gemma3.npz") as z:  # and both are llama.cpp's text model (test_arch_fixtures)
        ref = z["f32"].astype(np.float32)
    assert float((np.abs(got - ref).max(axis=1) / np.ptp(ref, axis=1)).max()) < 0.01


def test_the_memory_estimate_leaves_the_tower_out(files):
    plain, ollama_style = files
    assert ollama_style.stat().st_size > plain.stat().st_size
    for use_mmap in (True, False):  # mapped, or copied into private memory: never the tower
        assert estimate_memory(ollama_style, CASE.n_ctx, 32, use_mmap=use_mmap) == estimate_memory(
            plain, CASE.n_ctx, 32, use_mmap=use_mmap
        )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with pinned_daemon(tmp_path_factory.mktemp("models")) as srv:  # the real loader
        yield srv


def test_create_show_and_generate_through_the_daemon(daemon, files, caplog):
    data = files[1].read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert httpx.post(f"{daemon.url}/api/blobs/{digest}", content=data, timeout=60).status_code == 201
    r = httpx.post(
        daemon.url + "/api/create",
        timeout=120,
        json={"model": "gemma3-ollama", "files": {"model.gguf": digest}, "stream": False},
    )
    assert r.status_code == 200, r.text

    shown = httpx.post(daemon.url + "/api/show", json={"model": "gemma3-ollama"}, timeout=60).json()
    assert "vision" not in shown["capabilities"] and "completion" in shown["capabilities"]
    info = shown["model_info"]
    assert info["gemma3.vision.block_count"] == 1 and info["gemma3.mm.tokens_per_image"] == 4  # the file's, as Ollama
    assert {t["name"] for t in shown["tensors"]} >= set(vision_tensors())

    with caplog.at_level(logging.INFO, logger="localrt.engine"):
        r = httpx.post(
            daemon.url + "/api/generate",
            timeout=120,
            json={
                "model": "gemma3-ollama",
                "prompt": "hello",
                "stream": False,
                "options": {"num_predict": 3, "temperature": 0},
            },
        )
    assert r.status_code == 200, r.text
    assert r.json()["eval_count"] == 3
    assert _ignored_lines(caplog) == [LOG_LINE.format(n=len(vision_tensors()))]

    r = httpx.post(
        daemon.url + "/api/generate",
        timeout=60,
        json={"model": "gemma3-ollama", "prompt": "what is this?", "images": ["aGVsbG8="], "stream": False},
    )
    assert r.status_code == 400 and "images are not supported" in r.json()["error"]


@pytest.mark.parametrize("quantization", ["q8_0", "q4_K_M"])
def test_quantizing_leaves_the_tower_as_it_is(files, tmp_path, quantization):
    """As Ollama's quantizer: the text model is quantized, the vision tensors are copied as they are (a 14-wide
    patch embedding does not even fit a block)."""
    import gguf_io
    from localrt.models.quantize import quantize_model

    src = files[1]
    dst = tmp_path / "q.gguf"
    for _ in quantize_model(src, dst, quantization):
        pass
    with gguf_io.open(src) as a, gguf_io.open(dst) as b:
        for name, t in a.tensors.items():
            if name.startswith(("v.", "mm.")):
                assert b.tensors[name].ggml_type == t.ggml_type and bytes(b.tensors[name].data) == bytes(t.data)
        assert b.tensors["blk.0.attn_q.weight"].ggml_type != a.tensors["blk.0.attn_q.weight"].ggml_type
