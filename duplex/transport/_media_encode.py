"""Images to PNG, frames to MP4 and to fragmented MP4 (``m4s``), with Pillow and PyAV.

Video is H.264 from libx264 (PyAV's wheels bundle it) with ``preset=ultrafast`` and
``tune=zerolatency``: no lookahead and no B-frames, so each frame's packet leaves
the encoder as the frame goes in. The streaming writer muxes one fragment per
frame (``frag_every_frame+empty_moov+default_base_moof``): the first bytes are the
init segment (``ftyp`` + an empty ``moov``), then a ``moof``/``mdat`` pair a frame.
The muxer writes a frame's fragment when the next packet arrives, so after a chunk
of frames all but the last are in its bytes; the last comes with the next chunk or
with `FragmentedMp4.close` (the trailer).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from fractions import Fraction
from typing import Final, final

import av
import numpy as np
from PIL import Image

__all__ = ["VIDEO_CODEC", "FragmentedMp4", "encode_mp4", "encode_png"]


def _codec() -> str:
    return "libx264" if "libx264" in av.codecs_available else "mpeg4"


VIDEO_CODEC: Final = _codec()
"""libx264 where PyAV has it (its wheels do); MPEG-4 Part 2 otherwise (no B-frames either)."""
_CODEC_OPTIONS: Final = (
    {"preset": "ultrafast", "tune": "zerolatency"} if VIDEO_CODEC == "libx264" else {}
)


def encode_png(image: np.ndarray) -> bytes:
    """One ``height x width x 3`` uint8 RGB image as PNG."""
    out = io.BytesIO()
    Image.fromarray(image, mode="RGB").save(out, format="PNG")
    return out.getvalue()


def _video_stream(container: av.container.OutputContainer, width: int, height: int, fps: int):  # type: ignore[no-untyped-def]
    stream = container.add_stream(VIDEO_CODEC, rate=fps, options=dict(_CODEC_OPTIONS))
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    stream.time_base = Fraction(1, fps)
    return stream


def encode_mp4(frames: Iterable[np.ndarray], *, width: int, height: int, fps: int) -> bytes:
    """Frames (``height x width x 3`` uint8 RGB) as a progressive MP4 (``moov`` last:
    ``faststart`` needs a second pass over a file)."""
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = _video_stream(container, width, height, fps)
        for index, frame in enumerate(frames):
            picture = av.VideoFrame.from_ndarray(frame, format="rgb24")
            picture.pts = index
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
    return out.getvalue()


@final
class FragmentedMp4:
    """A fragmented MP4 written chunk by chunk: `write` returns the bytes the muxer has
    written since the last call and how many frames they complete."""

    def __init__(self, *, width: int, height: int, fps: int) -> None:
        self._out = io.BytesIO()
        self._container = av.open(
            self._out,
            "w",
            format="mp4",
            options={
                "movflags": "frag_every_frame+empty_moov+default_base_moof",
                "flush_packets": "1",
            },
        )
        self._stream = _video_stream(self._container, width, height, fps)
        self._read = 0
        self._muxed = 0
        self._emitted = 0
        self.closed = False

    def _take(self, complete: int) -> tuple[bytes, int]:
        data = self._out.getvalue()[self._read :]
        self._read += len(data)
        frames, self._emitted = complete - self._emitted, complete
        return data, frames

    def write(self, frames: Iterable[np.ndarray]) -> tuple[bytes, int]:
        """Encode ``frames``; returns the new bytes and the frames they complete."""
        for frame in frames:
            picture = av.VideoFrame.from_ndarray(frame, format="rgb24")
            picture.pts = self._muxed
            self._container.mux(self._stream.encode(picture))
            self._muxed += 1
        return self._take(max(0, self._muxed - 1))  # the last frame's fragment is pending

    def close(self) -> tuple[bytes, int]:
        """Flush the encoder and the muxer: the trailer's bytes and the frames they complete."""
        if self.closed:
            return b"", 0
        self.closed = True
        self._container.mux(self._stream.encode(None))
        self._container.close()
        return self._take(self._muxed)
