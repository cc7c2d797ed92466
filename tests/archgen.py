"""Tiny random-weight GGUF files of every architecture family the engine runs, rebuilt bit for bit from a seed.

`bench/make_arch_reference.py` runs llama.cpp once on each (F32 and Q8_0 weights, and the F32 file through our
quantizer at Q4_K_M and IQ4_XS; gpt-oss: F32, Q8_0 and MXFP4 experts) and stores its logits in `tests/data/arch/`;
`tests/engine/arch/test_arch_fixtures.py` rebuilds the same files here and compares the engine with them, so the
tests never need llama.cpp. The tokenizer is SmolLM2's own byte-level BPE (`tokenizer.ggml.*`), cut to its first
VOCAB tokens and the merges among them (`tests/data/arch/tokenizer.json`, written by the bench script from the
installed SmolLM2 file), so both runtimes load a real tokenizer of a small vocabulary.

Each Case names what it exercises: q/k/v biases (qwen2), llama3 rope factors (`rope_freqs`), q/k norms
(qwen3), fused qkv and gate+up with longrope factors and partial rotary (phi3), soft-capping, sandwich norms
and alternating sliding windows (gemma2), q/k norms with sandwich norms, five local layers in six and a local
rope base of its own (gemma3), top-k routing over stacked 3-D expert tensors (qwen3moe), and gpt-oss's attention
sinks, output and expert biases, softmax-weight routing, clamped swiglu_oai, YaRN rope and alternating windows.
The shapes are GGUF's (NumPy order: rows = outputs).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import gguf
import numpy as np
from _engine_gguf import add_hparams

import quant

DATA = Path(__file__).parent / "data" / "arch"
TOKENIZER_FILE = DATA / "tokenizer.json"
VOCAB = 512  # SmolLM2's first 512 tokens: 17 specials, the byte alphabet, the first merges
F32, Q8_0, MXFP4 = 0, 8, 39  # MXFP4: the experts only (as gpt-oss's own files), every other tensor F32
# The fixed prompt both runtimes evaluate (ids in VOCAB; 1 = <|im_start|>, as a chat prompt begins).
IDS = [1, 411, 278, 292, 17, 305, 331, 288, 423, 299, 264, 500, 356, 27, 392, 2]


@dataclass(frozen=True)
class Case:
    name: str
    arch: str
    n_embd: int = 64
    n_layer: int = 3
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_rot: int = 0  # 0: the whole head
    n_ctx_train: int = 1024
    n_ctx: int = 256  # the context both runtimes run with (phi3 longrope picks its factors by it)
    rope_base: float = 10000.0
    eps: float = 1e-5
    biases: bool = False
    tied: bool = True
    llama3_rope: tuple = ()  # (factor, low_freq_factor, high_freq_factor, original context): a rope_freqs tensor
    longrope: bool = False  # phi3: rope_factors_long/short and rope.scaling.attn_factor
    window: int = 0  # sliding window: gemma2's even layers local, gemma3's layers il % 6 < 5
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    n_expert: int = 0  # qwen3moe: experts per layer, routed top-n_expert_used, each n_ff_exp wide
    n_expert_used: int = 0
    n_ff_exp: int = 0
    embd_std: float = 1.0  # token_embd's scale (gemma multiplies it by sqrt(n_embd) on the way in)
    yarn: tuple = ()  # (factor, original context): rope.scaling.type "yarn"
    exps_scale: float = 1.0  # the gate/up experts' scale (gpt-oss: large enough that swiglu_oai's clamp at 7 acts)
    labels: tuple = ("f32", "q8_0", "q4_k_m", "iq4_xs")  # the weight variants llama.cpp's logits are stored for
    extra: dict = field(default_factory=dict)  # more `<arch>.<suffix>`: value keys
    seed: int = 0

    @property
    def rot(self) -> int:
        return self.n_rot or self.head_dim


CASES = {
    c.name: c
    for c in (
        Case("llama", "llama", tied=False, seed=1),
        Case("qwen2", "qwen2", biases=True, seed=2),
        # Llama 3.x: the converter turns rope_scaling {factor 8, low 1, high 4, original 8192} into rope_freqs;
        # an original context of 64 puts every factor regime (1, smoothed, 8) inside a 16-wide head.
        Case("llama3_rope", "llama", llama3_rope=(8.0, 1.0, 4.0, 64), seed=3),
        Case("qwen3", "qwen3", seed=4),
        Case("phi3", "phi3", n_head_kv=4, tied=False, seed=5),
        # Phi-3 128k style: long/short factors, attn_factor; n_ctx 256 <= original 256 picks the short factors,
        # 512 the long ones. Partial rotary (12 of 16) as Phi-4-mini has it.
        Case("phi3_short", "phi3", n_rot=12, longrope=True, n_ctx=256, seed=6),
        Case("phi3_long", "phi3", n_rot=12, longrope=True, n_ctx=512, seed=6),
        Case("gemma2", "gemma2", window=4, attn_softcap=1.0, final_softcap=25.0, eps=1e-6, seed=7),
        # Gemma 3 (1B/270M style): layers 0-4 local with rope base 10000 (gemma3's fixed rope.freq_base_swa), layer 5
        # global with the file's base; q/k norms, no soft-capping.
        Case("gemma3", "gemma3", n_layer=6, window=4, rope_base=1000000.0, eps=1e-6, seed=9, embd_std=0.2),
        # Qwen 3 30B-A3B style, in miniature: 8 experts, 2 per token, each 32 wide (feed_forward_length unused).
        Case("qwen3moe", "qwen3moe", n_expert=8, n_expert_used=2, n_ff_exp=32, seed=8),
        # Qwen 2.5 / Qwen 3 long-context files: rope.scaling.type yarn (x4 over an original context of 64 here)
        Case("qwen2_yarn", "qwen2", biases=True, yarn=(4.0, 64), seed=11, labels=("f32", "q8_0")),
        Case("qwen3_yarn", "qwen3", yarn=(4.0, 64), rope_base=1000.0, seed=12, labels=("f32", "q8_0")),
        # gpt-oss-20b's layout in miniature: 64-wide heads (not n_embd / n_head), even layers in a window of 5 (the prompt
        # has 16 tokens), YaRN x8 over an original context of 64 (pairs 0-9 ramp, the rest interpolated), 4 experts
        # of which 2 per token, 32 wide (MXFP4 blocks), q/k/v biases as the converter writes them.
        Case(
            "gpt-oss",
            "gpt-oss",
            n_layer=4,
            head_dim=64,
            biases=True,
            tied=False,
            window=5,
            n_ctx_train=512,
            yarn=(8.0, 64),
            n_expert=4,
            n_expert_used=2,
            n_ff_exp=32,
            exps_scale=4.0,
            seed=10,
            labels=("f32", "q8_0", "mxfp4"),
        ),
    )
}


def tokenizer() -> dict:
    return json.loads(TOKENIZER_FILE.read_text())


def llama3_rope_freqs(head_dim: int, base: float, factor: float, low: float, high: float, orig: int) -> np.ndarray:
    """rope_freqs (head_dim/2,) f32 exactly as llama.cpp's converter builds it for rope_type llama3."""
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wavelen, high_wavelen = orig / low, orig / high
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def weights(case: Case) -> dict[str, np.ndarray]:
    """GGUF-named float32 weights, before the file stores its matrices as F32 or Q8_0."""
    rng = np.random.default_rng(case.seed)
    q_out, kv_out = case.n_head * case.head_dim, case.n_head_kv * case.head_dim

    def mat(rows, cols, scale=None):
        return rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(scale or 1 / math.sqrt(cols))

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    def bias(n):
        return (0.5 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": mat(VOCAB, case.n_embd, case.embd_std), "output_norm.weight": norm(case.n_embd)}
    if not case.tied:
        w["output.weight"] = mat(VOCAB, case.n_embd, 1.0)  # logits of a few units: clear top-2 gaps
    if case.llama3_rope:
        w["rope_freqs.weight"] = llama3_rope_freqs(case.head_dim, case.rope_base, *case.llama3_rope)
    if case.longrope:
        w["rope_factors_long.weight"] = rng.uniform(1.0, 8.0, case.rot // 2).astype(np.float32)
        w["rope_factors_short.weight"] = rng.uniform(0.8, 2.0, case.rot // 2).astype(np.float32)
    for il in range(case.n_layer):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(case.n_embd)
        if case.arch == "phi3":  # fused: rows q, then k, then v; ffn_up rows gate, then up
            w[p + "attn_qkv.weight"] = mat(q_out + 2 * kv_out, case.n_embd)
        else:
            w[p + "attn_q.weight"] = mat(q_out, case.n_embd)
            w[p + "attn_k.weight"] = mat(kv_out, case.n_embd)
            w[p + "attn_v.weight"] = mat(kv_out, case.n_embd)
        if case.biases:
            w[p + "attn_q.bias"], w[p + "attn_k.bias"], w[p + "attn_v.bias"] = bias(q_out), bias(kv_out), bias(kv_out)
        if case.arch in ("qwen3", "qwen3moe", "gemma3"):
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(case.head_dim), norm(case.head_dim)
        w[p + "attn_output.weight"] = mat(case.n_embd, q_out)
        gpt_oss = case.arch in ("gpt-oss", "gptoss")
        if gpt_oss:  # an output bias, a sink logit per head, post_attention_norm in place of ffn_norm
            w[p + "attn_output.bias"] = bias(case.n_embd)
            w[p + "attn_sinks.weight"] = (1.0 + 1.5 * rng.standard_normal(case.n_head)).astype(np.float32)
            w[p + "post_attention_norm.weight"] = norm(case.n_embd)
        else:
            w[p + "ffn_norm.weight"] = norm(case.n_embd)
        if case.n_expert:  # GGUF's stacked experts: (n_expert, rows, cols)
            e, f = case.n_expert, case.n_ff_exp
            big = case.exps_scale / math.sqrt(case.n_embd)
            w[p + "ffn_gate_inp.weight"] = mat(
                e, case.n_embd, 2 / math.sqrt(case.n_embd)
            )  # router logits of a few units
            w[p + "ffn_gate_exps.weight"] = mat(e * f, case.n_embd, big).reshape(e, f, case.n_embd)
            w[p + "ffn_up_exps.weight"] = mat(e * f, case.n_embd, big).reshape(e, f, case.n_embd)
            w[p + "ffn_down_exps.weight"] = mat(e * case.n_embd, f).reshape(e, case.n_embd, f)
            if gpt_oss:
                w[p + "ffn_gate_inp.bias"] = bias(e)
                w[p + "ffn_gate_exps.bias"] = bias(e * f).reshape(e, f)
                w[p + "ffn_up_exps.bias"] = bias(e * f).reshape(e, f)
                w[p + "ffn_down_exps.bias"] = bias(e * case.n_embd).reshape(e, case.n_embd)
        elif case.arch == "phi3":
            w[p + "ffn_up.weight"] = mat(2 * case.n_ff, case.n_embd)
        else:
            w[p + "ffn_gate.weight"] = mat(case.n_ff, case.n_embd)
            w[p + "ffn_up.weight"] = mat(case.n_ff, case.n_embd)
        if not case.n_expert:
            w[p + "ffn_down.weight"] = mat(case.n_embd, case.n_ff)
        if case.arch in ("gemma2", "gemma3"):
            w[p + "post_attention_norm.weight"], w[p + "post_ffw_norm.weight"] = norm(case.n_embd), norm(case.n_embd)
    return w


# qwen3-embedding's layout in miniature: the qwen3 case with a last-token pooling type (an embedding model), and
# the ids its llama.cpp reference (tests/data/bert/qwen3_last_*.npz, bench/make_bert_reference.py) was taken on.
QWEN3_LAST = replace(CASES["qwen3"], name="qwen3_last", extra={"pooling_type": 3})
QWEN3_LAST_IDS = [3, 17, 42, 99, 7, 250, 31, 64, 12, 5, 200, 77]


def write(path: Path, case: Case, wtype: int = F32, more: dict[str, np.ndarray] | None = None) -> Path:
    """Write the case's GGUF (matrices in wtype, vectors F32) to path; deterministic for a given case. `more`: tensors
    the engine does not use, written in their own dtype after the case's (a vision tower inside the text model's file)."""
    a = case.arch
    wr = gguf.GGUFWriter(str(path), a)
    wr.add_name(f"archgen case {case.seed}")  # not the case name: llama.cpp keys Phi-3 token attributes on "phi3" in it
    wr.add_file_type({F32: 0, MXFP4: 38}.get(wtype, 7))  # llama_ftype ALL_F32 / MOSTLY_MXFP4_MOE / MOSTLY_Q8_0
    add_hparams(wr, case)  # sizes, heads, rope base, eps, key/value length, sliding window
    wr.add_rope_dimension_count(case.rot)
    if case.longrope:
        orig = 256
        wr.add_rope_scaling_orig_ctx_len(orig)
        scale = case.n_ctx_train / orig  # the converter's attn_factor for su/longrope
        wr.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)))
    if case.yarn:
        wr.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        wr.add_rope_scaling_factor(case.yarn[0])
        wr.add_rope_scaling_orig_ctx_len(case.yarn[1])
    if case.attn_softcap:
        wr.add_float32(f"{a}.attn_logit_softcapping", case.attn_softcap)
    if case.final_softcap:
        wr.add_float32(f"{a}.final_logit_softcapping", case.final_softcap)
    if case.n_expert:
        wr.add_expert_count(case.n_expert)
        wr.add_expert_used_count(case.n_expert_used)
        wr.add_expert_feed_forward_length(case.n_ff_exp)
    for suffix, value in case.extra.items():
        (wr.add_float32 if isinstance(value, float) else wr.add_uint32)(f"{a}.{suffix}", value)
    tok = tokenizer()
    wr.add_tokenizer_model(tok["model"])
    wr.add_tokenizer_pre(tok["pre"])
    wr.add_token_list(tok["tokens"])
    wr.add_token_types(tok["token_type"])
    wr.add_token_merges(tok["merges"])
    wr.add_bos_token_id(tok["bos_token_id"])
    wr.add_eos_token_id(tok["eos_token_id"])
    wr.add_unk_token_id(tok["unknown_token_id"])
    wr.add_pad_token_id(tok["padding_token_id"])
    wr.add_add_bos_token(False)
    for name, arr in weights(case).items():
        # llama-quantize keeps the router and biases F32; MXFP4 files hold only their experts in it
        quantized = arr.ndim >= 2 and name.endswith(".weight") and "ffn_gate_inp" not in name
        if quantized and wtype != F32 and (wtype != MXFP4 or "_exps." in name):
            raw = quant.quantize(arr.reshape(-1, arr.shape[-1]), wtype)  # (rows of every expert, row bytes)
            raw = raw.reshape(*arr.shape[:-1], raw.shape[-1])
            wr.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType(wtype))
        else:
            wr.add_tensor(name, arr)
    for name, arr in (more or {}).items():
        wr.add_tensor(name, arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
