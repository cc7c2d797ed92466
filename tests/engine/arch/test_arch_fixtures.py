"""Each architecture family against llama.cpp's own logits on tiny random-weight models (tests/decoders.py).

The GGUF files are rebuilt here from their seeds; llama.cpp's logits for decoders.IDS (one batched prefill)
were stored by bench/make_arch_reference.py in tests/data/arch/<case>.npz, as float16. With F32 weights
every position must agree within 1% of that position's logit range; with quantized weights (the decoder builder's Q8_0 file,
the F32 file through `create --quantize`'s quantizer at Q4_K_M and IQ4_XS, and for gpt-oss its experts in MXFP4;
activations quantized to 8 bits on both sides) the top-1 token must agree wherever llama.cpp's top-2 gap is clear. Each feature a
case exists for is also switched off once, to show the comparison would catch its absence.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fixtures import decoders
from localrt.engine.backends.backend import QTensor
from localrt.engine.loader import load_model
from localrt.models.quantize import quantize_model

CHECKED = list(decoders.CASES)
F32_TOLERANCE = 0.01  # of each position's logit range (max - min)
CLEAR_GAP = 0.5  # logits: below this llama.cpp's own top-2 is a near-tie that Q8_0 rounding may flip


def _reference(case: decoders.Case, label: str) -> np.ndarray:
    with np.load(decoders.DATA / f"{case.name}.npz") as z:
        return z[label].astype(np.float32)  # (n_tok, n_vocab)


def _model(tmp_path, case: decoders.Case, wtype: int | str):
    """The case loaded in the decoder builder's F32/Q8_0 file (an int type), or quantized by quantize_model (a level name)."""
    if isinstance(wtype, int):
        path = decoders.write(tmp_path / f"{case.name}-{wtype}.gguf", case, wtype)
    else:
        path = tmp_path / f"{case.name}-{wtype}.gguf"
        for _ in quantize_model(decoders.write(tmp_path / f"{case.name}-src.gguf", case, decoders.F32), path, wtype):
            pass
    return load_model(path, num_ctx=case.n_ctx, num_gpu=0)


def relative_error(ours: np.ndarray, ref: np.ndarray) -> float:
    """The largest |ours - ref| of each position over that position's range in ref, worst position."""
    return float((np.abs(ours - ref).max(axis=1) / np.ptp(ref, axis=1)).max())


def _logits(model) -> np.ndarray:
    try:
        return model.logits(decoders.IDS)
    finally:
        model.close()


@pytest.mark.parametrize("name", CHECKED)
def test_f32_logits_agree_with_llamacpp(tmp_path, name):
    case = decoders.CASES[name]
    ref = _reference(case, "f32")
    err = relative_error(_logits(_model(tmp_path, case, decoders.F32)), ref)
    assert err < F32_TOLERANCE, f"{name}: max error {err:.2%} of the logit range"


QUANTIZED = {"q8_0": decoders.Q8_0, "q4_k_m": "q4_K_M", "iq4_xs": "iq4_xs", "mxfp4": decoders.MXFP4}  # label -> file
# (case, label) for each quantized variant a case has reference logits for (decoders.Case.labels)
QUANTIZED_CASES = [(name, label) for name in CHECKED for label in QUANTIZED if label in decoders.CASES[name].labels]


@pytest.mark.parametrize("name, label", QUANTIZED_CASES, ids=[f"{n}-{lb}" for n, lb in QUANTIZED_CASES])
def test_quantized_top1_agrees_where_the_gap_is_clear(tmp_path, name, label):
    case = decoders.CASES[name]
    ref = _reference(case, label)
    ours = _logits(_model(tmp_path, case, QUANTIZED[label]))
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > CLEAR_GAP
    assert clear.sum() >= len(decoders.IDS) // 2, "too few clear positions for the check to mean anything"
    agree = ours.argmax(axis=1) == ref.argmax(axis=1)
    assert agree[clear].all(), (
        f"{name} {label}: top-1 differs at clear positions {np.flatnonzero(clear & ~agree).tolist()}"
    )


@pytest.mark.parametrize("name", CHECKED)
def test_f32_decode_steps_agree_with_llamacpp(tmp_path, name):
    """A 4-token prefill, then one token per step: the per-token attention kernel, the KV cache (a ring for
    sliding-window layers) and the caps on the decode path, against the same batched llama.cpp logits."""
    case = decoders.CASES[name]
    model = _model(tmp_path, case, decoders.F32)
    try:
        model.cache.clear(0)
        rows = [model.forward(model.batch(decoders.IDS[:4], 0), model.cache)]
        rows += [
            model.forward(model.batch(decoders.IDS[i : i + 1], i), model.cache) for i in range(4, len(decoders.IDS))
        ]
    finally:
        model.close()
    err = relative_error(np.concatenate(rows), _reference(case, "f32"))
    assert err < F32_TOLERANCE, f"{name}: max error {err:.2%} of the logit range"


def _config(**changes):
    def apply(model) -> None:
        model.config = dataclasses.replace(model.config, **changes)

    return apply


def _layers(**changes):
    def apply(model) -> None:
        model.weights.layers = [dataclasses.replace(L, **changes) for L in model.weights.layers]

    return apply


def _swap_gate_up(model) -> None:
    model.weights.layers = [dataclasses.replace(L, ffn_gate=L.ffn_up, ffn_up=L.ffn_gate) for L in model.weights.layers]


def _no_rope_factors(model) -> None:
    model.weights.rope_freqs = np.ones_like(model.weights.rope_freqs)


def _short_factors(model) -> None:
    model.weights.rope_freqs = model.weights.longrope[0]


def _router_off(model) -> None:
    """A zero router: uniform probabilities, so every token takes experts 0..k-1 whatever its input."""
    zero = np.zeros((model.config.n_expert, model.config.n_embd), np.float32)
    model.weights.layers = [
        dataclasses.replace(L, ffn_gate_inp=QTensor("router", 0, zero.shape, zero.view(np.uint8)))
        for L in model.weights.layers
    ]


def _no_yarn(model) -> None:
    """Plain rope at the file's base: no interpolation, no ramp, no magnitude scaling."""
    _config(rope_yarn=(), rope_freq_scale=1.0, rope_freq_scale_swa=1.0)(model)


def _yarn_no_ramp(model) -> None:
    """YaRN's interpolation and magnitude scaling, but every rotation pair interpolated (ext_factor 0 keeps the
    mscale of ggml's rope_yarn off too, so the attn_factor is set to carry it)."""
    n_ctx_orig, _, attn, fast, slow = model.config.rope_yarn
    mscale = attn * (1 + 0.1 * np.log(1 / model.config.rope_freq_scale))
    _config(rope_yarn=(n_ctx_orig, 0.0, mscale, fast, slow))(model)


def _no_expert_biases(model) -> None:
    _layers(ffn_gate_exps_bias=None, ffn_up_exps_bias=None, ffn_down_exps_bias=None)(model)


# feature -> (case, what switches it off in a loaded model)
ABLATIONS = {
    "qwen2 q/k/v biases": ("qwen2", _layers(attn_q_bias=None, attn_k_bias=None, attn_v_bias=None)),
    "llama3 rope_freqs": ("llama3_rope", _no_rope_factors),
    "qwen3 q/k norms": ("qwen3", _layers(attn_q_norm=None, attn_k_norm=None)),
    "phi3 gate before up": ("phi3", _swap_gate_up),
    "phi3 short factors": ("phi3_short", _no_rope_factors),
    "phi3 attn_factor": ("phi3_short", _config(rope_attn_factor=1.0)),
    "phi3 long factors past the original context": ("phi3_long", _short_factors),
    "gemma2 attention softcap": ("gemma2", _config(attn_softcap=0.0)),
    "gemma2 final softcap": ("gemma2", _config(final_logit_softcap=0.0)),
    "gemma2 sliding window": ("gemma2", _config(windows=(0, 0, 0))),
    "qwen3moe routing": ("qwen3moe", _router_off),
    "qwen3moe top-k": ("qwen3moe", _config(n_expert_used=3)),
    "qwen3moe renormalised expert weights": ("qwen3moe", _config(expert_weights_norm=False)),
    "gemma3 sliding window": ("gemma3", _config(windows=(0,) * 6)),
    "gemma3 local rope base": ("gemma3", lambda m: _config(rope_base_swa=m.config.rope_base)(m)),
    "gemma3 q/k norms": ("gemma3", _layers(attn_q_norm=None, attn_k_norm=None)),
    "gemma2 post norms": (
        "gemma2",
        _layers(post_attention_norm=np.ones(64, np.float32), post_ffw_norm=np.ones(64, np.float32)),
    ),
    "qwen2 yarn": ("qwen2_yarn", _no_yarn),
    "qwen3 yarn": ("qwen3_yarn", _no_yarn),
    "qwen3 yarn ramp": ("qwen3_yarn", _yarn_no_ramp),
    "gpt-oss attention sinks": ("gpt-oss", _layers(attn_sinks=None)),
    "gpt-oss sliding window": ("gpt-oss", _config(windows=(0,) * 4)),
    "gpt-oss yarn": ("gpt-oss", _no_yarn),
    "gpt-oss yarn ramp": ("gpt-oss", _yarn_no_ramp),
    "gpt-oss softmax-weight gating": ("gpt-oss", _config(expert_gating="softmax")),
    "gpt-oss swiglu_oai": ("gpt-oss", _config(expert_act="swiglu")),
    "gpt-oss router bias": ("gpt-oss", _layers(ffn_gate_inp_bias=None)),
    "gpt-oss expert biases": ("gpt-oss", _no_expert_biases),
    "gpt-oss output bias": ("gpt-oss", _layers(attn_output_bias=None)),
}


@pytest.mark.parametrize("feature", list(ABLATIONS))
def test_each_feature_is_what_makes_its_case_agree(tmp_path, feature):
    name, switch_off = ABLATIONS[feature]
    case = decoders.CASES[name]
    model = _model(tmp_path, case, decoders.F32)
    switch_off(model)
    err = relative_error(_logits(model), _reference(case, "f32"))
    assert err > 5 * F32_TOLERANCE, f"{name} agrees with llama.cpp even without {feature} ({err:.2%})"
