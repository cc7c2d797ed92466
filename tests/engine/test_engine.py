"""Engine on tiny random-weight GGUF files: forward vs a float64 NumPy reference, KV cache, generate()."""

from __future__ import annotations

import numpy as np
import pytest

from fixtures.decoders import small, write_model

from fixtures.reference import EOS_ID, reference_logits
from localrt import load_model
from localrt.errors import ContextLengthExceeded, InvalidRequest, MissingTensor, UnsupportedArchitecture
from localrt.engine.events import Done, Token
from localrt.engine.model import config_from_metadata
from simd_kernels import ops

SPECS = {
    "llama": small(),
    "qwen2": small(arch="qwen2"),
    # 7 layers so that layer 5 is global; window 4 so that 20 tokens cross it several times.
    "gemma3": small(arch="gemma3", n_layer=7, head_dim=32, window=4, softcap=30.0),
    "llama_q8_0": small(wtype=8, tied=False, seed=3),
}
IDS = np.random.default_rng(1).integers(0, small().n_vocab, 20)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    out = {}
    for name, spec in SPECS.items():
        path = root / f"{name}.gguf"
        out[name] = (path, spec, write_model(path, spec))
    return out


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("num_batch", [20, 3])
def test_logits_match_float64_reference(files, name, num_batch):
    path, spec, weights = files[name]
    model = load_model(path, num_ctx=64, num_batch=num_batch, kv_type="f32")
    got = model.logits(IDS)
    ref = reference_logits(spec, weights, IDS)
    assert got.shape == (len(IDS), spec.n_vocab) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=2e-4 * np.abs(ref).max())


def test_f16_cache_rounds_like_float16_and_stays_close(files):
    path, spec, weights = files["gemma3"]
    model = load_model(path, num_ctx=64)  # kv_type "f16", llama.cpp's default
    got = model.logits(IDS)
    for k in model.cache.k + model.cache.v:  # float16 bits, at llama.cpp's F16 cache size
        assert k.dtype == np.uint16 and np.isfinite(k.view(np.float16)).all()
    assert model.cache.nbytes == load_model(path, num_ctx=64, kv_type="f32").cache.nbytes // 2
    ref = reference_logits(spec, weights, IDS)
    assert np.abs(got - ref).max() < 5e-3 * np.abs(ref).max()


def test_quantized_weights_close_to_reference(files):
    path, spec, weights = files["llama_q8_0"]
    model = load_model(path, num_ctx=64, num_batch=4)  # small chunks: the fused kernel with 8-bit activations
    got = model.logits(IDS)
    ref = reference_logits(spec, weights, IDS)
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() < 0.03 * scale
    assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.9


def test_sliding_window_layers_keep_a_ring(files):
    path, spec, _ = files["gemma3"]
    model = load_model(path, num_ctx=64, num_batch=3)
    caps = [k.shape[2] for k in model.cache.k]  # a ring per slot; the full layer's 64 positions are one pool block
    assert caps == [spec.window + 3] * 5 + [64] + [spec.window + 3] == model.cache.caps
    assert (
        model.cache.paged == [False] * 5 + [True] + [False] and model.cache.k[5].shape[0] == model.cache.pool.n_blocks
    )
    assert model.config.windows == (4, 4, 4, 4, 4, 0, 4)


def test_mixed_sequence_batch_equals_separate_runs(files):
    path, spec, _ = files["llama"]
    model = load_model(path, num_ctx=32, n_slots=2, kv_type="f32")
    a, b = IDS[:6], IDS[6:10]
    ref_a, ref_b = model.logits(a), model.logits(b)
    cache = model.cache
    cache.clear(0)
    cache.clear(1)
    # First the two prompts' heads in one batch, then their tails interleaved token by token.
    batch = model.batch(np.r_[a[:3], b[:2]], 0)
    batch = type(batch)(batch.tokens, np.r_[0, 1, 2, 0, 1], np.r_[0, 0, 0, 1, 1])
    first = model.forward(batch, cache)
    tokens = np.r_[a[3], b[2], a[4], b[3]]
    rest = model.forward(type(batch)(tokens, np.r_[3, 2, 4, 3], np.r_[0, 1, 0, 1]), cache, np.arange(4))
    np.testing.assert_allclose(first[:3], ref_a[:3], atol=1e-4)
    np.testing.assert_allclose(first[3:], ref_b[:2], atol=1e-4)
    np.testing.assert_allclose(rest[[0, 2]], ref_a[3:5], atol=1e-4)
    np.testing.assert_allclose(rest[[1, 3]], ref_b[2:4], atol=1e-4)
    assert list(cache.lengths) == [5, 4]


def test_batch_that_skips_positions_is_rejected(files):
    model = load_model(files["llama"][0], num_ctx=32)
    model.cache.clear(0)
    bad = model.batch([1, 2], 3)
    with pytest.raises(ValueError, match="continue"):
        model.forward(bad, model.cache)


def _run(model, ids, **options):
    events = list(model.generate(ids, {"temperature": 0, **options}))
    assert all(isinstance(e, Token) for e in events[:-1]) and isinstance(events[-1], Done)
    return events[:-1], events[-1]


def test_greedy_generation_follows_reference_argmax(files):
    path, spec, weights = files["qwen2"]
    model = load_model(path, num_ctx=64, kv_type="f32")
    prompt = list(IDS[:8])
    tokens, done = _run(model, prompt, num_predict=10)
    out = [t.token for t in tokens]
    assert done.done_reason == "length" and done.eval_count == 10 and done.prompt_eval_count == 8
    assert done.context == prompt + out
    ref = reference_logits(spec, weights, prompt + out)
    assert out == [int(i) for i in ref[len(prompt) - 1 : -1].argmax(1)]
    assert done.total_duration >= done.prompt_eval_duration + done.eval_duration > 0


def test_generation_reuses_the_cached_prefix(files):
    model = load_model(files["llama"][0], num_ctx=64)
    prompt = list(IDS[:8])
    first, _ = _run(model, prompt, num_predict=4)
    again, done = _run(model, prompt + [first[0].token], num_predict=3)
    assert done.prompt_eval_count == len(prompt) + 1  # the whole prompt is counted, as Ollama does
    assert done.prompt_cached_count == len(prompt)  # everything but the last prompt token came from the cache
    assert [t.token for t in again] == [t.token for t in first[1:]]


def test_prefix_reuse_falls_back_when_a_window_ring_was_overwritten(files):
    path = files["gemma3"][0]
    model = load_model(path, num_ctx=64, num_batch=3)  # local layers keep a ring of 4 + 3 positions
    _run(model, list(IDS), num_predict=2)
    prompt = list(IDS[:12]) + [7, 8]
    tokens, done = _run(model, prompt, num_predict=4)
    assert done.prompt_cached_count == 0  # 8+ positions back is beyond what the ring holds
    fresh = _run(load_model(path, num_ctx=64, num_batch=3), prompt, num_predict=4)[0]
    assert [t.token for t in tokens] == [t.token for t in fresh]
    again, done = _run(model, prompt + [tokens[0].token], num_predict=3)
    assert done.prompt_cached_count == len(prompt)  # a short step back stays inside the ring
    assert [t.token for t in again] == [t.token for t in tokens[1:]]


def test_request_num_ctx_below_the_loaded_one(files):
    model = load_model(files["llama"][0], num_ctx=32)
    with pytest.raises(ContextLengthExceeded):
        list(model.generate(list(IDS[:12]), {"num_ctx": 8}))
    tokens, done = _run(model, list(IDS[:5]), num_ctx=8)
    assert len(tokens) == 3 and done.done_reason == "length"


def test_stop_string_is_never_emitted(files):
    model = load_model(files["gemma3"][0], num_ctx=64)
    prompt = model.tokenize("the the")
    tokens, done = _run(model, prompt, num_predict=12)
    full = "".join(t.text for t in tokens) + done.text
    stop = full[3:6]
    assert len(stop) == 3, "the continuation is too short for this test"
    tokens, done = _run(model, prompt, num_predict=12, stop=[stop])
    shown = "".join(t.text for t in tokens) + done.text
    assert done.done_reason == "stop"
    assert shown == full[: full.index(stop)]


def test_end_of_generation_token_stops(files):
    model = load_model(files["llama"][0], num_ctx=64)
    prompt = list(IDS[:5])
    first = _run(model, prompt, num_predict=1)[0][0].token
    model.tokenizer.vocab.eog_ids = frozenset({EOS_ID, first})  # pretend that token ends generation
    tokens, done = _run(model, prompt, num_predict=10)
    assert done.done_reason == "stop" and tokens == [] and done.eval_count == 1
    assert done.context == prompt + [first]


def test_context_limits(files):
    path, spec, _ = files["llama"]
    model = load_model(path, num_ctx=16)
    with pytest.raises(ContextLengthExceeded) as exc:
        list(model.generate(list(IDS[:17]), {"temperature": 0}))
    assert (exc.value.n_prompt, exc.value.n_ctx) == (17, 16)
    tokens, done = _run(model, list(IDS[:10]))
    assert done.done_reason == "length" and len(done.context) == 16 and len(tokens) == 6
    assert load_model(path, num_ctx=100_000).num_ctx == spec.n_ctx_train
    with pytest.raises(InvalidRequest):
        model.logits([spec.n_vocab])


def test_embed_is_mean_pooled_hidden_state(files):
    model = load_model(files["llama"][0], num_ctx=64)
    e = model.embed(IDS[:7])
    assert e.shape == (model.config.n_embd,) and e.dtype == np.float32
    np.testing.assert_allclose(e, model.hidden(IDS[:7]).mean(0), rtol=1e-5, atol=1e-6)


def test_missing_tensor_and_unknown_arch_are_named(files, tmp_path):
    spec = SPECS["gemma3"]
    write_model(tmp_path / "m.gguf", spec, drop="blk.2.attn_k_norm.weight")
    with pytest.raises(MissingTensor, match="blk.2.attn_k_norm.weight"):
        load_model(tmp_path / "m.gguf")
    write_model(tmp_path / "x.gguf", small(arch="mamba"))
    with pytest.raises(UnsupportedArchitecture, match="mamba"):
        load_model(tmp_path / "x.gguf")


def test_config_from_metadata_rope_and_windows():
    md = {
        "general.architecture": "gemma3",
        "gemma3.embedding_length": 640,
        "gemma3.block_count": 12,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1,
        "gemma3.feed_forward_length": 2048,
        "gemma3.attention.key_length": 256,
        "gemma3.attention.sliding_window": 512,
        "gemma3.rope.freq_base": 1e6,
        "gemma3.vocab_size": 262144,
    }
    cfg = config_from_metadata(md)
    assert cfg.rope_mode == ops.ROPE_NEOX and cfg.head_dim == 256 and cfg.attn_scale == 1 / 16
    assert [il for il, w in enumerate(cfg.windows) if w == 0] == [5, 11]
    assert cfg.rope_base == 1e6 and cfg.rope_base_swa == 10000.0
    assert cfg.embed_scale == pytest.approx(640**0.5)
    llama = {k.replace("gemma3", "llama"): v for k, v in md.items() if "sliding" not in k and "key_length" not in k}
    llama["general.architecture"] = "llama"
    cfg = config_from_metadata(llama)
    assert cfg.rope_mode == ops.ROPE_NORMAL and cfg.head_dim == 160 and cfg.windows == (0,) * 12
