"""The vocabulary as llama.cpp's `llama_vocab::impl::load` builds it from GGUF metadata.

Token attributes, special ids, the add_bos/add_eos flags and the end-of-generation set follow llama.cpp,
including its text-based auto-detection of EOT/EOM/FIM tokens and the attribute overrides that come with it.
Where llama.cpp iterates an unordered map and several candidate texts exist, the lowest id wins here.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gguf_io import StringArray

from ...errors import ModelLoadError
from .index import RenamedTexts, TokenIndex
from .pretokenize import PreTokenizer, pre_tokenizer
from .ugm import build_tables

# llama_token_attr bits.
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8

# tokenizer.ggml.token_type value (llama_token_type) -> attribute; anything else is UNDEFINED.
_TYPE_TO_ATTR = np.array(
    [ATTR_UNDEFINED, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE],
    dtype=np.int32,
)

SPM, BPE, WPM, UGM = "spm", "bpe", "wpm", "ugm"
_MODEL_KIND = {"llama": SPM, "gpt2": BPE, "bert": WPM, "t5": UGM}

_EOT_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<\uff5cfim\u2581begin\uff5c>",
        "<PRE>",
        "\u2581<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<\uff5cfim\u2581hole\uff5c>",
        "<SUF>",
        "\u2581<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<\uff5cfim\u2581end\uff5c>",
        "<MID>",
        "\u2581<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "[e~[",
)
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss

# GGUF key suffix (after "tokenizer.ggml.") -> special id name; later entries override earlier ones.
_SPECIAL_KEYS = (
    ("bos_token_id", "bos"),
    ("eos_token_id", "eos"),
    ("eot_token_id", "eot"),
    ("eom_token_id", "eom"),
    ("unknown_token_id", "unk"),
    ("seperator_token_id", "sep"),
    ("padding_token_id", "pad"),
    ("mask_token_id", "mask"),
    ("fim_pre_token_id", "fim_pre"),
    ("fim_suf_token_id", "fim_suf"),
    ("fim_mid_token_id", "fim_mid"),
    ("fim_pad_token_id", "fim_pad"),
    ("fim_rep_token_id", "fim_rep"),
    ("fim_sep_token_id", "fim_sep"),
    ("prefix_token_id", "fim_pre"),
    ("suffix_token_id", "fim_suf"),
    ("middle_token_id", "fim_mid"),
)
_DEFAULT_IDS = {
    SPM: {"bos": 1, "eos": 2, "unk": 0},
    BPE: {"bos": 11, "eos": 11},
    WPM: {"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103},  # bert-base: [CLS] [UNK] [SEP] [PAD] [MASK]
    UGM: {"eos": 1, "unk": 2, "pad": 0},  # T5
}


@dataclass
class Vocab:
    kind: str  # SPM, BPE, WPM or UGM
    model: str  # tokenizer.ggml.model
    pre: str  # tokenizer.ggml.pre ("" when absent)
    tokens: Sequence[str]  # (n_vocab,) token texts: a list, or a StringArray over the mapped file
    token_to_id: Mapping[str, int]  # a dict, or a TokenIndex over that StringArray
    scores: array  # (n_vocab,) float32 SPM merge priority, 0.0 when the file has none
    attrs: list[int]  # (n_vocab,) ATTR_* bit sets
    merges: Sequence[str] = field(default_factory=list)  # (n_merges,) "left right" in rank order (BPE)
    pretok: PreTokenizer | None = None  # BPE only
    ids: dict[str, int | None] = field(default_factory=dict)  # bos/eos/eot/eom/unk/sep/pad/mask/fim_*
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False  # read as llama.cpp reads it; only a rerank prompt uses it (runtime.rerank)
    add_space_prefix: bool = False
    lowercase: bool = True  # WPM normalizer options (tokenizer.ggml.normalizer.*)
    strip_accents: bool = True
    remove_extra_whitespaces: bool = False  # UGM normalizer option
    ugm: object | None = None  # UGM only: ugm.UgmTables (charsmap, the Viterbi's tokens, unknown score)
    eog_ids: frozenset[int] = frozenset()
    special_ids: list[int] = field(default_factory=list)  # CONTROL|USER_DEFINED|UNKNOWN, longest text first

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


def _get(md: dict, key: str, default=None):
    return md.get("tokenizer.ggml." + key, default)


def _bool(md: dict, key: str, default: bool) -> bool:
    value = _get(md, key)
    if value is None:
        return default
    if not isinstance(value, (bool, np.bool_, int, np.integer)):
        raise ModelLoadError(f"tokenizer.ggml.{key} must be a bool, got {type(value).__name__}")
    return bool(value)


def _token_texts(md: dict) -> tuple[Sequence[str], Mapping[str, int]]:
    """(id -> text, text -> id). A StringArray vocabulary stays in the mapped file: a `TokenIndex` over it."""
    tokens = _get(md, "tokens")
    if tokens is None:
        raise ModelLoadError("model file has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    if isinstance(tokens, StringArray):
        # llama.cpp renames empty entries so that they can never match text.
        renamed = {int(i): f"[EMPTY_{i}]" for i in np.flatnonzero(tokens.lengths() == 0)}
        return (RenamedTexts(tokens, renamed) if renamed else tokens), TokenIndex(tokens, renamed)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens[:1]):
        raise ModelLoadError("tokenizer.ggml.tokens must be an array of strings")
    if "" in tokens:
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    return tokens, _index(tokens)


def _index(tokens: list[str]) -> dict[str, int]:
    token_to_id = dict(zip(tokens, range(len(tokens))))
    if len(token_to_id) != len(tokens):
        seen: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if t in seen:
                raise ModelLoadError(f"duplicate token in vocabulary: {t!r} has ids {seen[t]} and {i}")
            seen[t] = i
    return token_to_id


def _per_token_array(md: dict, key: str, n: int, kinds: str) -> np.ndarray | None:
    arr = _get(md, key)
    if arr is None:
        return None
    arr = np.asarray(arr)
    if arr.ndim != 1 or arr.dtype.kind not in kinds:
        raise ModelLoadError(f"tokenizer.ggml.{key} has the wrong type ({arr.dtype}, {arr.ndim}-D)")
    if arr.shape[0] < n:
        raise ModelLoadError(f"tokenizer.ggml.{key} has {arr.shape[0]} entries for {n} tokens")
    return arr[:n]


def _attrs(md: dict, n: int) -> np.ndarray:
    types = _per_token_array(md, "token_type", n, "iu")
    if types is None:
        return np.full(n, ATTR_NORMAL, dtype=np.int32)
    in_range = (types >= 0) & (types < len(_TYPE_TO_ATTR))
    return np.where(in_range, _TYPE_TO_ATTR[np.clip(types, 0, len(_TYPE_TO_ATTR) - 1)], ATTR_UNDEFINED)


def _special_ids(md: dict, kind: str, pre: str, n: int) -> dict[str, int | None]:
    ids: dict[str, int | None] = {name: None for _, name in _SPECIAL_KEYS}
    ids.update(_DEFAULT_IDS[kind])
    if kind == BPE and pre in ("glm4", "chatglm-bpe"):
        ids["bos"] = None
    for name, value in ids.items():
        if value is not None and value >= n:
            ids[name] = None  # a default outside the vocabulary is disabled, as llama.cpp does
    for key, name in _SPECIAL_KEYS:
        value = _get(md, key)
        if value is None:
            continue
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise ModelLoadError(f"tokenizer.ggml.{key} must be an integer, got {value!r}")
        if 0 <= int(value) < n:
            ids[name] = int(value)  # an out-of-range id in the file keeps the default (llama.cpp warns)
    return ids


def _first_present(token_to_id: dict[str, int], texts) -> int | None:
    found = [token_to_id[t] for t in texts if t in token_to_id]
    return min(found) if found else None


def _detect_by_text(v: Vocab, attrs: np.ndarray) -> None:
    """Fill eot/eom/fim ids from well-known texts; every token so chosen becomes CONTROL."""
    groups = [("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS)] + list(_FIM_TEXTS.items())
    for name, texts in groups:
        if v.ids[name] is None:
            tid = _first_present(v.token_to_id, texts)
            if tid is not None:
                v.ids[name] = tid
                attrs[tid] |= ATTR_CONTROL


def _eog(v: Vocab, attrs: np.ndarray) -> frozenset[int]:
    eog = {v.ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if v.ids[k] is not None}
    for text in _EOG_TEXTS:
        tid = v.token_to_id.get(text)
        if tid is not None:
            eog.add(tid)
            attrs[tid] |= ATTR_CONTROL
    for text in _ALWAYS_RENDERED:
        tid = v.token_to_id.get(text)
        if tid is not None:
            attrs[tid] = ATTR_USER_DEFINED
    eog |= {v.ids[k] for k in ("eos", "eot", "eom") if v.ids[k] is not None}
    texts = {v.tokens[t]: t for t in eog}
    # o200k_harmony / solar-open: "<|end|>" ends a message there, not the generation.
    if "<|end|>" in texts and (
        ("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
        or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)
    ):
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
    # gemma4 / paddleocr: "</s>" is an ordinary token when "<|tool_response>" exists.
    if "<|tool_response>" in texts and "</s>" in texts:
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = ATTR_NORMAL
    return frozenset(eog)


def _strip_attrs(md: dict, v: Vocab, attrs: np.ndarray) -> None:
    """Per-model LSTRIP/RSTRIP attributes, chosen by llama.cpp from names (not stored in GGUF)."""
    name = str(md.get("general.name", "")).lower()
    arch = str(md.get("general.architecture", ""))

    def set_attr(text: str, bit: int, on: bool) -> None:
        tid = v.token_to_id.get(text)
        if tid is None:
            raise ModelLoadError(f"tokenizer: token {text!r} expected for this model is missing")
        attrs[tid] = attrs[tid] | bit if on else attrs[tid] & ~bit

    if any(s in v.pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        if "<mask>" in v.token_to_id:
            set_attr("<mask>", ATTR_LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        attrs[v.special_ids] |= ATTR_RSTRIP
        set_attr("</s>", ATTR_RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, ATTR_RSTRIP, False)
    elif "modern-bert" in name and "[MASK]" in v.token_to_id:
        set_attr("[MASK]", ATTR_LSTRIP, True)


def _sorted_specials(attrs: np.ndarray, tokens: list[str]) -> list[int]:
    ids = np.flatnonzero(attrs & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)).tolist()
    # Longest text first; llama.cpp's std::sort leaves ties unordered, here ties go by id.
    return sorted(ids, key=lambda i: -len(tokens[i].encode("utf-8")))


def load_vocab(md: dict) -> Vocab:
    model = _get(md, "model")
    if model is None:
        raise ModelLoadError("model file has no tokenizer (tokenizer.ggml.model)")
    kind = _MODEL_KIND.get(model)
    if kind is None:
        raise ModelLoadError(
            f"unsupported tokenizer model {model!r} (supported: llama/SPM, gpt2/BPE, bert/WPM, t5/UGM)"
        )
    pre = str(_get(md, "pre", "") or "")
    tokens, token_to_id = _token_texts(md)
    n = len(tokens)
    scores = _per_token_array(md, "scores", n, "fi")
    scores = scores.astype(np.float32) if scores is not None else np.zeros(n, np.float32)
    attrs = _attrs(md, n).astype(np.int32)
    # array("f"): 4 bytes per score (a list of floats is 32), and each read is the same Python float .tolist() gave
    v = Vocab(
        kind=kind,
        model=model,
        pre=pre,
        tokens=tokens,
        token_to_id=token_to_id,
        scores=array("f", scores.tobytes()),
        attrs=[],
    )
    if kind == BPE:
        merges = _get(md, "merges")
        if not isinstance(merges, (list, StringArray)):
            raise ModelLoadError("BPE tokenizer without tokenizer.ggml.merges (array of strings)")
        v.merges = merges
        v.pretok = pre_tokenizer(pre)
    v.ids = _special_ids(md, kind, pre, n)
    v.add_space_prefix = _bool(md, "add_space_prefix", kind == SPM)
    # WPM ignores add_bos/add_eos when tokenizing (add_special always gives [CLS] ... [SEP]); they are kept as read.
    v.add_bos = _bool(md, "add_bos_token", kind in (SPM, WPM) or (v.pretok is not None and v.pretok.add_bos_default))
    v.add_eos = _bool(md, "add_eos_token", kind == UGM)
    v.add_sep = _bool(md, "add_sep_token", kind == WPM)
    v.lowercase = _bool(md, "normalizer.lowercase", True)
    v.strip_accents = _bool(md, "normalizer.strip_accents", v.lowercase)  # BertNormalizer: follows lowercase
    v.remove_extra_whitespaces = _bool(md, "remove_extra_whitespaces", False)
    if kind == UGM:  # built, as llama.cpp builds it, from the file's token types before the overrides below
        v.ugm = build_tables(md, tokens, attrs.copy(), scores)
    # WPM does not read the flags when tokenizing; its missing [CLS]/[SEP] is refused by encode(add_special=True).
    for flag, name in ((v.add_bos, "bos"), (v.add_eos, "eos"), (v.add_sep, "sep")):
        if flag and v.ids[name] is None and kind != WPM:
            raise ModelLoadError(f"tokenizer.ggml.add_{name}_token is true but the model has no {name} token")
    _detect_by_text(v, attrs)
    v.eog_ids = _eog(v, attrs)
    v.special_ids = _sorted_specials(attrs, tokens)
    _strip_attrs(md, v, attrs)
    v.attrs = attrs.tolist()
    return v
