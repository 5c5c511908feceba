"""Sentence splitting: the pure function and its incremental form, by property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.models.tts import SentenceBuffer, split_sentences

ALPHABET = "ab .!?,;:\"')\n\u2026\u3002\uff01\uff1f3"  # ... and the CJK stop, ! and ?
texts = st.text(alphabet=ALPHABET, max_size=200)


def _squash(text: str) -> str:
    return "".join(text.split())


def test_examples() -> None:
    assert split_sentences("Hello there. It is 3.14 now! Is it? End") == [
        "Hello there.",
        "It is 3.14 now!",
        "Is it?",
        "End",
    ]
    assert split_sentences('He said "Stop." Then left.') == ['He said "Stop."', "Then left."]
    assert split_sentences("\u4f60\u597d\u3002\u518d\u89c1\uff01") == [
        "\u4f60\u597d\u3002",
        "\u518d\u89c1\uff01",
    ]
    assert split_sentences("  \n ") == []
    assert split_sentences("one, two, three", max_chars=6) == ["one,", "two,", "three"]
    assert split_sentences("abcdefgh", max_chars=3) == ["abc", "def", "gh"]


@settings(max_examples=300, deadline=None)
@given(texts, st.integers(min_value=1, max_value=40))
def test_split_keeps_every_character_in_order_and_bounds_pieces(text: str, n: int) -> None:
    pieces = split_sentences(text, max_chars=n)
    assert _squash("".join(pieces)) == _squash(text)
    for piece in pieces:
        assert piece and piece == piece.strip()
        assert len(piece) <= n


@settings(max_examples=300, deadline=None)
@given(texts)
def test_split_ends_sentences_only_at_stops(text: str) -> None:
    pieces = split_sentences(text, max_chars=10_000)
    for piece in pieces[:-1]:
        assert piece.rstrip("\"')]}\u00bb\u201d\u2019")[-1] in ".!?\u2026\u3002\uff01\uff1f"


@settings(max_examples=300, deadline=None)
@given(texts, st.lists(st.integers(min_value=0, max_value=200), max_size=8), st.integers(1, 40))
def test_buffer_in_any_pieces_equals_split_of_the_whole(text: str, cuts: list[int], n: int) -> None:
    buffer = SentenceBuffer(max_chars=n)
    out: list[str] = []
    at = 0
    for cut in sorted(c % (len(text) + 1) for c in cuts):
        out += buffer.feed(text[at:cut])
        at = cut
    out += buffer.feed(text[at:])
    out += buffer.flush()
    assert out == split_sentences(text, max_chars=n)
    assert buffer.pending == ""


def test_buffer_releases_a_finished_sentence_without_waiting_for_the_next() -> None:
    buffer = SentenceBuffer()
    assert buffer.feed("Hello there") == []
    assert buffer.feed(".") == []  # "there.x" could still follow
    assert buffer.feed(" ") == ["Hello there."]
    assert buffer.feed("Next one") == []
    assert buffer.flush() == ["Next one"]


def test_buffer_is_bounded_and_recovers() -> None:
    buffer = SentenceBuffer(max_buffer=10)
    with pytest.raises(ValueError, match="without a sentence end"):
        buffer.feed("x" * 11)
    assert buffer.feed("Short. ") == ["Short."]
