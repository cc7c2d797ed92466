"""Modelfile parser and formatter: table tests of Ollama's syntax, errors with line numbers, parameter
types, and format(parse(x)) round trips."""

from __future__ import annotations

import pytest

import modelfile as M
from modelfile.format import go_float


def one(text: str):
    """The single non-FROM command of `FROM m` + text."""
    mf = M.parse("FROM m\n" + text)
    (cmd,) = [c for c in mf.commands if c.name != "from"]
    return cmd


@pytest.mark.parametrize(
    "text, name, args",
    [
        ("SYSTEM hello", "system", "hello"),
        ("system hello", "system", "hello"),
        ("SyStEm hello", "system", "hello"),
        ("SYSTEM   spaced   inside  ", "system", "spaced   inside"),
        ("SYSTEM\thello\t", "system", "hello"),
        ('SYSTEM "quoted"', "system", "quoted"),
        ('SYSTEM " leading and trailing "', "system", " leading and trailing "),
        ('SYSTEM ""', "system", ""),
        ('SYSTEM """triple"""', "system", "triple"),
        ('SYSTEM """a "quote" inside"""', "system", 'a "quote" inside'),
        ('SYSTEM """\nmulti\nline\n"""', "system", "\nmulti\nline\n"),
        ('SYSTEM "two\nlines"', "system", "two\nlines"),
        ("SYSTEM 'single' quotes", "system", "'single' quotes"),
        ("SYSTEM has # not a comment", "system", "has # not a comment"),
        (
            'TEMPLATE """{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"""',
            "template",
            "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}",
        ),
        ("TEMPLATE {{ .Prompt }}", "template", "{{ .Prompt }}"),
        ("LICENSE MIT", "license", "MIT"),
        ("ADAPTER ./lora.gguf", "adapter", "./lora.gguf"),
        ('SYSTEM "a"b"', "system", 'a"b'),
        ('SYSTEM """x""" y"""', "system", 'x""" y'),
        ('SYSTEM "line ends with quote"\n', "system", "line ends with quote"),
        ('SYSTEM "crlf\r\nkept"', "system", "crlf\r\nkept"),
        ("SYSTEM emoji 🙂 and é", "system", "emoji 🙂 and é"),
    ],
)
def test_instruction_arguments(text, name, args):
    cmd = one(text)
    assert (cmd.name, cmd.args) == (name, args)


def test_from_comments_blank_lines_bom_crlf():
    text = "\ufeff# comment\r\n\r\n   # indented comment\r\nfrom  llama3:8b  \r\nPARAMETER temperature 0.5\r\n"
    mf = M.parse(text)
    assert mf.froms == ["llama3:8b"] and mf.parameters == {"temperature": 0.5}
    assert [c.line for c in mf.commands] == [4, 5]


def test_multiline_comment_lookalike_inside_quotes():
    mf = M.parse('FROM m\nSYSTEM """\n# not a comment\nFROM not-a-from\n"""\n')
    assert mf.system == "\n# not a comment\nFROM not-a-from\n" and mf.froms == ["m"]


@pytest.mark.parametrize(
    "line, name, value",
    [
        ("num_ctx 4096", "num_ctx", 4096),
        ("num_ctx +8", "num_ctx", 8),
        ("seed -1", "seed", -1),
        ("temperature 0.7", "temperature", 0.7),
        ("temperature 1", "temperature", 1.0),
        ("top_p .9", "top_p", 0.9),
        ("repeat_penalty 1e0", "repeat_penalty", 1.0),
        ("min_p 5E-2", "min_p", 0.05),
        ("use_mmap true", "use_mmap", True),
        ("use_mmap F", "use_mmap", False),
        ("use_mmap 1", "use_mmap", True),
        ("stop <|im_end|>", "stop", ["<|im_end|>"]),
        ('stop "<|eot_id|>"', "stop", ["<|eot_id|>"]),
        ('stop " "', "stop", [" "]),
        ("num_gpu 0", "num_gpu", 0),
        ("main_gpu 1", "main_gpu", 1),
        ("num_thread 4", "num_thread", 4),
        ("num_keep 4", "num_keep", 4),
        ("num_batch 512", "num_batch", 512),
        ("num_predict -2", "num_predict", -2),
        ("top_k 40", "top_k", 40),
        ("typical_p 1.0", "typical_p", 1.0),
        ("repeat_last_n 64", "repeat_last_n", 64),
        ("presence_penalty 0", "presence_penalty", 0.0),
        ("frequency_penalty -0.5", "frequency_penalty", -0.5),
    ],
)
def test_parameter_types(line, name, value):
    mf = M.parse(f"FROM m\nPARAMETER {line}\n")
    assert mf.parameters == {name: value}
    assert type(mf.parameters[name]) is type(value)


def test_stop_accumulates_and_last_scalar_wins_with_warning():
    mf = M.parse("FROM m\nPARAMETER stop a\nPARAMETER temperature 1\nPARAMETER stop b\nPARAMETER temperature 2\n")
    assert mf.parameters == {"stop": ["a", "b"], "temperature": 2.0}
    assert mf.warnings == ["(line 5): PARAMETER temperature is set again (first on line 3); the last one is used"]


@pytest.mark.parametrize("name", sorted(M.DEPRECATED))
def test_deprecated_parameters_warn_and_are_skipped(name):
    mf = M.parse(f"FROM m\nPARAMETER {name} 1\n")
    assert mf.parameters == {}
    assert mf.warnings == [f"(line 2): parameter {name} is deprecated and is ignored"]


def test_repeated_template_and_system_warn():
    mf = M.parse("FROM m\nSYSTEM a\nSYSTEM b\nTEMPLATE x\nTEMPLATE y\n")
    assert (mf.system, mf.template) == ("b", "y") and len(mf.warnings) == 2


def test_messages_and_licenses_keep_order():
    mf = M.parse(
        'FROM m\nMESSAGE user hi\nLICENSE A\nMESSAGE assistant """hello\nthere"""\nLICENSE B\nMESSAGE system s\n'
    )
    assert mf.messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello\nthere"},
        {"role": "system", "content": "s"},
    ]
    assert mf.licenses == ["A", "B"]


@pytest.mark.parametrize(
    "text, line, msg",
    [
        ("SYSTEM hi\n", 0, "no FROM line"),
        ("", 0, "no FROM line"),
        ("# only a comment\n", 0, "no FROM line"),
        ("FROM m\nBOGUS x\n", 2, "command must be one of"),
        ('FROM m\n"SYSTEM" x\n', 2, "command must be one of"),
        ("FROM m\nSYSTEM\n", 2, "has no value"),
        ("FROM m\nSYSTEM   \n", 2, "has no value"),
        ("FROM\n", 1, "has no value"),
        ("FROM m\nSYSTEM: x\n", 2, "must be followed by a space"),
        ("FROM m\nPARAMETER temperature\n", 2, "has no value"),
        ("FROM m\nPARAMETER\n", 2, "has no value"),
        ("FROM m\nPARAMETER  \n", 2, "has no value"),
        ("FROM m\nPARAMETER temperature 1 # comment\n", 2, "invalid float value"),
        ("FROM m\nPARAMETER temperature hot\n", 2, "invalid float value"),
        ("FROM m\nPARAMETER temperature nan\n", 2, "invalid float value"),
        ("FROM m\nPARAMETER temperature inf\n", 2, "invalid float value"),
        ("FROM m\nPARAMETER temperature 1_0\n", 2, "invalid float value"),
        ("FROM m\nPARAMETER num_ctx 4096.5\n", 2, "invalid int value"),
        ("FROM m\nPARAMETER num_ctx 0x10\n", 2, "invalid int value"),
        ("FROM m\nPARAMETER num_ctx 99999999999999999999\n", 2, "invalid int value"),
        ("FROM m\nPARAMETER use_mmap yes\n", 2, "invalid bool value"),
        ("FROM m\nPARAMETER Temperature 1\n", 2, "unknown parameter 'Temperature'"),
        ("FROM m\nPARAMETER draft_p_min 4\n", 2, "unknown parameter"),
        ("FROM m\nPARAMETER bad-name 1\n", 2, "must be followed by a space"),
        ("FROM m\nMESSAGE User hi\n", 2, "message role must be one of"),
        ("FROM m\nMESSAGE tool hi\n", 2, "message role must be one of"),
        ("FROM m\nMESSAGE user\n", 2, "has no value"),
        ('FROM m\nSYSTEM "unterminated\nstill\n', 2, "unterminated quoted string"),
        ('FROM m\nSYSTEM """unterminated"\n', 2, "unterminated quoted string"),
        ("FROM m\nSYSTEM a\x00b\n", 2, "control character U+0000"),
        ("FROM m\n\nSYSTEM a\x1bb\n", 3, "control character U+001B"),
        ("FROM m\nRENDERER qwen3\n", 2, "RENDERER is an Ollama instruction that localrt does not support"),
        ("FROM m\nREQUIRES 0.14.0\n", 2, "REQUIRES"),
        ("FROM m\nDRAFT ./d.gguf\n", 2, "DRAFT"),
        ("FROM m\nPARSER x\n", 2, "PARSER"),
    ],
)
def test_errors_have_line_numbers(text, line, msg):
    with pytest.raises(M.ModelfileError) as e:
        M.parse(text)
    assert e.value.line == line and msg in str(e.value)
    assert isinstance(e.value, ValueError)
    if line:
        assert str(e.value).startswith(f"(line {line}): ")


def test_non_text_and_oversized_input():
    with pytest.raises(M.ModelfileError):
        M.parse(b"FROM m")  # type: ignore[arg-type]


# ----- formatter ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, quoted",
    [
        ("plain", "plain"),
        ("inner spaces ok", "inner spaces ok"),
        ("<|im_end|>", "<|im_end|>"),
        ("two\nlines", '"two\nlines"'),
        (" leading", '" leading"'),
        ("trailing ", '"trailing "'),
        ('has "quote" and\nnewline', '"""has "quote" and\nnewline"""'),
        ("", '""'),
        ('"starts with quote', '""""starts with quote"""'),
        ("\ttab", '"\ttab"'),
        ('line ends in quote"\nnext', '"""line ends in quote"\nnext"""'),
    ],
)
def test_quote(value, quoted):
    assert M.quote(value) == quoted
    assert M.parse(f"FROM m\nSYSTEM {quoted}\n").system == value


def test_quote_refuses_what_cannot_round_trip():
    with pytest.raises(ValueError):
        M.quote('a"\nb"""\nc')


@pytest.mark.parametrize(
    "x, text",
    [
        (0.7, "0.7"),
        (1.0, "1"),
        (0.0, "0"),
        (-2.5, "-2.5"),
        (100000.0, "100000"),
        (1e6, "1e+06"),
        (123456789.0, "1.23456789e+08"),
        (1e-4, "0.0001"),
        (1e-5, "1e-05"),
        (0.95, "0.95"),
    ],
)
def test_go_float(x, text):
    assert go_float(x) == text


FULL = '''FROM ./model.gguf
ADAPTER ./lora.gguf
TEMPLATE """{{- range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
"""
SYSTEM """You are "helpful".
Be brief."""
PARAMETER temperature 0.7
PARAMETER stop <|im_start|>
PARAMETER stop <|im_end|>
PARAMETER num_ctx 4096
PARAMETER use_mmap false
LICENSE """MIT
full text"""
LICENSE second
MESSAGE user hi
MESSAGE assistant "hello there "
'''


def test_format_is_canonical_and_round_trips():
    mf = M.parse(FULL)
    out = M.format(mf)
    assert out == (
        'FROM ./model.gguf\nADAPTER ./lora.gguf\nTEMPLATE "{{- range .Messages }}<|im_start|>{{ .Role }}\n'
        '{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"\n'
        'SYSTEM """You are "helpful".\nBe brief."""\n'
        "PARAMETER temperature 0.7\nPARAMETER stop <|im_start|>\nPARAMETER stop <|im_end|>\n"
        "PARAMETER num_ctx 4096\nPARAMETER use_mmap false\n"
        'LICENSE "MIT\nfull text"\nLICENSE second\nMESSAGE user hi\nMESSAGE assistant "hello there "\n'
    )
    again = M.parse(out)
    assert again.canonical() == mf.canonical()
    assert M.format(again) == out


def test_format_show_header_and_order():
    mf = M.parse("MESSAGE user x\nPARAMETER top_k 5\nSYSTEM s\nFROM m\nTEMPLATE t\n")
    out = M.format(mf, show_name="m:latest")
    assert out.splitlines() == [
        '# Modelfile generated by "localrt show"',
        "# To build a new Modelfile based on this, replace FROM with:",
        "# FROM m:latest",
        "",
        "FROM m",
        "TEMPLATE t",
        "SYSTEM s",
        "PARAMETER top_k 5",
        "MESSAGE user x",
    ]
    assert M.parse(out).canonical() == mf.canonical()


def test_build_from_stored_layers_round_trips():
    params = {"stop": ["<|eot_id|>", "<|end|>"], "temperature": 1, "num_ctx": 8192, "use_mmap": True}
    mf = M.build(
        ["/models/blobs/sha256-" + "a" * 64],
        template="{{ .Prompt }}",
        system=" sys ",
        parameters=params,
        licenses=["L"],
        messages=[{"role": "user", "content": "q"}],
    )
    again = M.parse(M.format(mf))
    assert again.parameters == {
        "stop": ["<|eot_id|>", "<|end|>"],
        "temperature": 1.0,
        "num_ctx": 8192,
        "use_mmap": True,
    }
    assert (again.system, again.template, again.licenses) == (" sys ", "{{ .Prompt }}", ["L"])
    with pytest.raises(ValueError, match="deprecated parameter 'mirostat'"):
        M.build(["m"], parameters={"mirostat": 1})
    lenient = M.build(["m"], parameters={"penalize_newline": False, "draft_x": 1, "top_k": 3}, strict=False)
    assert lenient.parameters == {"top_k": 3} and lenient.warnings == [
        "parameter penalize_newline is deprecated and is left out",
        "parameter draft_x is unknown and is left out",
    ]
    with pytest.raises(ValueError, match="should be int"):
        M.build(["m"], parameters={"num_ctx": "big"})
    with pytest.raises(ValueError, match="message role"):
        M.build(["m"], messages=[{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match="message role"):
        M.build(["m"], messages=[{"role": "user", "content": None}])


def test_format_parameters_like_api_show():
    text = M.format_parameters({"num_ctx": 4096, "stop": ["<|a|>", "b"], "temperature": 0.7})
    assert text.splitlines() == [
        "num_ctx" + " " * 24 + "4096",
        "stop" + " " * 27 + '"<|a|>"',
        "stop" + " " * 27 + '"b"',
        "temperature" + " " * 20 + "0.7",
    ]


SAMPLES = [
    FULL,
    'FROM llama3.2\nPARAMETER stop """\n"""\n',
    'FROM m\nSYSTEM """""nested""" quotes"""\n',
    'FROM m\nMESSAGE system " spaced "\nMESSAGE user ""\n',
    "FROM /abs/path with spaces/m.gguf\n",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_samples(text):
    mf = M.parse(text)
    assert M.parse(M.format(mf)).canonical() == mf.canonical()


def test_round_trip_property():
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as s

    alphabet = s.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\x01\x1b\x7f\x0b\x0c")
    texts = s.text(alphabet=s.sampled_from(list(' "\n\tab#\r')) | alphabet, max_size=30)

    @hypothesis.given(texts, texts)
    @hypothesis.settings(max_examples=300, deadline=None)
    def check(system, message):
        mf = M.build(["m"], system=system, messages=[{"role": "user", "content": message}])
        try:
            out = M.format(mf)
        except ValueError:
            return  # refused loudly, never written wrong
        again = M.parse(out)
        assert again.system == system and again.messages[0]["content"] == message

    check()


# ----- /api/create request bodies -----------------------------------------------------------------------

D = "sha256:" + "b" * 64


def test_from_create_request_full():
    mf = M.from_create_request(
        {
            "model": "x",
            "files": {"model.gguf": D},
            "adapters": {"lora.gguf": D},
            "template": "{{ .Prompt }}",
            "system": "s",
            "parameters": {"temperature": 1, "stop": "<|end|>", "num_ctx": 4096.0, "mirostat": 1},
            "license": "MIT",
            "messages": [{"role": "user", "content": "hi"}],
        }
    )
    assert mf.froms == ["@" + D] and mf.adapters == ["@" + D]
    assert (mf.template, mf.system, mf.licenses) == ("{{ .Prompt }}", "s", ["MIT"])
    assert mf.parameters == {"temperature": 1.0, "stop": ["<|end|>"], "num_ctx": 4096}
    assert mf.messages == [{"role": "user", "content": "hi"}]
    assert mf.warnings == ["parameter mirostat is deprecated and is ignored"]
    assert M.parse(M.format(mf)).canonical() == mf.canonical()


@pytest.mark.parametrize(
    "body, msg",
    [
        ({}, "neither 'from' or 'files' was specified"),
        ({"from": "m", "files": {"a.gguf": D}}, "either 'from' or 'files'"),
        ({"files": {"../a.gguf": D}}, "file path must be relative"),
        ({"files": {"/etc/a.gguf": D}}, "file path must be relative"),
        ({"files": {"C:/a.gguf": D}}, "file path must be relative"),
        ({"files": ["a"]}, "must be an object"),
        ({"from": "m", "parameters": {"nope": 1}}, "unknown parameter 'nope'"),
        ({"from": "m", "parameters": {"num_ctx": "big"}}, "should be int"),
        ({"from": "m", "parameters": {"temperature": True}}, "should be float"),
        ({"from": "m", "parameters": {"stop": [1]}}, "should be string list"),
        ({"from": "m", "parameters": []}, "must be an object"),
        ({"from": "m", "messages": [{"role": "tool", "content": "x"}]}, "message role"),
        ({"from": "m", "messages": [{"role": "user", "content": 5}]}, "string 'content'"),
        ({"from": "m", "license": [1]}, "'license'"),
        ({"from": 5}, "'from' must be a string"),
        ("not a dict", "JSON object"),
    ],
)
def test_from_create_request_errors(body, msg):
    with pytest.raises(M.ModelfileError, match=msg):
        M.from_create_request(body)


def test_command_message_tuple():
    mf = M.parse("FROM m\nMESSAGE user hi\n")
    assert mf.commands[1].message == ("user", "hi") and mf.commands[0].message is None
