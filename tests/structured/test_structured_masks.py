"""Token masks from the trie walk agree with a brute-force walk of every token, on both real tokenizers;
Constraint bookkeeping (EOG only when complete, bad tokens refused)."""

from __future__ import annotations

import numpy as np
import pytest

from localrt.structured import SchemaError, compile_format, token_index
from localrt.structured.dfa import step
from localrt.engine.tokenizer import Tokenizer

import gguf_io

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}, "any": {}},
    "required": ["name", "n", "any"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def tokenizer(request):
    path = request.getfixturevalue(f"{request.param}_path")
    with gguf_io.open(path) as f:
        return Tokenizer.from_gguf(f.metadata)


def _brute_mask(constraint, max_depth: int = 1 << 30) -> np.ndarray:
    d, ix = constraint.grammar.dfa, constraint.grammar.index
    out = np.zeros(ix.n_vocab, bool)  # (n_vocab,)
    for tok, piece in enumerate(ix.pieces):
        if not piece:
            continue
        state, stack = constraint.state, list(constraint.stack)
        for b in piece:
            state = step(d, state, stack, b, max_depth)
            if state < 0:
                break
        out[tok] = state >= 0
    if constraint.done():
        out[ix.eog] = True
    return out


PREFIXES = [
    "",
    '{"name": "ab',
    '{"name":"abcdefgh"',
    '{"name": "x", "n": -1',
    '{"name": "x", "n": 0, "any": [{"k": [',
    '{"name": "x", "n": 0, "any": {"a": "\\u00',
    '{"name": "x", "n": 0, "any": 1}',
]


def test_trie_walk_equals_brute_force(tokenizer):
    for prefix in PREFIXES:
        c = compile_format(SCHEMA, tokenizer)
        for tok in tokenizer.encode(prefix, add_special=False, parse_special=False):
            c.advance(tok)
        assert c.text.decode() == prefix
        fast = c.allowed_mask()
        np.testing.assert_array_equal(fast, _brute_mask(c), err_msg=prefix)
        assert fast.any()


def test_eog_only_when_complete(tokenizer):
    c = compile_format("json", tokenizer)
    eog = sorted(tokenizer.eog_ids)
    assert not c.allowed_mask()[eog].any() and not c.done()
    for tok in tokenizer.encode('{"a": [1, 2]}', add_special=False, parse_special=False):
        assert not c.allowed_mask()[eog].any()
        c.advance(tok)
    assert c.done() and c.allowed_mask()[eog].all()
    with pytest.raises(SchemaError):
        c.advance(tokenizer.encode("x", add_special=False)[0])
    c.advance(eog[0])


def test_apply_masks_logits(tokenizer):
    c = compile_format({"enum": ["yes", "no"]}, tokenizer)
    logits = np.zeros(tokenizer.n_vocab, np.float32)  # (n_vocab,)
    out = c.apply(logits)
    allowed = np.isfinite(out)
    assert allowed.sum() == c.allowed_mask().sum() > 0
    for tok in np.flatnonzero(allowed):
        assert tokenizer.token_to_piece(int(tok))[:1] == b'"'
    with pytest.raises(SchemaError):  # EOG before the document is complete
        c.advance(sorted(tokenizer.eog_ids)[0])


def test_index_covers_json_syntax(tokenizer):
    """Every printable ASCII byte, tab and newline is a token of its own, so any JSON syntax is spellable."""
    ix = token_index(tokenizer)
    singles = {p for p in ix.pieces if len(p) == 1}
    assert all(bytes([b]) in singles for b in [9, 10, *range(0x20, 0x7F)])
    assert len(ix.ids) == sum(1 for p in ix.pieces if p)


RANDOM_SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "s": {"type": "string", "maxLength": 6},
            "n": {"type": "number"},
            "e": {"enum": ["α", "β", None]},
            "b": {"type": "boolean"},
        },
        "required": ["s", "n", "e"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "string", "pattern": "^[a-c]{1,3}$"}, "minItems": 1, "maxItems": 3},
    {
        "type": "object",
        "properties": {
            "k": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
            "o": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/p"}]},
        },
        "required": ["k", "o"],
        "$defs": {"p": {"type": "object", "properties": {"z": {"const": "é"}}, "required": ["z"]}},
    },
]


@pytest.mark.parametrize("schema", RANDOM_SCHEMAS, ids=range(len(RANDOM_SCHEMAS)))
def test_random_logits_always_produce_valid_documents(tokenizer, schema):
    """Noise for logits and a seeded sampler at temperature 1: any token the mask lets through must keep
    the document valid, whatever the tokenizer splits it into."""
    import json

    import jsonschema

    from localrt.api.options import resolve
    from localrt.engine.sampler import make_sampler
    from localrt.structured import ConstrainedSampler

    eog = tokenizer.eog_ids
    for seed in range(6):
        rng = np.random.default_rng(seed)
        c = compile_format(schema, tokenizer)
        sampler = ConstrainedSampler(make_sampler(resolve({"temperature": 1.0, "seed": seed, "top_k": 50})), c)
        for _ in range(400):
            logits = rng.normal(0, 3, tokenizer.n_vocab).astype(np.float32)  # (n_vocab,)
            if c.done():
                logits[sorted(eog)] += 8  # let most documents end when they may
            if sampler.sample(logits, []) in eog:
                break
        assert c.done(), bytes(c.text)
        jsonschema.validate(json.loads(bytes(c.text).decode("utf-8")), schema)


def test_nesting_depth_bound(tokenizer):
    from localrt.structured.constraint import MAX_STACK

    c = compile_format("json", tokenizer)
    for tok in tokenizer.encode('{"a":' + "[" * (MAX_STACK - 1), add_special=False, parse_special=False):
        c.advance(tok)
    assert len(c.stack) == MAX_STACK
    allowed = c.allowed_mask()
    np.testing.assert_array_equal(allowed, _brute_mask(c, MAX_STACK))
    assert (
        not allowed[tokenizer.encode("[", add_special=False)[0]]
        and allowed[tokenizer.encode("]", add_special=False)[0]]
    )


def test_compact_sampling_draws_as_masked_vocabulary(tokenizer):
    """ConstrainedSampler samples among few allowed ids directly; the draws equal sampling the -inf-masked
    vocabulary with the same seed (penalties on the history included)."""
    from localrt.api.options import resolve
    from localrt.engine.sampler import make_sampler
    from localrt.structured import ConstrainedSampler

    schema = {"enum": ["alpha", "beta", "gamma", "delta", "alphabet"]}
    rng = np.random.default_rng(0)
    for seed in range(8):
        opts = resolve({"temperature": 1.5, "seed": seed, "repeat_penalty": 1.3})
        fast = ConstrainedSampler(make_sampler(opts), compile_format(schema, tokenizer))
        plain, c = make_sampler(opts), compile_format(schema, tokenizer)
        history = [5, 6, 7]
        for _ in range(8):
            logits = rng.normal(0, 2, tokenizer.n_vocab).astype(np.float32)  # (n_vocab,)
            a, b = fast.sample(logits, history), int(plain.sample(c.apply(logits), history))
            assert a == b
            c.advance(b)
            if a in tokenizer.eog_ids:
                break
            history.append(a)
