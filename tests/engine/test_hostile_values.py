"""Values that reach arithmetic unchecked (issue 48, class 3): hostile GGUF files whose every request answered
500 (`internal error: ValueError` / `ZeroDivisionError`) are refused by `create` with a 400 naming the tensor or
key and the bad value; what only shows at run time (NaN logits or embeddings from a file that slipped into the
store) is a 500 naming the model and the cause, and the daemon keeps serving.

The red team's ten files, rebuilt here from tests/decoders.py's tiny models: NaN / inf block scales in Q8_0, IQ4_NL
and stacked expert tensors; NaN in a large (over 1 MB, past the loader's small-tensor check) F32 embedding; a phi3
longrope factor array shorter than the rotation needs; a phi3 attention factor of 1e6; denormal llama3 rope
frequencies; and a zero Q8_0 scale in a head of 64, which is legal in a weight (an all-zero block) but was a
Q8_0 `rope_freqs` (n_rot / 2 = 32 factors, one block) whose zero scale made rope divide by zero.
"""

from __future__ import annotations

import hashlib
import json

import httpx
import numpy as np
import pytest

from fixtures import decoders
import gguf_io
import quant
import store as st
from _daemon_fakes import pinned_daemon
from fixtures.decoders import small, write_model
from localrt.engine import finite
from localrt.engine.loader import load_model
from localrt.errors import InvalidModel, NonFiniteOutput
from localrt.models import gguf_facts as C
from localrt.models.create import create
from localrt.serve.error_map import error_status
from quant.formats import FORMATS
from simd_kernels import actquant

F32, Q8_0, IQ4_NL = 0, 8, 20
NAN, INF = np.float16("nan"), np.float16("inf")
HEAD_64 = decoders.Case("head64", "llama", n_head=1, n_head_kv=1, head_dim=64, llama3_rope=(8.0, 1.0, 4.0, 64), seed=11)


def rewrite(src, dst, *, meta=None, scales=None, values=None, replace=None):
    """dst = src with metadata `meta` set; `scales` {tensor: (field, block, value)}: one block's f16 scale field of
    a quantized tensor (blocks counted over all its rows); `values` {tensor: (index, value)}: one element of an F32
    tensor; `replace` {tensor: (ggml_type, shape, raw uint8 rows)}."""
    meta, scales, values, replace = meta or {}, scales or {}, values or {}, replace or {}
    with gguf_io.open(src) as f:
        md = {**f.metadata, **meta}
        types = {k: t for k, t in f.metadata_types.items() if k not in meta}
        tensors = []
        for name, t in f.tensors.items():
            data = np.array(t.data)  # (n_rows, row_bytes) uint8, a copy: the mapping closes below
            if name in scales:
                field, block, value = scales[name]
                data.reshape(-1).view(FORMATS[t.ggml_type].dtype)[field][block] = value
            if name in values:
                index, value = values[name]
                data.reshape(-1).view(np.float32)[index] = value
            tensors.append((name, *replace.get(name, (t.ggml_type, t.shape, data))))
    gguf_io.write(dst, md, tensors, metadata_types=types)
    return dst


def _q8_0_zero_scale(n: int) -> tuple:
    """A Q8_0 vector of n ones whose every block's scale is 0: (type, shape, raw)."""
    raw = quant.quantize(np.ones((1, n), np.float32), Q8_0)  # (1, n/32 * 34)
    raw.reshape(-1).view(FORMATS[Q8_0].dtype)["d"] = 0
    return Q8_0, (n,), raw


def _factors(path, name: str) -> np.ndarray:
    with gguf_io.open(path) as f:
        return np.array(f.tensors[name].data).reshape(-1).view(np.float32)


# name -> (base, rewrite arguments (or a function of the base path giving them), texts the 400 must contain,
# whether the loader refuses it too: metadata and rope factors are checked at load, weight values only at create)
CASES = {
    "q8_0_nan_scale": (
        "q8",
        dict(scales={"blk.0.attn_q.weight": ("d", 5, NAN)}),
        ["tensor 'blk.0.attn_q.weight' (Q8_0)", "d = nan", "block 1 of row 2"],
        False,
    ),
    "q8_0_inf_scale": (
        "q8",
        dict(scales={"output.weight": ("d", 0, INF)}),
        ["tensor 'output.weight' (Q8_0)", "d = inf", "block 0 of row 0"],
        False,
    ),
    "iq4_nl_inf_scale": (
        "iq4nl",
        dict(scales={"blk.1.ffn_up.weight": ("d", 7, -INF)}),
        ["tensor 'blk.1.ffn_up.weight' (IQ4_NL)", "d = -inf"],
        False,
    ),
    "expert_nan_scale": (
        "moe",
        dict(scales={"blk.2.ffn_down_exps.weight": ("d", 2 * 64 + 3, NAN)}),
        ["tensor 'blk.2.ffn_down_exps.weight' (Q8_0)", "d = nan", "expert 2, row 3"],
        False,
    ),
    "large_f32_embedding_nan": (
        "f32_big",
        dict(values={"token_embd.weight": (200 * 1024 + 7, np.nan)}),
        ["tensor 'token_embd.weight' holds NaN", "nan at row 200, column 7"],
        False,
    ),
    "longrope_factors_short": (
        "phi3",
        lambda p: dict(
            replace={
                "rope_factors_long.weight": (F32, (3,), _factors(p, "rope_factors_long.weight")[:3].view(np.uint8))
            }
        ),
        ["tensor 'rope_factors_long.weight' has shape (3,)", "phi3.rope.dimension_count / 2 is 6"],
        True,
    ),
    "longrope_attn_factor_1e6": (
        "phi3",
        dict(meta={"phi3.rope.scaling.attn_factor": 1e6}),
        ["phi3.rope.scaling.attn_factor is 1000000", "at most 10"],
        True,
    ),
    "llama3_freqs_denormal": (
        "llama3",
        dict(values={"rope_freqs.weight": (3, 1e-40)}),  # float32: 9.999946e-41
        ["tensor 'rope_freqs.weight' holds 9.999946e-41 at index 3", "from 1e-06 to 1e+06"],
        True,
    ),
    "llama3_freqs_nan": (
        "llama3",
        dict(values={"rope_freqs.weight": (0, np.nan)}),
        ["tensor 'rope_freqs.weight' holds NaN"],
        True,
    ),
    "head64_q8_0_rope_freqs_zero_scale": (
        "head64",
        dict(replace={"rope_freqs.weight": _q8_0_zero_scale(32)}),
        ["tensor 'rope_freqs.weight' has ggml type 8", "must be F32, F16 or BF16"],
        True,
    ),
}


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    out = {
        "q8": decoders.write(root / "q8.gguf", decoders.CASES["llama"], Q8_0),
        "iq4nl": decoders.write(root / "iq4nl.gguf", decoders.CASES["llama"], IQ4_NL),
        "moe": decoders.write(root / "moe.gguf", decoders.CASES["qwen3moe"], Q8_0),
        "phi3": decoders.write(root / "phi3.gguf", decoders.CASES["phi3_short"], Q8_0),
        "llama3": decoders.write(root / "llama3.gguf", decoders.CASES["llama3_rope"], Q8_0),
        "head64": decoders.write(root / "head64.gguf", HEAD_64, Q8_0),
    }
    out["f32_big"] = root / "f32_big.gguf"  # token_embd (260, 1024) F32: 1.06 MB
    write_model(out["f32_big"], small(n_embd=1024, n_ff=64))
    return out


@pytest.fixture(scope="module")
def hostile(bases, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    out = {}
    for name, (base, kw, _, _) in CASES.items():
        kw = kw(bases[base]) if callable(kw) else kw
        out[name] = rewrite(bases[base], root / f"{name}.gguf", **kw)
    return out


def _assert_names(exc: BaseException, texts: list[str]) -> None:
    for text in texts:
        assert text in str(exc), f"{text!r} not in {str(exc)!r}"


def test_the_bases_are_accepted(bases, tmp_path):
    s = st.Store(tmp_path / "models")
    for name, path in bases.items():
        assert list(create(s, name.replace("_", "-"), f"FROM {path}\n"))[-1] == {"status": "success"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_create_refuses_the_file_with_a_400_naming_the_value(hostile, tmp_path, name):
    s = st.Store(tmp_path / "models")
    with pytest.raises(InvalidModel) as exc:
        list(create(s, "bad", f"FROM {hostile[name]}\n"))
    _assert_names(exc.value, CASES[name][2])
    status, message, _ = error_status(exc.value)
    assert status == 400 and message == str(exc.value)
    assert s.list() == [] and list((tmp_path / "models" / "blobs").glob("*")) == []  # the copied blob is removed
    digest = s.import_file(hostile[name]).digest  # an uploaded blob (POST /api/blobs) is refused the same way
    with pytest.raises(InvalidModel):
        list(create(s, "bad", f"FROM @{digest}\n", allow_local_paths=False))


@pytest.mark.parametrize("name", sorted(n for n, case in CASES.items() if case[3]))
def test_the_loader_refuses_rope_factors_and_attention_factors_too(hostile, name):
    with pytest.raises(InvalidModel) as exc:
        load_model(hostile[name], num_ctx=32)
    _assert_names(exc.value, CASES[name][2])


def test_a_zero_scale_is_an_all_zero_block_and_legal(bases, tmp_path):
    """Zero scales in weights (rows, a whole head of 64 in q and k, an embedding row) are created and generate."""
    with gguf_io.open(bases["head64"]) as f:
        blocks = {
            n: len(np.array(f.tensors[n].data).reshape(-1)) // 34
            for n in ("blk.0.attn_q.weight", "blk.0.attn_k.weight")
        }
    zeros = {n: ("d", slice(0, count), 0) for n, count in blocks.items()}
    zeros["token_embd.weight"] = ("d", slice(0, 2), 0)  # token 0's row
    path = rewrite(bases["head64"], tmp_path / "zeros.gguf", scales=zeros)
    assert list(create(st.Store(tmp_path / "models"), "zeros", f"FROM {path}\n"))[-1] == {"status": "success"}
    model = load_model(path, num_ctx=32)
    try:
        events = list(model.generate([0, 1, 2], {"num_predict": 3, "temperature": 0}))
        assert events[-1].done and events[-1].eval_count >= 1
    finally:
        model.close()


@pytest.mark.parametrize("fmt", [f for f in FORMATS.values() if not f.activations_only], ids=lambda f: f.name)
def test_the_scan_reads_every_float_field_of_every_format(fmt):
    """Each format's f16 scales (d, m, dmin) and each float type's elements, read in the blocks' own layout."""

    class T:  # a tensor as gguf_io gives it: type, NumPy-order shape, raw rows
        def __init__(self, data):
            self.ggml_type, self.shape, self.data = fmt.ggml_type, (4, 256), data

    raw = quant.quantize(np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32), fmt.ggml_type)
    finite.check_finite({"w": T(raw)})  # a good tensor passes
    if fmt.name in ("F32", "F16", "BF16"):
        bad = raw.copy()
        bad.reshape(-1).view({"F32": np.uint32, "F16": np.uint16, "BF16": np.uint16}[fmt.name])[256 + 9] = {
            "F32": 0x7FC00000,
            "F16": 0x7E00,
            "BF16": 0x7FC0,
        }[fmt.name]  # a NaN at row 1, column 9
        with pytest.raises(InvalidModel, match=r"tensor 'w' holds NaN or infinite values .*nan at row 1, column 9"):
            finite.check_finite({"w": T(bad)})
        return
    per_row = 256 // fmt.block_size
    for field in [name for name, dtype, _ in fmt.fields if dtype == "<f2"]:
        for value in (NAN, -INF):
            bad = raw.copy()
            bad.reshape(-1).view(fmt.dtype)[field][2 * per_row + per_row - 1] = value  # the last block of row 2
            with pytest.raises(InvalidModel) as exc:
                finite.check_finite({"w": T(bad)})
            _assert_names(
                exc.value, [f"({fmt.name}) has a block scale {field} = {float(value)}", f"block {per_row - 1} of row 2"]
            )


def test_the_q8_k_quantizer_takes_infinite_activations():
    """The real cause of the ZeroDivisionError behind a K-quant weight: an infinite activation made Q8_K's iscale 0
    and Numba's checked 1 / iscale raised. It now gives ggml's d = -+inf (and NaN logits, reported by the engine)."""
    x = np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32)  # (n_tok, cols)
    good = actquant.quantize_q8_k(x.copy())
    x[0, 5], x[1, 300] = np.inf, -np.inf
    _, d, _ = actquant.quantize_q8_k(x)  # d (n_tok, cols/256)
    assert d[0, 0] == -np.inf and d[1, 1] == np.inf
    assert d[0, 1] == good[1][0, 1] and d[1, 0] == good[1][1, 0]  # the finite blocks are as before


def test_the_engine_refuses_non_finite_logits_and_embeddings(bases, tmp_path):
    """A file that slipped past create (loading does not scan the weights) gives NonFiniteOutput, not a ValueError
    from the sampler or from JSON."""
    logits = rewrite(bases["q8"], tmp_path / "out.gguf", scales={"output.weight": ("d", 0, NAN)})
    model = load_model(logits, num_ctx=32)
    try:
        with pytest.raises(NonFiniteOutput, match=r"the model produced non-finite logits \(1 of 512 values"):
            list(model.generate([1, 2, 3], {"num_predict": 2}))
    finally:
        model.close()
    hidden = rewrite(bases["q8"], tmp_path / "ffn.gguf", scales={"blk.0.ffn_down.weight": ("d", 0, INF)})
    model = load_model(hidden, num_ctx=32)
    try:
        with pytest.raises(NonFiniteOutput, match="produced non-finite embedding values"):
            model.embed([1, 2, 3])
    finally:
        model.close()


# ---- through a real daemon ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with pinned_daemon(tmp_path_factory.mktemp("models")) as srv:  # the real loader
        yield srv


def _upload(srv, path) -> str:
    data = path.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r = httpx.post(f"{srv.url}/api/blobs/{digest}", content=data, timeout=30)
    assert r.status_code in (200, 201), r.text
    return digest


def _create(srv, name: str, path, stream: bool = False) -> httpx.Response:
    body = {"model": name, "files": {"m.gguf": _upload(srv, path)}, "stream": stream}
    return httpx.post(srv.url + "/api/create", json=body, timeout=60)


def _generate(srv, name: str) -> httpx.Response:
    body = {"model": name, "prompt": "the", "raw": True, "stream": False, "options": {"num_predict": 2, "num_ctx": 32}}
    return httpx.post(srv.url + "/api/generate", json=body, timeout=120)


def test_daemon_create_is_a_400_naming_the_tensor(daemon, hostile):
    for name in ("expert_nan_scale", "head64_q8_0_rope_freqs_zero_scale"):
        r = _create(daemon, "hostile", hostile[name])
        assert r.status_code == 400, r.text
        _assert_names(r.json()["error"], CASES[name][2])
        lines = [json.loads(line) for line in _create(daemon, "hostile", hostile[name], stream=True).text.splitlines()]
        assert CASES[name][2][0] in lines[-1]["error"] and not any(x.get("status") == "success" for x in lines)


def test_daemon_names_the_model_when_its_output_is_not_finite(daemon, bases, tmp_path, monkeypatch):
    logits = rewrite(bases["q8"], tmp_path / "out.gguf", scales={"output.weight": ("d", 0, NAN)})
    hidden = rewrite(bases["q8"], tmp_path / "ffn.gguf", scales={"blk.0.ffn_down.weight": ("d", 0, INF)})
    monkeypatch.setattr(C, "_model_problem", lambda *a: None)  # as if stored by a version without the scan
    assert _create(daemon, "slipped", logits).status_code == 200
    assert _create(daemon, "slipped-embed", hidden).status_code == 200
    monkeypatch.undo()
    for _ in range(2):  # every request, and the daemon lives on
        r = _generate(daemon, "slipped")
        assert r.status_code == 500, r.text
        _assert_names(r.json()["error"], ["model 'slipped:latest' produced non-finite logits", "weights are corrupt"])
    chat = {"model": "slipped", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(daemon.url + "/v1/chat/completions", json=chat, timeout=120)
    assert r.status_code == 500 and "model 'slipped:latest' produced non-finite logits" in r.json()["error"]["message"]
    r = httpx.post(daemon.url + "/api/embed", json={"model": "slipped-embed", "input": "the cat"}, timeout=120)
    assert r.status_code == 500, r.text
    assert "model 'slipped-embed:latest' produced non-finite embedding values" in r.json()["error"]
    assert _create(daemon, "good", bases["q8"]).status_code == 200
    r = _generate(daemon, "good")
    assert r.status_code == 200 and r.json()["done"] is True, r.text


def test_the_real_models_pass_the_scan(smollm2_path, gemma3_path):
    """The create-time scan reads every weight of both real files and finds them clean (~12 and ~18 ms; not timed)."""
    for path in (smollm2_path, gemma3_path):
        assert C.gguf_facts(path, scan=True)["invalid"] is None
