"""Text tokens to text pieces, through the checkpoint's sentencepiece model.

The LM's text stream is a sentencepiece vocabulary (``tokenizer_spm_32k_3.model``
for Moshi: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``<pad>`` 3). The runner never
calls sentencepiece per step: `text_pieces` reads the model once into a table
indexed by token id, where control, unknown and unused ids (PAD, and 0, which
Moshi uses as end-of-padding) are ``""``, and ``"▁"`` is a space.

`write_tiny_tokenizer` trains a small BPE model on fixed English sentences,
single-threaded, so the ``tiny`` checkpoint's tokenizer is byte-for-byte
reproducible and has exactly the tiny LM's ``text_card`` pieces.
"""

from __future__ import annotations

import io
from pathlib import Path

import sentencepiece

from duplex.exceptions import ConfigError

__all__ = ["text_pieces", "tiny_tokenizer", "write_tiny_tokenizer"]

_SENTENCES = (
    "hello there, how are you today?",
    "I am fine, thank you very much.",
    "the quick brown fox jumps over the lazy dog.",
    "what would you like to talk about?",
    "let me think about that for a moment.",
    "it is a nice day outside.",
    "can you hear me well?",
    "yes, I can hear you.",
    "tell me a short story please.",
    "once upon a time there was a small robot.",
)


def text_pieces(source: str | Path | bytes, text_card: int) -> tuple[str, ...]:
    """The text of every token id below ``text_card`` ("" for special and unknown ids).

    ``source``: a sentencepiece model file, or the model itself (serialized bytes).

    Raises:
        ConfigError: the file is not a sentencepiece model.
    """
    processor = sentencepiece.SentencePieceProcessor()
    try:
        if isinstance(source, bytes):
            processor.LoadFromSerializedProto(source)
        else:
            processor.Load(str(source))
    except (OSError, RuntimeError) as exc:
        where = "tokenizer bytes" if isinstance(source, bytes) else source
        raise ConfigError(f"{where}: not a sentencepiece model ({exc})") from None
    size = processor.GetPieceSize()
    pieces = []
    for token in range(text_card):
        special = token >= size or (
            processor.IsControl(token) or processor.IsUnknown(token) or processor.IsUnused(token)
        )
        pieces.append("" if special else processor.IdToPiece(token).replace("\u2581", " "))
    return tuple(pieces)


def write_tiny_tokenizer(path: str | Path, vocab_size: int) -> None:
    """Write `tiny_tokenizer` to ``path``."""
    Path(path).write_bytes(tiny_tokenizer(vocab_size))


def tiny_tokenizer(vocab_size: int) -> bytes:
    """Train a deterministic BPE sentencepiece model of ``vocab_size`` pieces (serialized).

    Ids 0..3 are ``<unk>``, ``<s>``, ``</s>``, ``<pad>`` as in Moshi's tokenizer.
    """
    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.Train(
        sentence_iterator=iter(_SENTENCES),
        model_writer=out,
        vocab_size=vocab_size,
        model_type="bpe",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    return out.getvalue()
