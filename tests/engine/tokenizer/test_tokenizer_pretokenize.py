"""Pre-tokenizer splits for every supported `tokenizer.ggml.pre` value, against llama.cpp's own splits
(recorded through a synthetic fully-merging vocabulary, see bench/make_tokenizer_golden.py)."""

from __future__ import annotations

import json
import logging

import pytest

from localrt.errors import ModelLoadError
from localrt.engine.tokenizer import pretokenize
from _testpaths import DATA

GOLDEN = json.loads((DATA / "tokenizer_golden.json").read_text())
GROUPS = GOLDEN["pre_tokenizers"]
TEXTS = GOLDEN["pre_texts"]


def test_every_supported_name_has_golden_splits():
    names = {n for g in GROUPS for n in g["names"]}
    assert names == set(pretokenize.PRE_TYPES)
    for must in (
        "default",
        "gpt-2",
        "llama3",
        "llama-bpe",
        "qwen2",
        "smollm",
        "deepseek-coder",
        "deepseek-v3",
        "falcon",
        "starcoder",
        "refact",
        "command-r",
        "olmo",
        "dbrx",
        "smaug-bpe",
        "poro-chat",
        "chatglm-bpe",
        "viking",
        "jais",
        "tekken",
        "gpt-4o",
    ):
        assert must in names


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g["names"][0])
def test_splits_match_llamacpp(group):
    for name in group["names"]:
        pats = pretokenize.compiled(pretokenize.pre_tokenizer(name).kind)
        for text, expected in zip(TEXTS, group["splits"]):
            assert pretokenize.split(text, pats) == expected, (name, text)


def test_splits_cover_the_text():
    pats = pretokenize.compiled("llama3")
    for text in TEXTS:
        assert "".join(pretokenize.split(text, pats)) == text


def test_unknown_pre_is_a_load_error():
    with pytest.raises(ModelLoadError, match="unknown pre-tokenizer type 'no-such-pre'"):
        pretokenize.pre_tokenizer("no-such-pre")


def test_missing_pre_falls_back_to_default_with_warning(caplog):
    with caplog.at_level(logging.WARNING):
        pt = pretokenize.pre_tokenizer("")
    assert pt.kind == "default" and "missing" in caplog.text


@pytest.mark.parametrize(
    "name, ignore_merges, clean_spaces, add_bos",
    [
        ("llama-bpe", True, True, True),
        ("smollm", False, False, False),
        ("qwen2", False, False, False),
        ("gpt-2", False, True, False),
        ("tekken", True, False, True),
        ("megrez", False, True, False),
    ],
)
def test_flags_follow_llamacpp(name, ignore_merges, clean_spaces, add_bos):
    pt = pretokenize.pre_tokenizer(name)
    assert (pt.ignore_merges, pt.clean_spaces, pt.add_bos_default) == (ignore_merges, clean_spaces, add_bos)
