"""A create leaves no unreferenced blob of its own behind (issue 46 friction: each `create --quantize` left its
270 MB F16 source, and a failed create what it had copied, until prune's 10-minute grace): what it added and no
manifest references is gone when it ends; what another model references, or a concurrent create still uses, stays."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

import gguf_io
import modelfile as M
import store as st
from _daemon_fakes import make_config
from fixtures.decoders import write_tiny
from cli import app
from localrt.models.create import CreateError, create
from localrt.runtime.service import Service
from localrt.serve.daemon import BackgroundServer


def run(s: st.Store, name: str, text: str, **kw) -> list[dict]:
    return list(create(s, name, text, **kw))


def blobs(s: st.Store) -> set[str]:
    return {"sha256:" + p.name[7:] for p in (s.root / "blobs").glob("sha256-*")}


def referenced(s: st.Store) -> set[str]:
    return s.referenced_digests()


@pytest.fixture
def env(tmp_path):
    return tmp_path, write_tiny(tmp_path / "f32.gguf", n_embd=64), st.Store(tmp_path / "models")


def upload(s: st.Store, path) -> str:
    """What POST /api/blobs leaves: an unreferenced blob."""
    return s.import_file(path).digest


def test_quantize_of_an_upload_keeps_only_the_quantized_layer(env):
    _, src, s = env
    source = upload(s, src)
    events = run(s, "q", f"FROM @{source}\n", quantize="q8_0")
    assert events[-1]["status"] == "success"
    assert source not in blobs(s)  # the F32 source went with the create, not after a grace period
    assert blobs(s) == referenced(s)
    assert s.verify(rehash=False).unreferenced == []


def test_quantize_of_a_file_or_a_stored_model_keeps_what_others_reference(env):
    _, src, s = env
    run(s, "f32", f"FROM {src}\n")
    source = s.manifest("f32").layers[0].digest
    run(s, "q-by-name", "FROM f32\n", quantize="q8_0")
    run(s, "q-by-digest", f"FROM @{source}\n", quantize="q4_0")
    assert source in blobs(s)  # the model f32 still uses it
    assert blobs(s) == referenced(s)


def test_quantize_progress_counts_bytes_of_weights(env):
    _, src, s = env
    with gguf_io.open(src) as f:
        weights = sum(t.nbytes for t in f.tensors.values())
    steps = [e for e in run(s, "q", f"FROM {src}\n", quantize="q8_0") if e["status"].startswith("quantizing")]
    assert {e["total"] for e in steps} == {weights}  # bytes, not a count of tensors
    done = [e["completed"] for e in steps]
    assert done == sorted(done) and done[-1] == weights and len(steps) > 1


@pytest.mark.parametrize("how", ["bad template", "bad level", "abandoned"])
def test_a_failed_create_removes_what_it_added_at_once(env, how):
    d, src, s = env
    run(s, "keep", f"FROM {write_tiny(d / 'other.gguf', seed=1)}\n")
    before = blobs(s)
    if how == "bad template":  # fails after the file was copied in and a SYSTEM layer written
        with pytest.raises(CreateError, match="template"):
            run(s, "m", f'FROM {src}\nSYSTEM new text\nTEMPLATE "{{{{ .Bad"\n')
    elif how == "bad level":  # fails on an upload made for it
        with pytest.raises(CreateError, match="cannot quantize"):
            run(s, "m", f"FROM @{upload(s, src)}\n", quantize="q9_Z")
    else:
        gen = create(s, "m", f"FROM {src}\nSYSTEM words\n", quantize="q8_0")
        for ev in gen:
            if ev["status"].startswith("quantizing"):
                break
        gen.close()  # the client went away
    assert not s.exists("m")
    assert blobs(s) == before
    assert s.model_record("keep").model_path.is_file()
    assert list((s.root / "blobs").glob(".tmp-*")) == []


def test_a_failed_create_leaves_a_source_another_model_references(env):
    _, src, s = env
    run(s, "f32", f"FROM {src}\n")
    before = blobs(s)
    with pytest.raises(M.ModelfileError):
        run(s, "m", f"FROM {src}\nBOGUS 1\n")
    with pytest.raises(CreateError):
        run(s, "m", f"FROM @{s.manifest('f32').layers[0].digest}\n", quantize="q9_Z")
    assert blobs(s) == before


def test_a_concurrent_create_keeps_the_source_it_is_using(env):
    _, src, s = env
    source = upload(s, src)
    first = create(s, "a", f"FROM @{source}\n", quantize="q8_0")
    for ev in first:
        if ev["status"].startswith("quantizing"):
            break  # `first` holds the source now, midway through quantizing it
    run(s, "b", f"FROM @{source}\n", quantize="q4_0")
    assert source in blobs(s)  # `b` finished, but `a` still reads it
    assert list(first)[-1]["status"] == "success"
    assert source not in blobs(s) and blobs(s) == referenced(s)


def test_a_held_blob_is_not_collected(env):
    _, src, s = env
    digest = upload(s, src)
    s.hold(digest)
    assert s.remove_unreferenced([digest]) == [] and digest in blobs(s)
    assert s.prune(grace_s=0).removed == [] and digest in blobs(s)
    s.release(digest)
    assert s.remove_unreferenced([digest]) == [digest]


def test_cli_create_quantize_leaves_no_unreferenced_blob(tmp_path):
    """The path a user takes: `localrt create -q` uploads the local GGUF as a blob, the daemon quantizes it."""
    write_tiny(tmp_path / "model-f32.gguf", n_embd=64)
    (tmp_path / "Modelfile").write_text("FROM ./model-f32.gguf\n")
    conf = dataclasses.replace(make_config(tmp_path / "models"), data_dir=tmp_path / "data")
    service = Service(conf)
    try:
        with BackgroundServer(service, conf):
            env = {"LOCALRT_HOST": f"127.0.0.1:{conf.port}", "LOCALRT_API_KEY": ""}
            r = CliRunner().invoke(
                app,
                ["create", "mine", "-q", "q8_0", "-f", str(tmp_path / "Modelfile")],
                env=env,
                catch_exceptions=False,
            )
            assert r.exit_code == 0, r.output
            s = service.store
            assert s.model_record("mine").details["quantization_level"] == "Q8_0"
            assert blobs(s) == referenced(s)
            assert s.verify(rehash=False).unreferenced == []
            kept = blobs(s)

            write_tiny(tmp_path / "other.gguf", n_embd=64, seed=2)
            for text, why in (
                ("FROM ./other.gguf\nADAPTER ./missing.gguf\n", "adapter file ./missing.gguf not found"),
                ('FROM ./other.gguf\nTEMPLATE "{{ .Bad"\n', "template error"),
            ):
                (tmp_path / "Modelfile").write_text(text)
                r = CliRunner().invoke(app, ["create", "other", "-f", str(tmp_path / "Modelfile")], env=env)
                assert r.exit_code == 1 and why in r.stderr, r.output
                assert blobs(s) == kept  # refused before its upload, or its upload removed with the failed create
    finally:
        service.close()
