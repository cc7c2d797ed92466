"""The CLI's pure formatting, table-tested against what Ollama prints."""

from datetime import datetime, timezone

import pytest

from localrt.cli import cli_format as f
from localrt.config import parse_host

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "n,text",
    [
        (0, "0 B"),
        (955, "955 B"),
        (1_500, "1.5 KB"),
        (270_000_000, "270 MB"),
        (4_700_000_000, "4.7 GB"),
        (12_000_000_000, "12 GB"),
    ],
)
def test_human_bytes(n, text):
    assert f.human_bytes(n) == text


@pytest.mark.parametrize(
    "ns,text",
    [
        (0, "0s"),
        (999, "999ns"),
        (45_600_000, "45.6ms"),
        (1_234_000_000, "1.234s"),
        (61_500_000_000, "1m1.5s"),
        (120, "120ns"),
        (120_000, "120µs"),
    ],
)
def test_go_duration(ns, text):
    assert f.go_duration(ns) == text


@pytest.mark.parametrize(
    "ts,text",
    [
        ("2026-11-27T12:00:00Z", "2 days ago"),
        ("2026-11-29T11:58:30.123456789Z", "A minute ago"),
        ("2026-11-29T13:00:00+01:00", "Less than a second ago"),
    ],
)
def test_ago(ts, text):
    assert f.ago(ts, NOW) == text


def test_until_and_processor():
    assert f.until("2026-11-29T12:04:00Z", NOW) == "4 minutes from now"
    assert f.until("2318-04-11T00:00:00Z", NOW) == "Forever"
    assert f.until("2026-11-29T11:00:00Z", NOW) == "Stopping..."
    assert f.processor(100, 0) == "100% CPU" and f.processor(100, 100) == "100% GPU"
    assert f.processor(100, 25) == "75%/25% CPU/GPU"


def test_table_aligns_columns():
    out = f.table(["NAME", "ID"], [["a:latest", "123"], ["bb:1", "4"]])
    assert out.splitlines() == ["NAME        ID", "a:latest    123", "bb:1        4"]


def test_verbose_stats_rates():
    text = f.verbose_stats(
        {
            "total_duration": 2_000_000_000,
            "prompt_eval_count": 10,
            "prompt_eval_duration": 500_000_000,
            "eval_count": 20,
            "eval_duration": 1_000_000_000,
        }
    )
    assert "prompt eval rate:     20.00 tokens/s" in text and "eval rate:            20.00 tokens/s" in text


@pytest.mark.parametrize(
    "value,expected",
    [
        (None, ("127.0.0.1", 11434, "http")),
        (":8080", ("127.0.0.1", 8080, "http")),
        ("0.0.0.0", ("0.0.0.0", 11434, "http")),
        ("http://example", ("example", 80, "http")),
        ("https://example", ("example", 443, "https")),
        ("[::1]:5000", ("::1", 5000, "http")),
        (' "localhost:1" ', ("localhost", 1, "http")),
    ],
)
def test_parse_host(value, expected):
    assert parse_host(value) == expected


def test_parse_host_rejects_bad_port():
    with pytest.raises(ValueError):
        parse_host("localhost:99999")
