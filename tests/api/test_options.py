import math

import pytest

from localrt.errors import InvalidRequest
from localrt.api.options import DEPRECATED, LOAD_TIME, Options, config_layer, parse_duration, resolve


def test_defaults_are_ollamas():
    o = resolve()
    assert o == Options()
    assert (o.num_ctx, o.num_batch, o.num_gpu, o.num_thread, o.num_keep) == (4096, 512, -1, 0, 4)
    assert (o.seed, o.num_predict, o.top_k, o.top_p, o.min_p, o.typical_p) == (-1, -1, 40, 0.9, 0.0, 1.0)
    assert (o.repeat_last_n, o.temperature, o.repeat_penalty) == (64, 0.8, 1.1)
    assert (o.presence_penalty, o.frequency_penalty, o.stop, o.use_mmap) == (0.0, 0.0, (), None)


def test_later_layers_win_and_none_is_skipped():
    o = resolve({"temperature": 0.5, "stop": ["a"]}, None, {"temperature": 0.1, "top_k": None}, {"stop": "b"})
    assert o.temperature == 0.1
    assert o.top_k == 40
    assert o.stop == ("b",)


def test_config_layer_sets_num_ctx():
    class Cfg:
        context_length = 8192

    assert resolve(config_layer(Cfg()), {"top_k": 5}).num_ctx == 8192
    assert resolve(config_layer(Cfg()), {"num_ctx": 2048}).num_ctx == 2048


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("num_ctx", 2048, 2048),
        ("num_ctx", 2048.0, 2048),  # JSON numbers may arrive as floats
        ("seed", 42, 42),
        ("seed", (1 << 63) - 1, (1 << 63) - 1),
        ("num_predict", -2, -2),
        ("repeat_last_n", -1, -1),
        ("top_k", 0, 0),
        ("temperature", 0, 0.0),
        ("temperature", 1, 1.0),
        ("top_p", 1, 1.0),
        ("min_p", 0.05, 0.05),
        ("presence_penalty", -1.5, -1.5),
        ("use_mmap", False, False),
        ("stop", ["</s>", "\n\n"], ("</s>", "\n\n")),
        ("stop", "###", ("###",)),
        ("stop", [], ()),
    ],
)
def test_accepted_values(key, value, expected):
    assert getattr(resolve({key: value}), key) == expected


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("num_ctx", 0, ["num_ctx", "[1, 1048576]"]),
        ("num_ctx", -5, ["num_ctx"]),
        ("num_ctx", 1 << 30, ["num_ctx"]),
        ("num_ctx", 2.5, ["num_ctx", "integer"]),
        ("num_ctx", "4096", ["num_ctx", "integer"]),
        ("num_ctx", True, ["num_ctx", "integer"]),
        ("num_thread", 100000, ["num_thread", "1024"]),
        ("num_predict", -3, ["num_predict", "-2"]),
        ("repeat_last_n", -2, ["repeat_last_n"]),
        ("top_k", -1, ["top_k", "[0,"]),
        ("top_p", 1.5, ["top_p", "[0.0, 1.0]"]),
        ("top_p", -0.1, ["top_p"]),
        ("min_p", 2, ["min_p"]),
        ("typical_p", -1, ["typical_p"]),
        ("temperature", -0.5, ["temperature", "[0.0, inf]"]),
        ("temperature", float("nan"), ["temperature", "finite"]),
        ("temperature", float("inf"), ["temperature", "finite"]),
        ("temperature", "hot", ["temperature", "number"]),
        ("repeat_penalty", 0, ["repeat_penalty", "greater than 0"]),
        ("seed", 1 << 64, ["seed"]),
        ("seed", -2, ["seed"]),
        ("use_mmap", 1, ["use_mmap", "boolean"]),
        ("stop", 5, ["stop"]),
        ("stop", ["ok", 5], ["stop", "strings"]),
        ("stop", [""], ["stop", "empty"]),
        ("stop", ["x"] * 300, ["stop", "256"]),
    ],
)
def test_rejected_values_name_the_option(key, value, words):
    with pytest.raises(InvalidRequest) as err:
        resolve({key: value})
    for word in words:
        assert word in str(err.value)


def test_unknown_key_is_rejected_by_name():
    with pytest.raises(InvalidRequest, match="unknown option 'temprature'"):
        resolve({"temprature": 0.5})
    with pytest.raises(InvalidRequest, match="unknown option 'Temperature'"):
        resolve({"Temperature": 0.5})  # names are case-sensitive, as in Ollama


def test_deprecated_keys_from_the_python_client_are_ignored_and_reported():
    o = resolve({"numa": False, "mirostat": 0, "tfs_z": 1.0, "penalize_newline": True, "temperature": 0.3})
    assert o.temperature == 0.3
    assert o.ignored == ("numa", "mirostat", "tfs_z", "penalize_newline")
    assert "ignored" not in o.to_dict()
    for key, (_, reason) in DEPRECATED.items():
        assert reason, key


def test_deprecated_keys_are_still_type_checked():
    with pytest.raises(InvalidRequest, match="'mirostat'.*int"):
        resolve({"mirostat": "2"})
    with pytest.raises(InvalidRequest, match="'low_vram'.*bool"):
        resolve({"low_vram": 1})


def test_python_client_options_round_trip():
    ollama = pytest.importorskip("ollama")
    sent = ollama.Options(numa=False, num_ctx=1024, seed=7, temperature=0.2, stop=["x"], mirostat=0).model_dump(
        exclude_none=True
    )
    o = resolve(sent)
    assert (o.num_ctx, o.seed, o.temperature, o.stop) == (1024, 7, 0.2, ("x",))


def test_layer_must_be_a_mapping():
    with pytest.raises(InvalidRequest, match="object"):
        resolve(["temperature", 1])


def test_load_options_and_to_dict():
    o = resolve({"num_ctx": 1024, "stop": ["a"]})
    assert tuple(o.load_options()) == LOAD_TIME
    assert o.load_options()["num_ctx"] == 1024
    assert o.to_dict()["stop"] == ["a"]
    assert resolve(o.to_dict()) == o


def test_options_are_frozen():
    with pytest.raises(Exception):
        resolve().temperature = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "value,seconds",
    [
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("300ms", 0.3),
        ("1.5h", 5400.0),
        (".5s", 0.5),
        ("2h45m30.5s", 9930.5),
        ("10us", 1e-5),
        ("10\u00b5s", 1e-5),
        ("100ns", 1e-7),
        ("0", 0.0),
        ("0s", 0.0),
        ("+5m", 300.0),
        (0, 0.0),
        (0.0, 0.0),
        (300, 300.0),
        (2.5, 2.5),
        (-1, None),
        (-0.5, None),
        ("-1h", None),
        ("-5m", None),
        (float("inf"), None),
        (1e12, None),  # beyond Go's largest Duration
        ("3000000h", None),
        ("-0s", 0.0),
    ],
)
def test_parse_duration(value, seconds):
    got = parse_duration(value)
    if seconds is None:
        assert got is None
    else:
        assert math.isclose(got, seconds, rel_tol=1e-12)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "300",
        "5",
        "5x",
        "m",
        "5 m",
        " 5m",
        "1h-5m",
        "abc",
        "5m3",
        "-1",
        None,
        True,
        [5],
        float("nan"),
        "--5m",
        "1.2.3s",
    ],
)
def test_parse_duration_rejects_garbage(value):
    with pytest.raises(InvalidRequest, match="keep_alive"):
        parse_duration(value)


def test_bare_numeric_string_is_seconds_only_for_the_environment():
    with pytest.raises(InvalidRequest, match="missing unit"):
        parse_duration("300")
    assert parse_duration("300", bare_seconds=True) == 300.0
    assert parse_duration("-1", bare_seconds=True) is None
    assert parse_duration("5m", bare_seconds=True) == 300.0
