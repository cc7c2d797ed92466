"""Ollama's published templates against the prompts they are known to produce, and Ollama's prompt
building: messages vs legacy templates, fill-in-middle, tools, history fitting, generate options."""

from __future__ import annotations

import json

import pytest

from localrt.errors import InvalidRequest
from localrt.templates.gotemplate import GoTemplate
from localrt.templates.ollama_exec import collate, execute
from localrt.templates.prompt import (
    GoChatTemplate,
    chat_messages,
    chat_prompt,
    fit_messages,
    generate_prompt,
    load_template,
    render_prompt,
)
from _testpaths import DATA as TESTS_DATA

DATA = TESTS_DATA / "templates"
FAMILIES = ["chatml", "llama3-instruct", "gemma-instruct", "gemma3-instruct", "mistral-instruct", "phi-3", "qwen2.5"]
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello, how are you?"}
A1 = {"role": "assistant", "content": "I'm doing great. How can I help you today?"}
U2 = {"role": "user", "content": "I'd like to show off how chat templating works!"}
CHATS = {"user": [U1], "user-assistant-user": [U1, A1, U2], "system-user-assistant-user": [SYSTEM, U1, A1, U2]}


def fixture_template(family: str) -> str:
    return (DATA / family / "template.gotmpl").read_text()


@pytest.mark.parametrize("case", sorted(CHATS))
@pytest.mark.parametrize("family", FAMILIES)
def test_published_templates_give_known_prompts(family: str, case: str) -> None:
    got = render_prompt(fixture_template(family), "go", CHATS[case])
    expected = (DATA / family / case).read_text()
    if family == "mistral-instruct" and got.endswith(" "):
        got = got[:-1]  # Ollama's own test drops this template's trailing space too
    assert got == expected


LEGACY_MISTRAL = [
    "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] ",
    "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] {{ .Response }}",
    '[INST] {{ if .System }}{{ .System }}\n\n{{ end }}\n{{- range .Messages }}\n{{- if eq .Role "user" }}'
    '{{ .Content }}[/INST] {{ else if eq .Role "assistant" }}{{ .Content }}[INST] {{ end }}\n{{- end }}',
]
HELLO = [
    {"role": "user", "content": "Hello friend!"},
    {"role": "assistant", "content": "Hello human!"},
    {"role": "user", "content": "What is your name?"},
]


@pytest.mark.parametrize("src", LEGACY_MISTRAL)
def test_legacy_and_messages_templates_agree(src: str) -> None:
    assert (
        render_prompt(src, "go", HELLO) == "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] "
    )
    with_system = [{"role": "system", "content": "You are a helpful assistant!"}] + HELLO
    assert render_prompt(src, "go", with_system) == (
        "[INST] You are a helpful assistant!\n\nHello friend![/INST] Hello human![INST] What is your name?[/INST] "
    )


@pytest.mark.parametrize(
    "src",
    [
        "[INST] {{ .Prompt }}[/INST] ",
        "[INST] {{ .Prompt }}[/INST] {{ .Response }}",
        '\n{{- range $i, $m := .Messages }}\n{{- if eq .Role "user" }}[INST] {{ .Content }}[/INST] '
        '{{ else if eq .Role "assistant" }}{{ .Content }}{{ end }}\n{{- end }}',
    ],
)
def test_last_assistant_message_is_continued(src: str) -> None:
    msgs = HELLO + [{"role": "assistant", "content": "My name is Ollama and I"}]
    assert render_prompt(src, "go", msgs) == (
        "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] My name is Ollama and I"
    )


def test_legacy_chatml_cuts_after_response_on_the_last_turn() -> None:
    src = (
        "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ if .Prompt }}<|im_start|>user\n"
        "{{ .Prompt }}<|im_end|>\n{{ end }}<|im_start|>assistant\n{{ .Response }}<|im_end|>\n"
    )
    msgs = [{"role": "system", "content": "You are a helpful assistant!"}] + HELLO
    assert render_prompt(src, "go", msgs) == (
        "<|im_start|>system\nYou are a helpful assistant!<|im_end|>\n<|im_start|>user\nHello friend!<|im_end|>\n"
        "<|im_start|>assistant\nHello human!<|im_end|>\n<|im_start|>user\nWhat is your name?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_fill_in_middle() -> None:
    src = "{{- if .Suffix }}<PRE> {{ .Prompt }} <SUF>{{ .Suffix }} <MID>\n{{- else }}{{ .Prompt }}\n{{- end }}"
    t = GoChatTemplate(src)
    assert t.supports_insert
    assert t.render_insert("def add(", "return x") == "<PRE> def add( <SUF>return x <MID>"
    assert render_prompt(src, "go", [{"role": "user", "content": "hello"}]) == "hello"
    assert generate_prompt(t, "def add(", suffix="return x").text == "<PRE> def add( <SUF>return x <MID>"


def test_collate_merges_same_role_but_not_tool_messages() -> None:
    msgs = [
        {"role": "system", "content": "s1"},
        {"role": "system", "content": "s2"},
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "tool", "content": "t1"},
        {"role": "tool", "content": "t2"},
    ]
    system, merged = collate(msgs)
    assert system == "s1\n\ns2"
    assert [(m["role"], m["content"]) for m in merged] == [
        ("system", "s1\n\ns2"),
        ("user", "a\n\nb"),
        ("tool", "t1"),
        ("tool", "t2"),
    ]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather",
            "parameters": {
                "type": "object",
                "required": ["city"],
                "properties": {"city": {"type": "string", "description": "City name"}},
            },
        },
    }
]
TOOL_CHAT = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What's the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": "22C", "tool_name": "get_weather"},
]


def test_qwen25_tools_round_trip() -> None:
    got = render_prompt(fixture_template("qwen2.5"), "go", TOOL_CHAT, tools=TOOLS)
    function = json.dumps(TOOLS[0]["function"], separators=(",", ":"))
    assert got == (
        "<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more functions to assist with the "
        "user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": ' + function + "}\n</tools>\n\nFor each function call, return a json "
        "object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n22C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_tool_values_print_as_json() -> None:
    src = (
        "{{ range .Messages }}{{ range .ToolCalls }}{{ .Function.Arguments }}{{ end }}{{ end }}|"
        "{{ range .Tools }}{{ .Function.Parameters.Properties }}|{{ . }}{{ end }}|{{ .Tools }}|{{ json .Tools }}"
        "{{ range .Tools }}{{ range $k, $p := .Function.Parameters.Properties }}|{{ $k }}:{{ $p.Type }}"
        ":{{ toTypeScriptType $p }}{{ end }}{{ end }}|{{ range .Messages }}{{ .ToolName }}{{ end }}"
    )
    got = render_prompt(src, "go", TOOL_CHAT, tools=TOOLS).split("|")
    assert json.loads(got[0]) == {"city": "Paris"}
    assert json.loads(got[1]) == TOOLS[0]["function"]["parameters"]["properties"]
    assert json.loads(got[2]) == TOOLS[0]
    assert json.loads(got[3]) == TOOLS and got[3] == got[4]
    assert got[5] == "city:string:string" and got[6] == "get_weather"


def test_tools_need_a_template_that_uses_them() -> None:
    with pytest.raises(InvalidRequest, match="does not support tools"):
        chat_prompt(load_template(fixture_template("chatml"), "go"), [U1], tools=TOOLS)


def test_model_system_and_messages() -> None:
    model_msgs = [{"role": "user", "content": "m1"}, {"role": "assistant", "content": "m2"}]
    msgs = chat_messages([U1], model_system="sys", model_messages=model_msgs)
    assert [m["content"] for m in msgs] == ["sys", "m1", "m2", U1["content"]]
    msgs = chat_messages([SYSTEM, U1], model_system="sys")
    assert [m["content"] for m in msgs] == [SYSTEM["content"], U1["content"]]
    assert chat_messages([{"role": "USER", "content": "x"}])[0]["role"] == "user"


@pytest.mark.parametrize(
    "bad,msg",
    [
        ("nope", "messages must be a list"),
        ([1], "messages[0] must be an object"),
        ([{"role": "user", "content": 3}], "messages[0].content must be a string"),
        ([{"role": "user", "content": "x", "extra": 1}], "unknown field"),
        ([{"role": "user", "content": "x", "images": ["aGk="]}], "does not support images"),
        ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[]"}}]}], "arguments must be"),
    ],
)
def test_bad_messages_are_invalid_requests(bad: object, msg: str) -> None:
    with pytest.raises(InvalidRequest, match=msg.replace("[", r"\[").replace("]", r"\]")):
        chat_messages(bad)


def _history(n: int) -> list[dict]:
    msgs = [{"role": "system", "content": "S" * 10}]
    for i in range(n):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i:03d}" + "x" * 45})
    return msgs


def test_fitting_drops_oldest_non_system_messages() -> None:
    t = load_template(fixture_template("chatml"), "go")
    msgs = chat_messages(_history(21))
    calls = []

    def count(text: str) -> int:
        calls.append(text)
        return len(text) // 10

    full = count(t.render(msgs))
    calls.clear()
    fitted = fit_messages(t, msgs, num_ctx=full // 2, count_tokens=count)
    assert 0 < fitted.n_dropped < 21 and fitted.n_tokens <= full // 2
    assert fitted.text.startswith("<|im_start|>system\nSSSSSSSSSS<|im_end|>\n")
    assert "m020" in fitted.text and "m000" not in fitted.text
    kept = [i for i in range(21) if f"m{i:03d}" in fitted.text]
    assert kept == list(range(fitted.n_dropped, 21))
    assert len(calls) <= 8  # bisection, not one render per message
    assert fitted.text == t.render([msgs[0]] + msgs[1 + fitted.n_dropped :])
    # the first start that fits: keeping one more message would not fit
    assert count(t.render([msgs[0]] + msgs[fitted.n_dropped :])) > full // 2


def test_fitting_keeps_the_tools() -> None:
    """Ollama's chatPrompt renders the tools with every candidate: the dropped turns make room for them."""
    t = load_template(fixture_template("qwen2.5"), "go")
    assert t.supports_tools
    msgs = chat_messages(_history(21))
    tools = [
        {
            "type": "function",
            "function": {
                "name": "look_up_the_weather",
                "description": "W" * 300,
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    count = lambda text: len(text) // 10  # noqa: E731
    full = count(t.render(msgs, tools=tools))
    fitted = fit_messages(t, msgs, tools=tools, num_ctx=full // 2, count_tokens=count)
    assert 0 < fitted.n_dropped < 21 and fitted.n_tokens <= full // 2
    assert "look_up_the_weather" in fitted.text and "W" * 300 in fitted.text and "m020" in fitted.text
    assert fitted.text == t.render([msgs[0]] + msgs[1 + fitted.n_dropped :], tools=tools)


def test_fitting_never_drops_the_latest_message() -> None:
    t = load_template(fixture_template("chatml"), "go")
    msgs = chat_messages(_history(5))
    fitted = fit_messages(t, msgs, num_ctx=1, count_tokens=len)
    assert fitted.n_dropped == 4 and "m004" in fitted.text and "SSSSSSSSSS" in fitted.text
    assert fitted.n_tokens == len(fitted.text) > 1


def test_no_truncation_keeps_everything() -> None:
    t = load_template(fixture_template("chatml"), "go")
    msgs = chat_messages(_history(5))
    fitted = fit_messages(t, msgs, num_ctx=1, count_tokens=len, truncate=False)
    assert fitted.n_dropped == 0 and "m000" in fitted.text


CHATML_LEGACY = (
    "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ if .Prompt }}"
    "<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)


def test_generate_uses_system_prompt_form() -> None:
    t = load_template(CHATML_LEGACY, "go")
    expected = "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert generate_prompt(t, "hi", model_system="sys").text == expected
    assert generate_prompt(t, "hi", system="sys", model_system="other").text == expected
    assert generate_prompt(load_template(fixture_template("chatml"), "go"), "hi", system="sys").text == expected


def test_generate_options() -> None:
    t = load_template(CHATML_LEGACY, "go")
    assert generate_prompt(t, "raw text", raw=True).text == "raw text"
    for kw in ({"system": "s"}, {"template_override": "x"}, {"has_context": True}):
        with pytest.raises(InvalidRequest, match="raw mode does not support"):
            generate_prompt(t, "p", raw=True, **kw)
    with pytest.raises(InvalidRequest, match="does not support insert"):
        generate_prompt(t, "p", suffix="s")
    with pytest.raises(InvalidRequest, match="images"):
        generate_prompt(t, "p", images=["aGk="])
    assert generate_prompt(t, "p", template_override="<{{ .Prompt }}>").text == "<p>"
    assert generate_prompt(None, "as is").text == "as is"


def test_generate_context_and_model_messages() -> None:
    t = load_template(fixture_template("chatml"), "go")
    mm = [{"role": "user", "content": "earlier"}]
    with_mm = generate_prompt(t, "now", model_messages=mm).text
    assert "earlier" in with_mm
    with_ctx = generate_prompt(t, "now", model_messages=mm, context_text="PREV", has_context=True).text
    assert with_ctx.startswith("PREV<|im_start|>user\nnow") and "earlier" not in with_ctx


def test_think_values_reach_the_template() -> None:
    src = "{{ range .Messages }}{{ end }}{{ .Think }} {{ .ThinkLevel }} {{ .IsThinkSet }}"
    assert render_prompt(src, "go", [U1]) == "false  false"
    assert render_prompt(src, "go", [U1], think="high") == "true high true"


def test_messages_template_gets_no_prompt_field() -> None:
    # Ollama passes a map without Prompt in messages mode: it reads as nil
    t = GoTemplate("{{ range .Messages }}{{ end }}{{ .Prompt }}", add_response=True)
    assert execute(t, chat_messages([U1])) == "<no value>"


def test_tool_property_types_and_nested_schema_marshal_like_ollama() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "x": {"type": ["string", "null"], "enum": ["a", None]},
                        "y": {"anyOf": [{"type": "integer"}, {"type": "boolean"}], "description": "<&>"},
                    },
                },
            },
        }
    ]
    src = (
        "{{ range .Messages }}{{ end }}{{ range .Tools }}{{ .Function }}{{ range $k, $p := .Function.Parameters"
        ".Properties }}#{{ $k }}={{ toTypeScriptType $p }}{{ end }}{{ end }}"
    )
    fn, x, y = render_prompt(src, "go", [U1], tools=tools).split("#")
    assert json.loads(fn) == {
        "name": "f",
        "description": "",
        "parameters": {
            "type": "object",
            "properties": {
                "x": {"type": ["string", "null"], "enum": ["a", None]},
                "y": {"anyOf": [{"type": "integer"}, {"type": "boolean"}], "description": "<&>"},
            },
        },
    }
    assert "\\u003c\\u0026\\u003e" in fn  # Go's json escapes HTML characters
    assert (x, y) == ("x=string | null", "y=number | boolean")


@pytest.mark.parametrize(
    "src,tag",
    [
        (fixture_template("qwen2.5"), "<tool_call>"),
        (
            "{{ range .Messages }}{{ if .ToolCalls }}\n[TOOL_CALLS] [{{ range .ToolCalls }}{}{{ end }}]{{ end }}{{ end }}",
            "[TOOL_CALLS] [",
        ),
        ('{{ range .Messages }}{{ if .ToolCalls }}{{ range .ToolCalls }}{"name": 1}{{ end }}{{ end }}{{ end }}', "{"),
        ("{{ if .ToolCalls }}{{ .Content }}<call>{{ end }}", "{"),
        (fixture_template("chatml"), "{"),
    ],
)
def test_tool_call_tag(src: str, tag: str) -> None:
    from localrt.templates.capabilities import tool_call_tag

    assert tool_call_tag(GoTemplate(src)) == tag


def test_capabilities() -> None:
    from localrt.templates.capabilities import capabilities

    assert capabilities(GoTemplate(fixture_template("qwen2.5"))) == {"completion", "tools"}
    assert capabilities(GoTemplate("{{ .Prompt }}{{ .Suffix }}")) == {"completion", "insert"}
