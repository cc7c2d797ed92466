"""Random-weight GGUF files with the shapes of real 1B/3B models, quantized by our own quantizer, for speed runs.

    python3 bench/make_model.py --out DIR [--shape 1b|3b|a3b|20b]
                                [--arch llama|qwen2|qwen3|phi3|gemma2|gemma3|qwen3moe|gpt-oss] [--quant q8_0 q4_K_M]

Writes DIR/<arch>-<shape>-<quant>.gguf (~0.8-3.5 GB each: keep DIR outside the repository; gpt-oss:
DIR/gpt-oss-20b-MXFP4_MOE.gguf). Shapes are Llama 3.2's:
1b = n_embd 2048, 16 layers, 32 heads, 8 KV heads, n_ff 8192; 3b = 3072, 28 layers, 24 heads, 8 KV heads, n_ff 8192;
every other dense arch gets the same shape with its own tensor layout (q/k/v biases for qwen2, q/k norms for qwen3,
fused qkv and gate+up plus an untied output for phi3, sandwich norms and soft-capping for gemma2, q/k and sandwich
norms with 512-token windows on five layers in six for gemma3), as
`tests/decoders.py` names them. The MoE shape `a3b` (qwen3moe only, the default for it) is Qwen3-30B-A3B's layer cut to
8 of its 48 layers and 64 of its 128 experts: n_embd 2048, 32 heads of 128, 4 KV heads, 64 experts of n_ff 768, 8
routed per token (2.6B parameters, 0.46B active per token; 1.6 GB at Q4_K_M). The shape `20b` (gpt-oss only, the
default for it) is gpt-oss-20b's layer cut to 4 of its 24 layers: n_embd 2880, 64 heads of 64, 8 KV heads, 32
experts of n_ff 2880 with 4 routed per token, 128-token windows on even layers, YaRN x32 over 4096 positions, rope
base 150000, attention sinks and every bias (q/k/v, output, router, experts); its experts are MXFP4 and the rest
Q8_0, as llama-quantize's MXFP4_MOE and gpt-oss's own GGUF files (3.0 GB, 4.5B parameters; one token reads 0.94 GB,
0.65 of it the output matrix). The tokenizer is SmolLM2's (`tokenizer.ggml.*` copied from the installed file), so
the vocabulary is SmolLM2's 49152 tokens, not Llama 3's 128256: the token embedding / output matrix is 49152 rows;
for gpt-oss the token list is padded with unreachable normal tokens to its 201088 rows.

Each tensor's type comes from `quant.recipe.plan` (llama-quantize's recipe, as `localrt create --quantize` uses
through `localrt.models.quantize`) and its blocks from `quant.quantize`. Values are a seeded normal (std 0.02), norms 1.
Our NumPy K-quantizer takes ~15 min for a 1B Q4_K_M model on this machine, so by default one random draw per
(tensor kind, shape, type) is quantized once and reused by every layer that has it (cached across runs under
DIR/_blocks): every layer still has its own bytes in the file, so the bytes a decode step reads are the same as
with distinct draws; `--distinct` draws every tensor afresh.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fixtures import decoders  # noqa: E402
import gguf_io  # noqa: E402
import quant  # noqa: E402
from gguf_io import GGUFValueType as VT  # noqa: E402
from quant import recipe  # noqa: E402
from quant.formats import GGMLType  # noqa: E402

SHAPES = {
    "1b": dict(n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192),
    "3b": dict(n_embd=3072, n_layer=28, n_head=24, n_head_kv=8, n_ff=8192),
    # Qwen3-30B-A3B's own layer (head_dim 128 > n_embd / n_head; feed_forward_length 6144 is unused by qwen3moe)
    "a3b": dict(
        n_embd=2048,
        n_layer=8,
        n_head=32,
        n_head_kv=4,
        head_dim=128,
        n_ff=6144,
        n_expert=64,
        n_expert_used=8,
        n_ff_exp=768,
    ),
    # gpt-oss-20b's own layer (64 heads of 64 > n_embd 2880, 128-token windows on even layers), 4 of its 24 layers
    "20b": dict(
        n_embd=2880,
        n_layer=4,
        n_head=64,
        n_head_kv=8,
        head_dim=64,
        n_ff=2880,
        n_expert=32,
        n_expert_used=4,
        n_ff_exp=2880,
        n_vocab=201088,
        window=128,
    ),
}
ARCHS = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "qwen3moe", "gpt-oss")
MOE_SHAPES = {"qwen3moe": ("a3b",), "gpt-oss": ("20b",)}  # the archs with experts, each with its own shapes only
DEFAULT_SHAPE = {"qwen3moe": "a3b", "gpt-oss": "20b"}
# per arch: rope base, rms eps, tied output (phi3 ships an output matrix; gemma2 always reads token_embd)
ARCH_META = {
    "llama": (500000.0, 1e-5, True),
    "qwen2": (1000000.0, 1e-6, True),
    "qwen3": (1000000.0, 1e-6, True),
    "phi3": (10000.0, 1e-5, False),
    "gemma2": (10000.0, 1e-6, True),
    "gemma3": (1000000.0, 1e-6, True),
    "qwen3moe": (1000000.0, 1e-6, True),
    "gpt-oss": (150000.0, 1e-5, False),
}
# gpt-oss-20b's YaRN: factor 32 over an original context of 4096 (its 131072-token context)
GPT_OSS_YARN = (32.0, 4096)
GPT_OSS_CTX = 131072
STD = 0.02
N_CTX_TRAIN = 8192
_CHUNK_ELEMENTS = 1 << 22  # elements quantized per call: bounds the quantizer's float temporaries


def smollm2_tokenizer() -> tuple[dict, dict]:
    from localrt.models import builtin_models

    with gguf_io.open(builtin_models.smollm2_path()) as f:
        keys = [k for k in f.metadata if k.startswith("tokenizer.")]
        return {k: f.metadata[k] for k in keys}, {k: f.metadata_types[k] for k in keys}


def head_dim(s: dict) -> int:
    return s.get("head_dim") or s["n_embd"] // s["n_head"]


def tensor_shapes(arch: str, s: dict, tied: bool) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> shape in NumPy order (rows = outputs), for the given arch and shape."""
    e, ff, hd = s["n_embd"], s["n_ff"], head_dim(s)
    q, kv = s["n_head"] * hd, s["n_head_kv"] * hd
    t = {"token_embd.weight": (s["n_vocab"], e), "output_norm.weight": (e,)}
    if not tied:
        t["output.weight"] = (s["n_vocab"], e)
    if arch == "llama":
        t["rope_freqs.weight"] = (hd // 2,)
    for il in range(s["n_layer"]):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = (e,)
        if arch == "phi3":
            t[p + "attn_qkv.weight"] = (q + 2 * kv, e)
        else:
            t[p + "attn_q.weight"], t[p + "attn_k.weight"], t[p + "attn_v.weight"] = (q, e), (kv, e), (kv, e)
        if arch in ("qwen2", "gpt-oss"):
            t[p + "attn_q.bias"], t[p + "attn_k.bias"], t[p + "attn_v.bias"] = (q,), (kv,), (kv,)
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            t[p + "attn_q_norm.weight"], t[p + "attn_k_norm.weight"] = (hd,), (hd,)
        t[p + "attn_output.weight"] = (e, q)
        if arch == "gpt-oss":  # an output bias, a sink logit per head, post_attention_norm as the pre-FFN norm
            t[p + "attn_output.bias"], t[p + "attn_sinks.weight"] = (e,), (s["n_head"],)
            t[p + "post_attention_norm.weight"] = (e,)
        else:
            t[p + "ffn_norm.weight"] = (e,)
        if "n_expert" in s:  # GGUF's stacked experts: (n_expert, rows, cols); the router stays F32
            n, f = s["n_expert"], s["n_ff_exp"]
            t[p + "ffn_gate_inp.weight"] = (n, e)
            t[p + "ffn_gate_exps.weight"], t[p + "ffn_up_exps.weight"] = (n, f, e), (n, f, e)
            t[p + "ffn_down_exps.weight"] = (n, e, f)
            if arch == "gpt-oss":  # biases everywhere: router, gate, up, down
                t[p + "ffn_gate_inp.bias"] = (n,)
                t[p + "ffn_gate_exps.bias"], t[p + "ffn_up_exps.bias"] = (n, f), (n, f)
                t[p + "ffn_down_exps.bias"] = (n, e)
        elif arch == "phi3":
            t[p + "ffn_up.weight"] = (2 * ff, e)
        else:
            t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"] = (ff, e), (ff, e)
        if "n_expert" not in s:
            t[p + "ffn_down.weight"] = (e, ff)
        if arch in ("gemma2", "gemma3"):
            t[p + "post_attention_norm.weight"], t[p + "post_ffw_norm.weight"] = (e,), (e,)
    return t


def metadata(arch: str, s: dict, shape_name: str, qname: str) -> tuple[dict, dict]:
    base, eps, _ = ARCH_META[arch]
    hd = head_dim(s)
    # not the arch in the name: llama.cpp (and we, as it does) key Phi-3's EOG token attributes on "phi3" in it
    md = {"general.architecture": arch, "general.name": f"random weights, {shape_name} shape"}
    u32 = {
        "block_count": s["n_layer"],
        "context_length": N_CTX_TRAIN,
        "embedding_length": s["n_embd"],
        "feed_forward_length": s["n_ff"],
        "attention.head_count": s["n_head"],
        "attention.head_count_kv": s["n_head_kv"],
        "rope.dimension_count": hd,
        "vocab_size": s["n_vocab"],
    }
    f32 = {"rope.freq_base": base, "attention.layer_norm_rms_epsilon": eps}
    if hd != s["n_embd"] // s["n_head"]:
        u32["attention.key_length"] = u32["attention.value_length"] = hd
    if "n_expert" in s:
        u32.update(
            expert_count=s["n_expert"], expert_used_count=s["n_expert_used"], expert_feed_forward_length=s["n_ff_exp"]
        )
    if arch == "gemma2":  # Gemma 2's own values
        u32["attention.sliding_window"] = 4096
        f32["attn_logit_softcapping"], f32["final_logit_softcapping"] = 50.0, 30.0
    if arch == "gemma3":  # Gemma 3 1B's window; five local layers in six (gemma3's default pattern)
        u32["attention.sliding_window"] = 512
    strings = {}
    if arch == "gpt-oss":  # its window on even layers (gpt-oss's fixed pattern) and its YaRN
        u32["attention.sliding_window"] = s["window"]
        u32["context_length"] = GPT_OSS_CTX
        strings["rope.scaling.type"] = "yarn"
        f32["rope.scaling.factor"], u32["rope.scaling.original_context_length"] = GPT_OSS_YARN
    types = {"general.architecture": VT.STRING, "general.name": VT.STRING}
    for k, v in strings.items():
        md[f"{arch}.{k}"], types[f"{arch}.{k}"] = v, VT.STRING
    for k, v in u32.items():
        md[f"{arch}.{k}"], types[f"{arch}.{k}"] = v, VT.UINT32
    for k, v in f32.items():
        md[f"{arch}.{k}"], types[f"{arch}.{k}"] = v, VT.FLOAT32
    tok, tok_types = smollm2_tokenizer()
    md.update(tok)
    types.update(tok_types)
    if s["n_vocab"] > len(tok["tokenizer.ggml.tokens"]):
        md.update(padded_vocab(tok, s["n_vocab"]))
    ft = recipe.get_file_type(qname)
    # llama_ftype MOSTLY_MXFP4_MOE: MXFP4 experts, the rest Q8_0 (llama-quantize's recipe, gpt-oss's own files)
    md["general.quantization_version"], md["general.file_type"] = 2, 38 if arch == "gpt-oss" else ft.value
    types["general.quantization_version"] = types["general.file_type"] = VT.UINT32
    return md, types


def padded_vocab(tok: dict, n_vocab: int) -> dict:
    """SmolLM2's tokenizer keys with its token list padded to n_vocab by normal tokens no merge reaches (texts of
    their own), so the embedding and output matrices have the real model's rows while both runtimes tokenize
    as SmolLM2 does."""
    tokens = list(tok["tokenizer.ggml.tokens"])
    pads = [f"\u00a7pad{i}\u00a7" for i in range(n_vocab - len(tokens))]
    assert not set(pads) & set(tokens)
    types = list(tok["tokenizer.ggml.token_type"]) + [1] * len(pads)  # 1: normal
    return {"tokenizer.ggml.tokens": tokens + pads, "tokenizer.ggml.token_type": types}


def _kind(name: str) -> str:
    return name.split(".", 2)[-1] if name.startswith("blk.") else name


def draw(kind: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(f"{kind}{shape}".encode())])
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(STD)  # shape, float32


def blocks(name: str, shape: tuple[int, ...], target: int, cache: Path | None, seed: int) -> np.ndarray:
    """The tensor's raw blocks (rows, row bytes) in `target`, from the on-disk cache when it has them."""
    path = cache / f"{_kind(name)}_{'x'.join(map(str, shape))}_{target}_{seed}.npy" if cache else None
    if path is not None and path.exists():
        return np.load(path, mmap_mode="r")
    rows, cols = int(np.prod(shape[:-1])), shape[-1]  # a 3-D expert tensor: every expert's rows in turn
    x = draw(_kind(name) if cache else name, shape, seed).reshape(rows, cols)  # (rows, cols) float32
    out = np.empty((rows, quant.row_bytes(target, cols)), np.uint8)  # (rows, target row bytes)
    step = max(1, _CHUNK_ELEMENTS // cols)
    for a in range(0, rows, step):
        out[a : a + step] = quant.quantize(x[a : a + step], target)
    out = out.reshape(*shape[:-1], out.shape[-1])  # (..., rows, target row bytes)
    if path is not None:
        np.save(path, out)
    return out


def vector(name: str, shape: tuple[int, ...], arch: str, s: dict, seed: int) -> np.ndarray:
    if name == "rope_freqs.weight":  # Llama 3.2's rope scaling (factor 32, low 1, high 4, original 8192)
        return decoders.llama3_rope_freqs(head_dim(s), ARCH_META[arch][0], 32.0, 1.0, 4.0, 8192)
    if name.endswith(".bias") or "attn_sinks" in name:
        return draw(name, shape, seed)
    return np.ones(shape, np.float32)  # norms = 1 (Gemma's +1 is already in the file's weights)


def write(out: Path, arch: str, shape_name: str, qname: str, distinct: bool = False, seed: int = 0) -> Path:
    s = dict(SHAPES[shape_name])
    s.setdefault("n_vocab", len(smollm2_tokenizer()[0]["tokenizer.ggml.tokens"]))
    tied = ARCH_META[arch][2]
    shapes = tensor_shapes(arch, s, tied)
    md, types = metadata(arch, s, shape_name, qname)
    source = {n: _source(arch, n, sh) for n, sh in shapes.items()}
    targets = recipe.plan([(n, sh, source[n]) for n, sh in shapes.items()], md, qname)
    cache = None if distinct else out / "_blocks"
    if cache:
        cache.mkdir(parents=True, exist_ok=True)
    dst = out / f"{arch}-{shape_name}-{'MXFP4_MOE' if arch == 'gpt-oss' else qname}.gguf"
    order = recipe.llama_order(shapes)
    with gguf_io.GGUFWriter(dst, md, metadata_types=types) as w:
        for name in order:
            w.add_tensor_info(name, targets[name], shapes[name])
        for i, name in enumerate(order):
            sh = shapes[name]
            if len(sh) == 1 or name.endswith(".bias"):
                w.write_tensor(vector(name, sh, arch, s, seed), name)
            else:
                w.write_tensor(blocks(name, sh, targets[name], cache, seed), name)
            print(f"\r{dst.name}: {i + 1}/{len(order)} {name}".ljust(72), end="", flush=True)
    print()
    return dst


def _source(arch: str, name: str, shape: tuple[int, ...]) -> int:
    """The type a tensor has before quantizing: gpt-oss's experts come as MXFP4 (and keep it), the router and
    every vector (biases, norms, sinks) F32, the other matrices F16."""
    if arch == "gpt-oss" and "_exps.weight" in name:
        return GGMLType.MXFP4
    return GGMLType.F16 if len(shape) > 1 and "ffn_gate_inp" not in name and ".bias" not in name else GGMLType.F32


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), help="default 1b (a3b for qwen3moe)")
    ap.add_argument("--arch", choices=ARCHS, default="llama")
    ap.add_argument("--quant", nargs="+", help="default q8_0 q4_K_M (gpt-oss: q8_0, its files' MXFP4_MOE)")
    ap.add_argument("--distinct", action="store_true", help="draw and quantize every tensor afresh (slow)")
    args = ap.parse_args()
    args.shape = args.shape or DEFAULT_SHAPE.get(args.arch, "1b")
    moe = {sh for shapes in MOE_SHAPES.values() for sh in shapes}
    if args.shape not in MOE_SHAPES.get(args.arch, tuple(sorted(set(SHAPES) - moe))):
        takes = ", ".join(f"{a} takes {sh[0]}" for a, sh in MOE_SHAPES.items())
        sys.exit(
            f"--shape {args.shape} is not a shape for --arch {args.arch} ({takes}, the others "
            f"{', '.join(sorted(set(SHAPES) - moe))})"
        )
    args.quant = args.quant or (["q8_0"] if args.arch == "gpt-oss" else ["q8_0", "q4_K_M"])
    args.out.mkdir(parents=True, exist_ok=True)
    if ROOT in args.out.resolve().parents or args.out.resolve() == ROOT:
        sys.exit("--out must be outside the repository (the files are gigabytes)")
    for qname in args.quant:
        print(write(args.out, args.arch, args.shape, recipe.get_file_type(qname).name, args.distinct))


if __name__ == "__main__":
    main()
