"""Ogg/Opus at 24 kHz mono for Moshi's ``/api/chat`` audio: one encoder and one decoder per stream.

A thin layer over ``opuslib`` (libopus) and `duplex.codecs._ogg`. The facts it follows,
from Kyutai's reference server and clients (``moshi`` 0.2.13 with ``sphn`` 0.2.1):

* The server answers each 80 ms model frame (1,920 samples at 24 kHz) with one ``0x01``
  message: ``sphn.OpusStreamWriter(24000).append_pcm`` cuts it into two 40 ms Opus packets
  (960 samples), one Ogg page each, libopus ``VOIP`` application, mono; the first message
  also carries the ``OpusHead`` and ``OpusTags`` pages. `OggOpusEncoder` does the same, so
  each `~OggOpusEncoder.encode` of a model frame returns its pages at once (no buffering).
* Clients send whatever their encoder makes: ``moshi.client`` the same 2 x 40 ms pages per
  80 ms; the web client (opus-recorder) 20 ms packets, up to two per page. `OggOpusDecoder`
  takes any packet duration Opus allows (2.5 to 120 ms) and any number per page.
* Kyutai's reader decodes every audio packet and ignores pre-skip and granule positions.
  `OggOpusDecoder` drops the pre-skip as RFC 7845 section 4.2 asks (``trim_pre_skip=False``
  behaves like Kyutai's): for ``sphn``'s pre-skip of 3,840 that is the first 1,920 samples.
  Our encoder writes its real algorithmic delay (libopus' lookahead) as pre-skip.

PCM is float32 in [-1, 1) mono as in `duplex.pcm`; the encoder also takes int16.
"""

from __future__ import annotations

import secrets
from typing import Final, final

import numpy as np
import numpy.typing as npt
import opuslib
import opuslib.api.info
from opuslib.api import c_float_pointer
from opuslib.api import decoder as opus_decoder_api

from duplex.exceptions import BadAudio

from ._ogg import DEFAULT_MAX_PACKET_BYTES, AudioPacket, OggReader, OggWriter, OpusHead, OpusTags

__all__ = [
    "FRAME_SAMPLES",
    "SAMPLE_RATE",
    "OggOpusDecoder",
    "OggOpusEncoder",
    "OpusDecodeError",
]

SAMPLE_RATE: Final = 24_000
FRAME_SAMPLES: Final = 960
"""One Opus packet: 40 ms at 24 kHz, as ``sphn`` encodes (two per 80 ms model frame). What the
reference server sends is what Kyutai's clients are known to play; 20 ms (the web client's own
choice) would double the pages and their 28-byte headers for no gain in latency, since a
model frame is only ready every 80 ms."""
_OPUS_FRAME_SAMPLES: Final = (60, 120, 240, 480, 960, 1440)  # 2.5 to 60 ms at 24 kHz
_MAX_PACKET_SAMPLES: Final = SAMPLE_RATE * 120 // 1000  # an Opus packet lasts at most 120 ms


class OpusDecodeError(BadAudio):
    """libopus refused an audio packet; wire code ``bad_audio``."""


@final
class OggOpusEncoder:
    """Mono PCM in, Ogg pages out: one Opus packet and one page per ``frame_samples``.

    Args:
        serial: the Ogg serial number; random when not given (RFC 3533).
        frame_samples: samples per Opus packet at 24 kHz (a legal Opus duration, 60 to 1440).
        bitrate: bits per second, or None for libopus' default.
        vendor: the ``OpusTags`` vendor string.
    """

    def __init__(
        self,
        *,
        serial: int | None = None,
        frame_samples: int = FRAME_SAMPLES,
        bitrate: int | None = None,
        vendor: bytes = b"duplex",
    ) -> None:
        if frame_samples not in _OPUS_FRAME_SAMPLES:
            raise ValueError(f"{frame_samples} samples is not an Opus frame duration at 24 kHz")
        self.frame_samples = frame_samples
        self._encoder = opuslib.Encoder(SAMPLE_RATE, 1, opuslib.APPLICATION_VOIP)
        if bitrate is not None:
            self._encoder.bitrate = bitrate
        pre_skip = self._encoder.lookahead * (48_000 // SAMPLE_RATE)
        head = OpusHead(pre_skip=pre_skip, input_sample_rate=SAMPLE_RATE)
        serial = secrets.randbits(32) if serial is None else serial
        self._ogg = OggWriter(serial=serial, head=head, tags=OpusTags(vendor))
        self._samples_48k = frame_samples * (48_000 // SAMPLE_RATE)

    @property
    def head(self) -> OpusHead:
        """The identification header this stream starts with."""
        return self._ogg.head

    def encode(
        self, pcm: npt.NDArray[np.float32] | npt.NDArray[np.int16], *, last: bool = False
    ) -> bytes:
        """Encode whole packets now; the first call's bytes start with the two header pages.

        Args:
            pcm: 1-D float32 in [-1, 1) or int16, a multiple of ``frame_samples`` long.
            last: mark the final page end-of-stream.

        Raises:
            ValueError: a partial packet (the encoder holds no samples back) or a wrong dtype.
        """
        pcm = np.asarray(pcm)
        if pcm.ndim != 1 or len(pcm) % self.frame_samples:
            raise ValueError(f"PCM must be 1-D, a multiple of {self.frame_samples} samples")
        if pcm.dtype == np.int16:
            encode = self._encoder.encode
        elif pcm.dtype == np.float32:
            encode = self._encoder.encode_float
        else:
            raise ValueError(f"PCM must be float32 or int16, not {pcm.dtype}")
        n = self.frame_samples
        count = len(pcm) // n
        pages = [self._ogg.headers()]
        for i in range(count):
            packet = encode(pcm[i * n : (i + 1) * n].tobytes(), n)
            pages.append(self._ogg.write(packet, self._samples_48k, last=last and i == count - 1))
        return b"".join(pages)


@final
class OggOpusDecoder:
    """Ogg/Opus bytes in (split anywhere), float32 mono PCM at 24 kHz out.

    Args:
        trim_pre_skip: drop the ``OpusHead`` pre-skip from the start (RFC 7845); False
            returns every decoded sample, as Kyutai's ``sphn`` reader does.
        max_packet_bytes: passed to `OggReader`.
    """

    def __init__(
        self, *, trim_pre_skip: bool = True, max_packet_bytes: int = DEFAULT_MAX_PACKET_BYTES
    ) -> None:
        self.reader = OggReader(max_packet_bytes=max_packet_bytes)
        self._decoder = opuslib.Decoder(SAMPLE_RATE, 1)
        self._trim_pre_skip = trim_pre_skip
        self._skip = 0  # samples at 24 kHz still to drop
        self._empty = np.zeros(0, dtype=np.float32)
        # decoded straight into one numpy buffer: opuslib's ``decode_float`` allocates a
        # ctypes array per call and copies it through a list of Python floats
        self._pcm = np.empty(_MAX_PACKET_SAMPLES, dtype=np.float32)
        self._pcm_pointer = self._pcm.ctypes.data_as(c_float_pointer)

    def feed(self, data: bytes | bytearray | memoryview) -> npt.NDArray[np.float32]:
        """Decode every audio packet the bytes complete; possibly an empty array.

        Raises:
            OggError: the Ogg framing or Opus headers are invalid (the stream is then dead).
            OpusDecodeError: libopus refused a packet.
        """
        chunks = []
        for event in self.reader.feed(data):
            if isinstance(event, AudioPacket):
                chunks.append(self._decode(event.data))
            elif isinstance(event, OpusHead):
                self._decoder.gain = event.output_gain  # Q7.8 dB, as OPUS_SET_GAIN takes it
                if self._trim_pre_skip:
                    self._skip = -(-event.pre_skip * SAMPLE_RATE // 48_000)
        if not chunks:
            return self._empty
        pcm = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        if self._skip:
            dropped = min(self._skip, len(pcm))
            self._skip -= dropped
            pcm = pcm[dropped:]
        return pcm

    def _decode(self, packet: bytes) -> npt.NDArray[np.float32]:
        state = self._decoder.decoder_state
        n = opus_decoder_api.libopus_decode_float(
            state, packet, len(packet), self._pcm_pointer, _MAX_PACKET_SAMPLES, 0
        )
        if n < 0:
            reason = opuslib.api.info.strerror(n).decode(errors="replace")
            raise OpusDecodeError(f"libopus refused an audio packet: {reason} ({n})")
        return self._pcm[:n].copy()
