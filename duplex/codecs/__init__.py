"""duplex.codecs: audio and media containers and their codecs, as bytes in and out.

Ogg pages (RFC 3533) carrying Opus (RFC 7845) over libopus, G.711 companding,
speech audio files (WAV, PCM, FLAC, MP3, AAC, Ogg Opus) and streams, and the
media files of generated images and videos (PNG, MP4, fragmented MP4). No
protocol, no socket: the wire projections and the services use them.
"""

from ._audio_files import (
    AUDIO_FORMATS,
    MEDIA_TYPES,
    OPUS_RATE,
    STREAM_FORMATS,
    AudioStream,
    encode_audio,
    resample_pcm16,
)
from ._g711 import alaw_encode, alaw_to_float, ulaw_encode, ulaw_to_float
from ._media_files import FragmentedMp4, encode_mp4, encode_png
from ._opus import FRAME_SAMPLES, SAMPLE_RATE, OggOpusDecoder, OggOpusEncoder

__all__ = [
    "AUDIO_FORMATS",
    "FRAME_SAMPLES",
    "MEDIA_TYPES",
    "OPUS_RATE",
    "SAMPLE_RATE",
    "STREAM_FORMATS",
    "AudioStream",
    "FragmentedMp4",
    "OggOpusDecoder",
    "OggOpusEncoder",
    "alaw_encode",
    "alaw_to_float",
    "encode_audio",
    "encode_mp4",
    "encode_png",
    "resample_pcm16",
    "ulaw_encode",
    "ulaw_to_float",
]
