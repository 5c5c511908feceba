"""PNG and (fragmented) MP4 from frames, read back with Pillow and PyAV."""

from __future__ import annotations

import io

import av
import numpy as np
from PIL import Image

from duplex.codecs._media_files import FragmentedMp4, encode_mp4, encode_png, video_codec


def frames(count: int, width: int = 64, height: int = 48, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(count)]


def decoded(data: bytes) -> list[av.VideoFrame]:
    with av.open(io.BytesIO(data)) as container:
        return list(container.decode(video=0))


def test_png_round_trips_exactly() -> None:
    (image,) = frames(1)
    back = np.asarray(Image.open(io.BytesIO(encode_png(image))))
    assert back.shape == (48, 64, 3) and np.array_equal(back, image)


def test_mp4_has_every_frame_at_its_size() -> None:
    data = encode_mp4(frames(7), width=64, height=48, fps=8)
    assert data[4:8] == b"ftyp"
    got = decoded(data)
    assert len(got) == 7 and {(f.width, f.height) for f in got} == {(64, 48)}
    assert video_codec() == "libx264"  # PyAV's wheels carry it


def test_fragmented_chunks_complete_the_frames_they_say() -> None:
    writer = FragmentedMp4(width=256, height=192, fps=8)  # noisy frames: over AVIO's buffer
    stream, told = b"", 0
    for count in (3, 5, 1, 4):
        data, complete = writer.write(frames(count, 256, 192, seed=count))
        stream += data
        told += complete
        assert len(decoded(stream)) == told  # each prefix demuxes to what was told
    data, complete = writer.close()
    stream += data
    assert told + complete == 13 == len(decoded(stream))
    assert writer.close() == (b"", 0)
    assert stream[4:8] == b"ftyp" and b"moof" in stream
    timestamps = [frame.pts for frame in decoded(stream)]
    assert timestamps == sorted(timestamps) and len(set(timestamps)) == 13
