"""libespeak-ng through ctypes: voices, and text to int16 PCM at the library's rate.

Written by hand because no binding on PyPI fits: the ``espeakng`` and
``espeakui`` packages run the ``espeak-ng`` command (not installed by a wheel),
and the phonemizer bindings expose phonemes, not audio. The library and its
voice data come from the ``espeakng-loader`` wheel, so nothing is needed from
the system. The API used is espeak's small stable C interface (``speak_lib.h``):
``espeak_Initialize`` in synchronous mode, a synthesis callback that collects
samples, ``espeak_SetVoiceByName`` (``voice+variant``) and ``espeak_SetParameter``.

espeak keeps one global state per process and is not thread-safe: every call
goes through `ESPEAK_LOCK`, and one `Espeak` exists per process (`espeak()`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import final

import numpy as np
import numpy.typing as npt

__all__ = ["ESPEAK_LOCK", "ESPEAK_RATE_WPM", "Espeak", "EspeakVoice", "espeak"]

ESPEAK_LOCK = threading.Lock()
"""Held around every call into the library (its state is process-global)."""

ESPEAK_RATE_WPM = 175
"""espeak's default speaking rate, words per minute: ``speed = 1.0``."""

MIN_RATE_WPM = 80
MAX_RATE_WPM = 700
"""The rates `Espeak.synthesize` clamps to: espeak-ng's floor, and 4x its default (above 450
it speeds up with its built-in sonic stretcher)."""

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_EE_OK = 0
_ESPEAK_RATE = 1
_ESPEAK_WORDGAP = 7
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_ENDPAUSE = 0x1000

_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


class _Voice(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_void_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


@final
@dataclass(frozen=True, slots=True)
class EspeakVoice:
    """One installed voice (``variant=False``) or voice variant (``variant=True``).

    Args:
        name: espeak's display name (``English_(America)``, ``Andy``).
        identifier: its file under ``espeak-ng-data/voices`` (``gmw/en-US``, ``!v/Andy``).
        languages: the language tags it speaks (empty for variants).
        gender: 1 male, 2 female, 0 unknown (as espeak reports it).
    """

    name: str
    identifier: str
    languages: tuple[str, ...]
    gender: int
    variant: bool

    @property
    def key(self) -> str:
        """What `Espeak.synthesize` takes: a language tag for a voice (``en-us``),
        the file name for a variant (``Andy``)."""
        if self.variant:
            return self.identifier.rsplit("/", 1)[-1]
        return self.languages[0] if self.languages else self.identifier


@final
class Espeak:
    """The loaded library, initialised once (synchronous output, voice data of the wheel).

    Args:
        library: path of ``libespeak-ng.so``.
        data: path of its ``espeak-ng-data`` folder.
    """

    def __init__(self, library: str, data: str) -> None:
        self._lib = ctypes.CDLL(library)
        lib = self._lib
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_ListVoices.argtypes = [ctypes.POINTER(_Voice)]
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
        with ESPEAK_LOCK:
            rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data.encode(), 0)
        if rate <= 0:
            raise OSError(f"espeak_Initialize failed ({rate}) with data at {data}")
        self.sample_rate: int = rate
        self._chunks: list[bytes] = []
        self._between: Callable[[], None] = _nothing
        self._stopped: BaseException | None = None
        self._callback = _SynthCallback(self._collect)  # kept alive: the library holds it
        lib.espeak_SetSynthCallback(self._callback)
        self._voices = self._list(variants=False) + self._list(variants=True)

    def _collect(self, wav: ctypes._Pointer[ctypes.c_short] | None, count: int, _: int) -> int:
        if wav and count > 0:
            self._chunks.append(ctypes.string_at(wav, count * 2))
        try:
            self._between()
        except BaseException as exc:  # never through the C library: kept, raised after it
            self._stopped = exc
            return 1  # stops the synthesis
        return 0

    def _list(self, *, variants: bool) -> list[EspeakVoice]:
        spec = _Voice()
        tag = ctypes.create_string_buffer(b"variant")
        spec.languages = ctypes.cast(tag, ctypes.c_void_p).value
        with ESPEAK_LOCK:
            found = self._lib.espeak_ListVoices(ctypes.byref(spec) if variants else None)
            voices: list[EspeakVoice] = []
            i = 0
            while found[i]:
                v = found[i].contents
                identifier = (v.identifier or b"").decode()
                languages = _read_languages(v.languages)
                voices.append(
                    EspeakVoice(
                        name=(v.name or b"").decode(),
                        identifier=identifier,
                        languages=() if variants else languages,
                        gender=int(v.gender),
                        variant=variants,
                    )
                )
                i += 1
        return voices

    def voices(self) -> tuple[EspeakVoice, ...]:
        """Every installed voice, then every variant (``!v/...``)."""
        return tuple(self._voices)

    def synthesize(
        self,
        text: str,
        voice: str,
        *,
        rate_wpm: int = ESPEAK_RATE_WPM,
        word_gap: int = 0,
        between_blocks: Callable[[], None] | None = None,
    ) -> npt.NDArray[np.int16]:
        """Speak ``text`` with ``voice`` (``en-us``, ``en-us+Andy``) at ``rate_wpm``, with
        ``word_gap`` (10 ms units at the normal rate) of extra pause between words.

        ``between_blocks`` is called after each block the library hands back (about 60 ms
        of audio, a fraction of a millisecond to make): the synthesis waits while it blocks
        (a unit boundary, `EspeakRunner`), and stops if it raises, the exception then
        raised from here.

        Raises:
            ValueError: the library does not know ``voice``.
        """
        rate = min(MAX_RATE_WPM, max(MIN_RATE_WPM, rate_wpm))
        data = text.encode("utf-8") + b"\0"
        with ESPEAK_LOCK:
            if self._lib.espeak_SetVoiceByName(voice.encode()) != _EE_OK:
                raise ValueError(f"espeak has no voice {voice!r}")
            self._lib.espeak_SetParameter(_ESPEAK_RATE, rate, 0)
            self._lib.espeak_SetParameter(_ESPEAK_WORDGAP, word_gap, 0)
            self._chunks, self._stopped = [], None
            self._between = between_blocks or _nothing
            try:
                status = self._lib.espeak_Synth(
                    data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
                )
                chunks, self._chunks = self._chunks, []
                stopped, self._stopped = self._stopped, None
            finally:
                self._between = _nothing
        if stopped is not None:
            raise stopped
        if status != _EE_OK:
            raise OSError(f"espeak_Synth failed ({status})")
        return np.frombuffer(b"".join(chunks), dtype=np.int16).copy()


def _nothing() -> None:
    return None


def _read_languages(address: int | None) -> tuple[str, ...]:
    """espeak's ``languages`` field: (priority byte, NUL-terminated tag) pairs ending in an
    empty tag. ``c_char_p`` stops at the first NUL, so walk the raw memory."""
    if not address:
        return ()
    tags: list[str] = []
    offset = 0
    while len(tags) < 32:
        priority = ctypes.string_at(address + offset, 1)
        if priority == b"\0":
            break
        tag = ctypes.string_at(address + offset + 1)
        if not tag:
            break
        tags.append(tag.decode("utf-8", "replace"))
        offset += 2 + len(tag)
    return tuple(tags)


_instance: Espeak | None = None
_instance_lock = threading.Lock()


def espeak() -> Espeak:
    """The process's library, loaded from the ``espeakng-loader`` wheel on first use.

    Raises:
        ModuleNotFoundError: ``espeakng-loader`` is not installed.
        OSError: the library did not load or initialise.
    """
    global _instance
    with _instance_lock:
        if _instance is None:
            import espeakng_loader

            _instance = Espeak(espeakng_loader.get_library_path(), espeakng_loader.get_data_path())
        return _instance
