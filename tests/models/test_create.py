"""create(): Modelfile -> layers -> manifest, with tiny GGUF files made by the `gguf` package."""

from __future__ import annotations

import json
import os
import sys
import types

import dataclasses

import pytest
from typer.testing import CliRunner

import gguf_io
import modelfile as M
import store as st
from localrt.models import create as C
from localrt.models.create import CreateError, create, human_number
from store import manifests as mt
from _testpaths import TESTS

sys.path.insert(0, str(TESTS))
from _daemon_fakes import make_config  # noqa: E402
from fixtures.decoders import n_params, write_tiny
from fixtures.store_files import write_tiny_adapter, write_tiny_split  # noqa: E402
from cli import app  # noqa: E402
from localrt.runtime.service import Service  # noqa: E402
from localrt.serve.daemon import BackgroundServer  # noqa: E402


def run(s: st.Store, name: str, text: str, **kw) -> list[dict]:
    return list(create(s, name, text, **kw))


def statuses(events: list[dict]) -> list[str]:
    return [e["status"] for e in events]


@pytest.fixture
def env(tmp_path):
    src = write_tiny(tmp_path / "tiny.gguf")
    return tmp_path, src, st.Store(tmp_path / "models")


def test_create_from_gguf_file(env):
    d, src, s = env
    events = run(s, "tiny:1", "FROM ./tiny.gguf\nPARAMETER temperature 0.5\nSYSTEM be brief\n", base_dir=d)
    model, system, params = s.manifest("tiny:1").layers
    assert statuses(events) == [
        "parsing modelfile",
        "parsing GGUF",
        "copying file tiny.gguf",
        f"creating new layer {model.digest}",
        f"creating new layer {system.digest}",
        f"creating new layer {params.digest}",
        f"creating new layer {s.manifest('tiny:1').config.digest}",
        "writing manifest",
        "success",
    ]
    copying = events[2]
    assert copying["total"] == copying["completed"] == src.stat().st_size
    assert (model.media_type, system.media_type, params.media_type) == (mt.MODEL, mt.SYSTEM, mt.PARAMS)
    assert s.blob_path(model.digest).read_bytes() == src.read_bytes()
    assert json.loads(s.read_blob(params.digest)) == {"temperature": 0.5}
    r = s.model_record("tiny:1")
    assert r.config["model_format"] == "gguf" and r.config["rootfs"]["diff_ids"] == [
        model.digest,
        system.digest,
        params.digest,
    ]
    assert r.details == {
        "parent_model": "",
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": human_number(n_params()),
        "quantization_level": "F32",
    }


def test_reimport_uses_existing_layer_and_same_blobs(env):
    d, src, s = env
    run(s, "a", f"FROM {src}\n")
    blobs = sorted(os.listdir(d / "models" / "blobs"))
    events = run(s, "b", f"FROM {src}\n")
    digest = s.manifest("b").layers[0].digest
    assert f"using existing layer {digest}" in statuses(events)
    assert sorted(os.listdir(d / "models" / "blobs")) == blobs  # shared layers stored once


def test_relative_and_home_paths(env, monkeypatch):
    d, src, s = env
    monkeypatch.setenv("HOME", str(d))
    run(s, "home", "FROM ~/tiny.gguf\n")
    monkeypatch.chdir(d)
    run(s, "cwd", "FROM tiny.gguf\n")  # an existing file wins over the model name 'tiny.gguf'
    assert s.manifest("home").layers == s.manifest("cwd").layers


def test_derived_model_adds_only_small_blobs(env):
    d, src, s = env
    run(s, "base", f"FROM {src}\nSYSTEM one\nPARAMETER stop a\nPARAMETER top_k 5\nMESSAGE user hi\nLICENSE L1\n")
    before = set(os.listdir(d / "models" / "blobs"))
    events = run(s, "child", "FROM base\nSYSTEM two\nPARAMETER top_k 7\nLICENSE L2\n")
    new = set(os.listdir(d / "models" / "blobs")) - before
    assert all((d / "models" / "blobs" / n).stat().st_size < 1000 for n in new)
    r = s.model_record("child")
    assert r.system == "two" and r.params == {"stop": ["a"], "top_k": 7}
    assert r.messages == [{"role": "user", "content": "hi"}] and r.licenses == ("L1", "L2")
    assert r.parent_model == "base:latest" and r.model_path == s.model_record("base").model_path
    assert r.details["family"] == "llama"
    m = s.manifest("child")
    assert all(x.from_ == "base:latest" for x in m.layers if x.media_type in (mt.MODEL, mt.MESSAGES))
    assert statuses(events)[1].startswith("using existing layer")


def test_messages_replace_inherited(env):
    d, src, s = env
    run(s, "base", f"FROM {src}\nMESSAGE user a\n")
    run(s, "child", "FROM base\nMESSAGE user b\nMESSAGE assistant c\n")
    assert s.model_record("child").messages == [{"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]


def test_from_blob_digest(env):
    d, src, s = env
    info = s.import_file(src)
    run(s, "byblob", f"FROM @{info.digest}\n")
    assert s.manifest("byblob").layers[0].digest == info.digest
    with pytest.raises(st.BlobNotFound):
        run(s, "x", "FROM @sha256:" + "0" * 64 + "\n")
    with pytest.raises(st.InvalidDigest):
        run(s, "x", "FROM @sha256:1234\n")


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12345\n",
        b"<!DOCTYPE html><html>404</html>",
        b"GGUF\x03\x00\x00\x00",
    ],
)
def test_invalid_gguf_is_rejected_and_nothing_stored(tmp_path, content):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    s = st.Store(tmp_path / "models")
    with pytest.raises(gguf_io.InvalidGGUF):
        run(s, "bad", f"FROM {bad}\n")
    assert not (tmp_path / "models" / "manifests").exists()
    assert not (tmp_path / "models" / "blobs").exists() or os.listdir(tmp_path / "models" / "blobs") == []


def test_truncated_gguf_rejected(env):
    d, src, s = env
    cut = d / "cut.gguf"
    cut.write_bytes(src.read_bytes()[:-100])
    with pytest.raises(gguf_io.InvalidGGUF):
        run(s, "cut", f"FROM {cut}\n")
    assert s.list() == []


def test_bad_requests_fail_before_the_first_event(env):
    d, src, s = env
    for name, text, err in [
        ("../x", f"FROM {src}\n", st.InvalidName),
        ("m", "FROM\n", M.ModelfileError),
        ("m", f"FROM {src}\nFROM {src}\n", CreateError),
    ]:
        with pytest.raises(err):
            next(create(s, name, text))


def test_missing_things(env):
    d, src, s = env
    with pytest.raises(CreateError, match="no such file"):
        run(s, "m", "FROM ./nope.gguf\n", base_dir=d)
    with pytest.raises(st.ManifestNotFound):
        run(s, "m", "FROM unknown-model:1b\n")
    with pytest.raises(CreateError, match="directory"):
        run(s, "m", f"FROM {d}\n")
    with pytest.raises(st.InvalidName):
        run(s, "../evil", f"FROM {src}\n")
    with pytest.raises(M.ModelfileError, match="line 2"):
        run(s, "m", "FROM x\nBOGUS y\n")
    assert s.list() == [] and not (d / "models").exists()


def test_local_paths_refused_without_revealing_existence(env):
    d, src, s = env
    msgs = []
    for arg in [str(src), str(d / "does-not-exist.gguf"), "/etc/passwd", "/etc/nothing-here"]:
        with pytest.raises(CreateError) as e:
            run(s, "m", f"FROM {arg}\n", allow_local_paths=False)
        msgs.append(str(e.value).replace(arg, "<arg>"))
    assert len(set(msgs)) == 1
    info = s.import_file(src)  # blobs and names still work
    run(s, "ok", f"FROM @{info.digest}\n", allow_local_paths=False)
    run(s, "ok2", "FROM ok\n", allow_local_paths=False)


def test_adapter_layer(env):
    d, src, s = env
    lora = write_tiny_adapter(d / "lora.gguf")
    run(s, "with-lora", f"FROM {src}\nADAPTER {lora}\n")
    m = s.manifest("with-lora")
    assert [x.media_type for x in m.layers] == [mt.MODEL, mt.ADAPTER]
    assert s.model_record("with-lora").adapter_paths[0].read_bytes() == lora.read_bytes()
    with pytest.raises(CreateError, match="not a LoRA adapter"):
        run(s, "x", f"FROM {src}\nADAPTER {src}\n")
    with pytest.raises(CreateError, match="use it with ADAPTER"):
        run(s, "x", f"FROM {lora}\n")
    other = write_tiny_adapter(d / "qwen-lora.gguf", arch="qwen2")
    with pytest.raises(CreateError, match="qwen2"):
        run(s, "x", f"FROM {src}\nADAPTER {other}\n")


def test_split_and_projector_and_multiple_from(env):
    d, src, s = env
    parts = write_tiny_split(d)
    assert [p.name for p in parts] == [
        "split-00001-of-00003.gguf",
        "split-00002-of-00003.gguf",
        "split-00003-of-00003.gguf",
    ]
    with pytest.raises(CreateError, match="split"):
        run(s, "x", f"FROM {parts[0]}\n")
    with pytest.raises(gguf_io.InvalidGGUF, match="first part"):
        run(s, "x", f"FROM {parts[1]}\n")
    proj = write_tiny(d / "mmproj.gguf", arch="clip")
    with pytest.raises(CreateError, match="projector"):
        run(s, "x", f"FROM {proj}\n")
    with pytest.raises(CreateError, match="more than one FROM"):
        run(s, "x", f"FROM {src}\nFROM {src}\n")


def test_template_is_validated(env):
    d, src, s = env
    with pytest.raises(CreateError, match="template error"):
        run(s, "x", f"FROM {src}\nTEMPLATE {{{{ if .System }}\n")
    run(s, "ok", f'FROM {src}\nTEMPLATE """{{{{ .System }}}} {{{{ .Prompt }}}}"""\n')
    assert s.model_record("ok").template == "{{ .System }} {{ .Prompt }}"


def test_replacing_a_model_collects_its_old_blobs(env):
    d, src, s = env
    run(s, "m", f"FROM {src}\nSYSTEM old\n")
    old_system = s.manifest("m").layers[1].digest
    run(s, "m", f"FROM {src}\nSYSTEM new\n")
    assert not s.has_blob(old_system) and s.model_record("m").system == "new"
    assert s.verify().unreferenced == []


def test_deprecated_parameter_warning_is_reported(env):
    d, src, s = env
    events = run(s, "m", f"FROM {src}\nPARAMETER mirostat 2\n")
    assert "warning: (line 2): parameter mirostat is deprecated and is ignored" in statuses(events)
    assert s.model_record("m").params == {}


def test_file_type_inferred_when_missing(tmp_path):
    src = write_tiny(tmp_path / "nofiletype.gguf", file_type=None)
    s = st.Store(tmp_path / "models")
    run(s, "m", f"FROM {src}\n")
    assert s.model_record("m").details["quantization_level"] == "F32"


def test_progress_while_copying_and_cancel(env, monkeypatch):
    d, src, s = env
    monkeypatch.setattr(st.digest, "CHUNK", 64)
    monkeypatch.setattr(C, "PROGRESS_INTERVAL_S", 0.0)
    events = run(s, "m", f"FROM {src}\n")
    done = [e["completed"] for e in events if e["status"].startswith("copying file")]
    assert len(done) > 3 and done == sorted(done) and done[-1] == src.stat().st_size
    gen = create(s, "other", f"FROM {write_tiny(d / 'b.gguf', seed=3)}\n")
    for ev in gen:
        if ev["status"].startswith("copying file"):
            break
    gen.close()  # the consumer went away mid-copy
    assert not s.exists("other")
    assert list((d / "models" / "blobs").glob(".tmp-*")) == []


def test_quantize_with_localrt_quantize(tmp_path):
    pytest.importorskip("localrt.models.quantize")
    src = write_tiny(tmp_path / "f32.gguf", n_embd=64)
    s = st.Store(tmp_path / "models")
    events = run(s, "q", f"FROM {src}\n", quantize="q8_0")
    quantizing = [e for e in events if e["status"] == "quantizing F32 model to Q8_0"]
    assert quantizing and quantizing[-1]["completed"] == quantizing[-1]["total"]
    assert "verifying conversion" in statuses(events)
    r = s.model_record("q")
    assert r.details["quantization_level"] == "Q8_0"
    with gguf_io.open(r.model_path) as f:
        assert f.tensors["blk.0.attn_q.weight"].ggml_type == gguf_io.GGMLType.Q8_0
    # The unquantized import is not kept, and no temp file is left behind.
    assert s.verify(rehash=False).unreferenced == []
    assert list((tmp_path / "models" / "blobs").glob(".tmp-*")) == []
    run(s, "q4", f"FROM {write_tiny(tmp_path / 'q4.gguf', n_embd=64)}\n", quantize="q4_0")
    with pytest.raises(CreateError, match="cannot quantize"):
        run(s, "qq", "FROM q4\n", quantize="q4_K_M")  # already quantized: requantizing is refused
    with pytest.raises(CreateError, match="cannot quantize"):
        run(s, "bad", f"FROM {src}\n", quantize="q9_Z")


def test_quantize_refuses_a_quantized_source_by_its_type_before_the_first_event(tmp_path):
    pytest.importorskip("localrt.models.quantize")
    s = st.Store(tmp_path / "models")
    src = write_tiny(tmp_path / "f32.gguf", n_embd=64)
    run(s, "q8", f"FROM {src}\n", quantize="q8_0")
    for from_ in (
        "q8",
        f"@{s.model_record('q8').entry.manifest.layers[0].digest}",
        str(s.model_record("q8").model_path),
    ):
        gen = create(s, "again", f"FROM {from_}\n", quantize="q4_0")
        with pytest.raises(
            CreateError, match="its weights are Q8_0; quantization is only supported for F16, BF16 and F32"
        ):
            next(gen)  # before "parsing modelfile": a server answers 400, not a 200 stream with an error line
    assert not s.exists("again")
    assert "success" in statuses(run(s, "from-f32", f"FROM {src}\n", quantize="q4_0"))


@pytest.mark.parametrize(
    "n, text",
    [
        (512, "512"),
        (22_000, "22K"),
        (134_515_008, "134.52M"),
        (137_000_000, "137M"),
        (268_098_176, "268.10M"),
        (8_000_000_000, "8B"),
        (8_030_261_248, "8.0B"),
        (3_212_749_824, "3.2B"),
    ],
)
def test_human_number(n, text):
    assert human_number(n) == text


def test_create_from_api_request_body(env):
    d, src, s = env
    digest = s.import_file(src).digest  # what POST /api/blobs/:digest stored
    body = {"model": "api", "files": {"tiny.gguf": digest}, "system": "hello", "parameters": {"top_k": 3}}
    events = run(s, body["model"], M.from_create_request(body), allow_local_paths=False)
    assert events[-1] == {"status": "success"}
    r = s.model_record("api")
    assert r.system == "hello" and r.params == {"top_k": 3} and r.model_path == s.blob_path(digest)


def test_cli_create_errors_name_the_users_file_not_the_blob(tmp_path):
    """Issue 46: `localrt create` with FROM ./my-model.gguf naming a bad file said
    `.../models/blobs/sha256-...: not a GGUF file`; the error names the user's file. A request that gives no file
    name (the legacy `modelfile` form) gets the digest, never the server's store path."""
    model = write_tiny(tmp_path / "good.gguf")
    cases = [
        (b"hello, this is not a model\n" * 4, "not a GGUF file"),
        (b"", "empty file"),
        (model.read_bytes()[:-100], "truncated file"),
    ]
    conf = dataclasses.replace(make_config(tmp_path / "models"), data_dir=tmp_path / "data")
    service = Service(conf)
    try:
        with BackgroundServer(service, conf) as srv:
            env = {"LOCALRT_HOST": f"127.0.0.1:{conf.port}", "LOCALRT_API_KEY": ""}
            for content, why in cases:
                (tmp_path / "my-model.gguf").write_bytes(content)
                (tmp_path / "Modelfile").write_text("FROM ./my-model.gguf\n")
                r = CliRunner().invoke(app, ["create", "mine", "-f", str(tmp_path / "Modelfile")], env=env)
                assert r.exit_code == 1 and why in r.stderr, r.output
                assert "my-model.gguf" in r.stderr and "blobs" not in r.stderr and "sha256" not in r.stderr, r.stderr
            (tmp_path / "Modelfile").write_text("FROM ./good.gguf\nADAPTER ./my-model.gguf\n")
            write_tiny(tmp_path / "my-model.gguf", seed=2)  # a model, not an adapter
            r = CliRunner().invoke(app, ["create", "mine", "-f", str(tmp_path / "Modelfile")], env=env)
            assert r.exit_code == 1 and "ADAPTER 'my-model.gguf' is not a LoRA adapter" in r.stderr, r.output

            import httpx

            digest = service.store.import_file(tmp_path / "Modelfile").digest  # a blob that is no GGUF
            r = httpx.post(
                srv.url + "/api/create",
                json={"model": "legacy", "modelfile": f"FROM @{digest}\n", "stream": False},
                timeout=30,
            )
            assert r.status_code >= 400 and digest in r.text and "blobs" not in r.text, r.text
    finally:
        service.close()
