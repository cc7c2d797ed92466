"""Request bodies as third-party clients put them on the wire, one entry per (client, call), each with where in the
client's source the body is built. `MODEL` and `TOOLS_MODEL` are filled in by the test; `ignored` lists the keys
the daemon must name in its warning line (Ollama would ignore them too); `stream` says how the reply is framed.

Clients that go through the official `ollama` package (langchain-ollama, llm-ollama) are written as that package
sends them: `tools: []` always, None options left out, and message keys it does not model (`images: []` when
empty, a tool result's `name`, `tool_call_id` in ollama 0.6) dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MODEL = "smollm2:135m"
TOOLS_MODEL = "hermes-tools"  # created by the test with a template that renders tools

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@dataclass(frozen=True)
class Case:
    client: str
    source: str  # file and function in the client's repository that builds this body
    path: str
    body: dict
    stream: bool
    ignored: tuple[str, ...] = ()
    headers: dict = field(default_factory=dict)


CASES = [
    Case(
        "litellm ollama_chat/",
        "litellm/llms/ollama/chat/transformation.py OllamaChatConfig.transform_request",
        "/api/chat",
        {
            "model": MODEL,
            "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}],
            # map_openai_params: max_tokens -> num_predict, frequency_penalty -> repeat_penalty,
            # reasoning_effort -> think (left inside options)
            "options": {"num_predict": 4, "temperature": 0.2, "repeat_penalty": 1.0, "seed": 7, "think": True},
            "stream": True,
        },
        stream=True,
        ignored=("options.think",),
    ),
    Case(
        "litellm ollama_chat/ (replayed reasoning)",
        "litellm/llms/ollama/chat/transformation.py transform_request (_extract_reasoning_content -> thinking)",
        "/api/chat",
        {
            "model": MODEL,
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "thinking": "Add them.", "content": "4"},
                {"role": "user", "content": "Thanks"},
            ],
            "options": {"num_predict": 2, "stop": ["\n\n"]},
            "stream": False,
            "keep_alive": "10m",
        },
        stream=False,
    ),
    Case(
        "litellm ollama/",
        "litellm/llms/ollama/completion/transformation.py OllamaConfig.transform_request",
        "/api/generate",
        # optional_params go into options whole: a keep_alive litellm was given ends up there
        {
            "model": MODEL,
            "prompt": "### User:\nhi\n\n",
            "options": {"num_predict": 4, "temperature": 0.7, "keep_alive": "5m"},
            "stream": False,
        },
        stream=False,
        ignored=("options.keep_alive",),
    ),
    Case(
        "langchain-ollama ChatOllama",
        "libs/partners/ollama/langchain_ollama/chat_models.py ChatOllama._chat_params",
        "/api/chat",
        {
            "model": MODEL,
            "stream": True,
            "options": {
                "mirostat": 0,
                "num_ctx": 2048,
                "num_predict": 4,
                "temperature": 0.0,
                "tfs_z": 1.0,
                "top_k": 10,
            },
            "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "hi"}],
            "tools": [],
        },
        stream=True,
        ignored=("options.mirostat", "options.tfs_z"),
    ),
    Case(
        "langchain-ollama OllamaLLM",
        "libs/partners/ollama/langchain_ollama/llms.py OllamaLLM._generate_params",
        "/api/generate",
        {"model": MODEL, "prompt": "Once upon a time", "stream": True, "options": {"num_predict": 3, "stop": ["\n"]}},
        stream=True,
    ),
    Case(
        "llm-ollama",
        "llm_ollama/__init__.py _SharedOllama.build_messages / _prepare_chat_kwargs",
        "/api/chat",
        {
            "model": TOOLS_MODEL,
            "stream": True,
            "options": {"temperature": 0.5, "num_predict": 4, "draft_num_predict": 4},
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
                },
                {"role": "tool", "content": "12C, rain"},
            ],
            "tools": [WEATHER_TOOL],
        },
        stream=True,
    ),  # draft_num_predict is honoured now (speculative decoding): no warning
    Case(
        "pydantic-ai OpenAIChatModel (stream, tools)",
        "pydantic_ai_slim/pydantic_ai/models/openai.py OpenAIChatModel._completions_create",
        "/v1/chat/completions",
        {
            "model": TOOLS_MODEL,
            "messages": [
                {"role": "system", "content": "Be concise."},
                {"role": "user", "content": "What is the weather in Oslo?"},
            ],
            "stream": True,
            "stream_options": {"include_usage": True},
            "tools": [WEATHER_TOOL],
            "tool_choice": "auto",
            "max_completion_tokens": 4,
        },
        stream=True,
        headers={"User-Agent": "pydantic-ai/1.0"},
    ),
    Case(
        "pydantic-ai OpenAIChatModel (tool result and replayed reasoning)",
        "pydantic_ai_slim/pydantic_ai/models/openai.py _MapModelResponseContext / _map_user_message",
        "/v1/chat/completions",
        {
            "model": TOOLS_MODEL,
            "stream": False,
            "max_completion_tokens": 4,
            "tools": [WEATHER_TOOL],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "What is the weather in Oslo?"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning": "I should call the tool.",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "12C, rain"},
            ],
        },
        stream=False,
    ),
    Case(
        "openai-python chat.completions.create (newer request fields)",
        "src/openai/resources/chat/completions/completions.py Completions.create",
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [
                {"role": "developer", "content": "Be terse."},
                {"role": "user", "content": "hi", "name": "alice"},
            ],
            "max_completion_tokens": 4,
            "service_tier": "auto",
            "metadata": {"run": "7"},
            "store": False,
            "prompt_cache_key": "session-1",
            "safety_identifier": "user-42",
            "verbosity": "low",
            "reasoning_effort": "none",
            "functions": None,
            "seed": 1,
            "top_p": 0.9,
        },
        stream=False,
        ignored=(
            "service_tier",
            "metadata",
            "store",
            "prompt_cache_key",
            "safety_identifier",
            "verbosity",
            "messages[].name",
        ),
    ),
    Case(
        "litellm openai/ (an OpenAI-compatible provider)",
        "litellm/llms/openai/openai.py (provider-specific params forwarded in the body)",
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "top_k": 20,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        stream=True,
    ),
    Case(
        "openai-python responses.create (a replayed tool call)",
        "src/openai/resources/responses/responses.py Responses.create",
        "/v1/responses",
        {
            "model": MODEL,
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            ],
            "instructions": "You are terse.",
            "max_output_tokens": 4,
            "metadata": {"run": "1"},
            "store": False,
            "temperature": 0.2,
            "tools": [
                {
                    "type": "function",
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters": WEATHER_TOOL["function"]["parameters"],
                    "strict": False,
                }
            ],
        },
        stream=False,
        ignored=("store",),
    ),
    Case(
        "openai-python responses.stream",
        "src/openai/resources/responses/responses.py Responses.stream",
        "/v1/responses",
        {"model": MODEL, "stream": True, "input": "hi", "max_output_tokens": 4, "text": {"format": {"type": "text"}}},
        stream=True,
    ),
    Case(
        "vLLM-style sampling on /v1/completions",
        "openai-python completions.create(extra_body={...})",
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": "The capital of France is",
            "max_tokens": 3,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "top_k": 40,
            "stream": False,
            "user": "u1",
        },
        stream=False,
    ),
]
