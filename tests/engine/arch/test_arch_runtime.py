"""Every architecture tests/decoders.py makes, through the rest of the runtime on its tiny random-weight GGUF.

The memory estimate's KV cache is the architecture's own layout (a ring for sliding-window layers) and equals what
the loader allocates; through a real daemon, `create --quantize` (Q4_K_M and IQ4_XS) of the F32 file makes a model
that `show` describes by its family, parameter count and quantization (model_info with the file's `<arch>.*` keys)
and that generates; a `format` JSON schema and a forced tool call (`tool_choice: required`, the built-in
ChatML/Hermes template) both come back schema-valid although random weights produce garbage text: the constraint,
not the model, makes them valid. The logits themselves are checked against llama.cpp in test_arch_fixtures.py.
"""

from __future__ import annotations

import hashlib
import json

import gguf
import httpx
import jsonschema
import pytest

from fixtures import decoders
from _daemon_fakes import pinned_daemon
from localrt.engine.loader import load_model
from localrt.models.builtins import SMOLLM2_TEMPLATE
from localrt.models.gguf_facts import human_number
from localrt.runtime.service import estimate_memory

NAMES = list(decoders.CASES)
LEVELS = {"q4_K_M": ("Q4_K_M", 15), "iq4_xs": ("IQ4_XS", 30)}  # create's level -> (show's name, general.file_type)
N_BATCH = 32  # below the cases' n_ctx, so a sliding-window layer's ring (window + n_batch) is smaller than n_ctx
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["answer", "confidence"],
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 9},
    },
}
# Whitespace is bounded (up to a newline and 20 spaces or tabs between tokens, as llama.cpp's schema grammar), and
# random weights like it: enough tokens that even all-whitespace choices finish the document within the budget.
MAX_TOKENS = 400
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city"],
            "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
        },
    },
}


def _kv_bytes(case: decoders.Case, n_ctx: int, n_batch: int) -> int:
    """K and V of every layer as the architecture lays them out: f16, (n_head_kv, positions, head_dim) each, where
    a sliding-window layer (gemma2's and gpt-oss's even ones, gemma3's five in six) keeps window + n_batch positions
    and every other layer n_ctx."""
    total = 0
    for il in range(case.n_layer):
        local = (case.arch in ("gemma2", "gpt-oss") and il % 2 == 0) or (case.arch == "gemma3" and il % 6 < 5)
        positions = min(n_ctx, case.window + n_batch) if local else n_ctx
        total += positions * case.n_head_kv * 2 * case.head_dim * 2
    return total


@pytest.mark.parametrize("name", NAMES)
def test_memory_estimate_is_the_architectures_kv_layout(tmp_path, name):
    case = decoders.CASES[name]
    path = decoders.write(tmp_path / "m.gguf", case, decoders.Q8_0)
    one, two = (estimate_memory(path, num_ctx=case.n_ctx, num_batch=N_BATCH, n_slots=n) for n in (1, 2))
    kv = _kv_bytes(case, case.n_ctx, N_BATCH)
    assert two.private - one.private == kv  # each slot adds exactly one KV cache
    assert one.private > kv  # and the batch scratch comes on top
    if case.window:
        assert kv < _kv_bytes(case, case.n_ctx, case.n_ctx)  # the ring really is smaller than a full layer
    tensor_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)  # gguf-py's reading of the file
    assert one.mapped == tensor_bytes
    model = load_model(path, num_ctx=case.n_ctx, num_batch=N_BATCH, num_gpu=0)
    try:
        assert model.cache.nbytes == kv  # what the loader allocates is what was estimated
    finally:
        model.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with pinned_daemon(tmp_path_factory.mktemp("models")) as srv:  # the real loader, quantizer and templates
        yield srv


@pytest.fixture(scope="module")
def created(daemon, tmp_path_factory):
    """create(name, level) -> the daemon's model name: the case's F32 file uploaded and created with --quantize."""
    root, done = tmp_path_factory.mktemp("f32"), {}

    def create(name: str, level: str) -> str:
        if (name, level) not in done:
            case = decoders.CASES[name]
            data = decoders.write(root / f"{name}.gguf", case, decoders.F32).read_bytes()
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            r = httpx.post(f"{daemon.url}/api/blobs/{digest}", content=data, timeout=60)
            assert r.status_code in (200, 201), r.text
            model = f"{name.replace('_', '-')}-{level.lower().replace('_', '-')}"
            body = {
                "model": model,
                "files": {f"{name}.gguf": digest},
                "quantize": level,
                "stream": False,
                "template": SMOLLM2_TEMPLATE,
                "parameters": {"num_ctx": case.n_ctx_train},
            }  # the tools prompt: ~400
            r = httpx.post(daemon.url + "/api/create", json=body, timeout=300)
            assert r.status_code == 200, r.text
            done[name, level] = model
        return done[name, level]

    return create


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("name", NAMES)
def test_create_quantize_then_show_and_generate(daemon, created, name, level):
    case = decoders.CASES[name]
    model = created(name, level)
    shown = httpx.post(daemon.url + "/api/show", json={"model": model}, timeout=60).json()
    n_params = sum(a.size for a in decoders.weights(case).values())
    label, file_type = LEVELS[level]
    d = shown["details"]
    assert (d["format"], d["family"], d["families"]) == ("gguf", case.arch, [case.arch])
    assert (d["parameter_size"], d["quantization_level"]) == (human_number(n_params), label)
    info, a = shown["model_info"], case.arch
    assert (info["general.architecture"], info["general.parameter_count"], info["general.file_type"]) == (
        a,
        n_params,
        file_type,
    )
    assert (info[f"{a}.block_count"], info[f"{a}.embedding_length"], info[f"{a}.attention.head_count_kv"]) == (
        case.n_layer,
        case.n_embd,
        case.n_head_kv,
    )
    if case.n_expert:
        assert (info[f"{a}.expert_count"], info[f"{a}.expert_used_count"]) == (case.n_expert, case.n_expert_used)
    if case.window:
        assert info[f"{a}.attention.sliding_window"] == case.window
    assert "tools" in shown["capabilities"]
    body = {
        "model": model,
        "prompt": "The",
        "raw": True,
        "stream": False,
        "options": {"num_predict": 4, "temperature": 0, "seed": 1},
    }
    r = httpx.post(daemon.url + "/api/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["done"] and out["prompt_eval_count"] >= 1 and 1 <= out["eval_count"] <= 4, out


@pytest.mark.parametrize("name", NAMES)
def test_structured_output_is_schema_valid(daemon, created, name):
    body = {
        "model": created(name, "q4_K_M"),
        "messages": [{"role": "user", "content": "Is it sunny?"}],
        "format": SCHEMA,
        "stream": False,
        "options": {"num_predict": MAX_TOKENS, "temperature": 0},
    }
    r = httpx.post(daemon.url + "/api/chat", json=body, timeout=120)
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["message"]["content"]), SCHEMA)


@pytest.mark.parametrize("name", NAMES)
def test_forced_tool_call_is_schema_valid(daemon, created, name):
    body = {
        "model": created(name, "q4_K_M"),
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "temperature": 0.8,
        "seed": 3,
        "max_tokens": MAX_TOKENS,
    }
    r = httpx.post(daemon.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])
