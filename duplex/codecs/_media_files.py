"""Images to PNG, frames to MP4 and to fragmented MP4 (``m4s``), with Pillow and PyAV.

Video is H.264 from libx264 (PyAV's wheels bundle it) with ``preset=ultrafast`` and
``tune=zerolatency``: no lookahead and no B-frames, so each frame's packet leaves
the encoder as the frame goes in. The streaming writer muxes one fragment per
frame (``frag_every_frame+empty_moov+default_base_moof``): the first bytes are the
init segment (``ftyp`` + an empty ``moov``), then a ``moof``/``mdat`` pair a frame.
The muxer writes a frame's fragment when the next packet arrives, so after a chunk
of frames all but the last are in its bytes; the last comes with the next chunk or
with `FragmentedMp4.close` (the trailer).

PyAV and Pillow are imported on first use, not with the server: a server that serves no
images or videos never loads FFmpeg's libraries.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterable
from fractions import Fraction
from typing import TYPE_CHECKING, Any, final

import numpy as np

if TYPE_CHECKING:
    import av

__all__ = ["FragmentedMp4", "encode_mp4", "encode_png", "video_codec"]


@functools.cache
def video_codec() -> str:
    """libx264 where PyAV has it (its wheels do); MPEG-4 Part 2 otherwise (no B-frames
    either)."""
    import av

    return "libx264" if "libx264" in av.codecs_available else "mpeg4"


def _codec_options() -> dict[str, Any]:
    return {"preset": "ultrafast", "tune": "zerolatency"} if video_codec() == "libx264" else {}


def encode_png(image: np.ndarray) -> bytes:
    """One ``height x width x 3`` uint8 RGB image as PNG."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image, mode="RGB").save(out, format="PNG")
    return out.getvalue()


def _video_stream(container: av.container.OutputContainer, width: int, height: int, fps: int):  # type: ignore[no-untyped-def]
    stream = container.add_stream(video_codec(), rate=fps, options=_codec_options())
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    stream.time_base = Fraction(1, fps)
    return stream


def encode_mp4(frames: Iterable[np.ndarray], *, width: int, height: int, fps: int) -> bytes:
    """Frames (``height x width x 3`` uint8 RGB) as a progressive MP4 (``moov`` last:
    ``faststart`` needs a second pass over a file)."""
    import av

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
        import av

        self._av = av
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
            picture = self._av.VideoFrame.from_ndarray(frame, format="rgb24")
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
