"""Sentence splitting for sentence-level streaming: a pure function and its
incremental form.

A sentence ends at ``.``, ``!``, ``?``, ``…`` or their CJK forms, with any
closing quotes or brackets, when whitespace or the end of the text follows (so
``3.14`` and ``e.g.x`` stay whole). A sentence longer than ``max_chars`` is cut
at its last clause mark (``,;:``) or space that fits, else hard, so no unit of
synthesis grows without bound. Whitespace between sentences is dropped.
"""

from __future__ import annotations

import re

__all__ = ["MAX_SENTENCE_CHARS", "SentenceBuffer", "split_sentences"]

MAX_SENTENCE_CHARS = 300
"""Longest piece `split_sentences` returns (one unit of synthesis)."""

_STOPS = ".!?\u2026\u3002\uff01\uff1f"  # . ! ? ellipsis, and the CJK full stop, ! and ?
_CJK_STOPS = "\u3002\uff01\uff1f"  # end a sentence with no space after them
_CLOSERS = "\"')\\]}\u00bb\u201d\u2019"  # closing quotes and brackets kept with the sentence
_END = re.compile(f"[{_STOPS}]+[{_CLOSERS}]*(?=\\s|$)|[{_CJK_STOPS}]+[{_CLOSERS}]*")
_TRAILING_STOPS = re.compile(f"[{_STOPS}{_CLOSERS}]+$")
_CLAUSE = ",;:\uff0c\uff1b\uff1a"  # , ; : and their CJK forms


def _cut(sentence: str, max_chars: int) -> list[str]:
    """Cut one over-long sentence at clause marks or spaces (hard cut when none fits)."""
    pieces: list[str] = []
    rest = sentence
    while len(rest) > max_chars:
        window = rest[:max_chars]
        at = max(window.rfind(c) for c in _CLAUSE) + 1
        if at <= 0:
            at = window.rfind(" ")
        if at <= 0:
            at = max_chars
        head, rest = rest[:at].strip(), rest[at:].strip()
        if head:
            pieces.append(head)
    if rest:
        pieces.append(rest)
    return pieces


def _scan(text: str) -> tuple[list[str], str]:
    """The sentences of ``text`` that more text cannot change (stripped, none empty), and
    the raw rest: the sentence still open, which may be one that ends exactly at the end of
    ``text`` (``"3."`` may become ``"3.14"``, ``"Hi!"`` may become ``"Hi!!"``)."""
    complete: list[str] = []
    start = 0
    for match in _END.finditer(text):
        if match.end() == len(text):
            break
        sentence = text[start : match.end()].strip()
        start = match.end()
        if sentence:
            complete.append(sentence)
    return complete, text[start:]


def split_sentences(text: str, *, max_chars: int = MAX_SENTENCE_CHARS) -> list[str]:
    """The sentences of ``text``, stripped, none empty, none longer than ``max_chars``.

    Joining them with single spaces gives ``text`` with its whitespace runs collapsed
    at sentence and cut boundaries; no non-space character is lost or reordered.
    """
    if max_chars < 1:
        raise ValueError("max_chars: must be >= 1")
    complete, rest = _scan(text)
    if rest.strip():
        complete.append(rest.strip())
    return [piece for sentence in complete for piece in _cut(sentence, max_chars)]


class SentenceBuffer:
    """`split_sentences` over text that arrives in pieces (``input.text`` deltas, LLM tokens).

    `feed` returns the pieces that more text cannot change: finished sentences, and the
    leading cuts of an over-long open one; `flush` returns the rest. Feeding a text in any
    pieces and flushing gives exactly ``split_sentences(text)``.

    Args:
        max_chars: as in `split_sentences`.
        max_buffer: the most text of one open sentence held (``ValueError`` beyond it).
    """

    def __init__(self, *, max_chars: int = MAX_SENTENCE_CHARS, max_buffer: int = 1 << 20) -> None:
        if max_chars < 1:
            raise ValueError("max_chars: must be >= 1")
        self._max_chars = max_chars
        self._max_buffer = max_buffer
        self._text = ""  # the open sentence, from its start
        self._released = 0  # its leading cuts already returned

    @property
    def pending(self) -> str:
        """The open sentence, from its start (its leading cuts may have been returned)."""
        return self._text

    def _cuts(self, sentence: str) -> list[str]:
        stripped = sentence.strip()
        return _cut(stripped, self._max_chars) if stripped else []

    def feed(self, text: str) -> list[str]:
        """Add ``text``; return the pieces it made final."""
        if len(self._text) + len(text) > self._max_buffer:
            raise ValueError(f"more than {self._max_buffer} characters without a sentence end")
        complete, rest = _scan(self._text + text)
        out: list[str] = []
        for sentence in complete:
            out += self._cuts(sentence)[self._released :]
            self._released = 0  # only the first complete sentence was open before
        # An open sentence's cuts but its last are final (cuts are made from its start), less
        # the stops at its very end: more text may end a sentence inside them ("3。?" + "3").
        open_cuts = self._cuts(_TRAILING_STOPS.sub("", rest))
        out += open_cuts[self._released : len(open_cuts) - 1]
        self._released = max(self._released, len(open_cuts) - 1)
        self._text = rest
        return out

    def flush(self) -> list[str]:
        """Return what is left and empty the buffer."""
        out = self._cuts(self._text)[self._released :]
        self._text, self._released = "", 0
        return out
