import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localrt.engine.stop import StopMatcher


def run(stops, pieces):
    """All emitted text, whether it stopped, and the emitted chunk per piece."""
    m = StopMatcher(stops)
    out, chunks = [], []
    for piece in pieces:
        emit, hit = m.feed(piece)
        chunks.append(emit)
        out.append(emit)
        if hit:
            return "".join(out), True, chunks
    out.append(m.flush())
    return "".join(out), False, chunks


def test_no_stops_passes_text_through():
    assert run([], ["a", "b"]) == ("ab", False, ["a", "b"])


def test_stop_inside_one_piece():
    assert run(["\n\n"], ["Hello\n\nWorld"]) == ("Hello", True, ["Hello"])


def test_stop_spanning_several_pieces_is_never_partly_emitted():
    text, hit, chunks = run(["<|im_end|>"], ["Hi", " there", "<|", "im", "_end", "|>", "more"])
    assert (text, hit) == ("Hi there", True)
    assert chunks == ["Hi", " there", "", "", "", ""]


def test_false_alarm_is_released_when_it_stops_matching():
    m = StopMatcher(["</s>"])
    assert m.feed("a </") == ("a ", False)
    assert m.feed("b>") == ("</b>", False)
    assert m.flush() == ""


def test_held_text_comes_back_at_flush():
    m = StopMatcher(["STOP"])
    assert m.feed("go ST") == ("go ", False)
    assert m.flush() == "ST"
    assert m.hit is None


def test_earliest_stop_wins_among_overlapping_stops():
    assert run(["bcd", "abc"], ["ab", "cd"])[:2] == ("", True)
    m = StopMatcher(["cd", "abcde"])
    assert m.feed("xabcde") == ("x", True)  # both present: the one that starts first
    assert m.hit == "abcde"
    # Streaming stops as soon as a stop string is complete, as Ollama does: "cd" completes first here.
    m = StopMatcher(["abcde", "cd"])
    assert [m.feed(p) for p in ["xabc", "d"]] == [("x", False), ("ab", True)]
    assert m.hit == "cd"


def test_repeated_prefix_characters():
    # "aab" inside "xaaab": the held tail must be the longest possible prefix ("aa", not "a").
    assert run(["aab"], ["xa", "a", "ab"]) == ("xa", True, ["x", "", "a"])


def test_stays_stopped_after_a_hit():
    m = StopMatcher(["x"])
    assert m.feed("ax") == ("a", True)
    assert m.feed("more") == ("", True)
    assert m.flush() == ""
    assert m.hit == "x"


def test_unicode_stops():
    assert run(["끝"], ["안녕", "하세요끝", "나"])[:2] == ("안녕하세요", True)
    assert run(["🛑"], ["go 🚀", "🛑"])[:2] == ("go 🚀", True)
    assert run(["終わり"], ["今日は終", "わり"])[:2] == ("今日は", True)
    assert run(["終わり"], ["今日は終", "点"])[:2] == ("今日は終点", False)


def test_stop_at_the_very_start():
    assert run(["User:"], ["User:", " hi"]) == ("", True, [""])


def test_empty_stop_is_rejected():
    with pytest.raises(ValueError):
        StopMatcher([""])


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc\n<>", max_size=40),
    stops=st.lists(st.text(alphabet="abc\n<>", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=10),
)
def test_any_split_equals_the_whole_text_answer(text, stops, cuts):
    positions = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0] + positions, positions + [len(text)])]
    expected, found, end = text, False, 0
    for piece in pieces:  # oracle: after each piece, the earliest stop in all the text so far ends it
        end += len(piece)
        starts = [text[:end].find(s) for s in stops if s in text[:end]]
        if starts:
            expected, found = text[: min(starts)], True
            break
    got, hit, chunks = run(stops, pieces)
    assert got == expected
    assert hit == found
    for s in stops:  # no emitted prefix ever shows part of a stop that was hit
        if hit:
            assert s not in "".join(chunks)
