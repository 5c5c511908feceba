"""Peak memory that one large ``input_audio_buffer.append`` costs, per endpoint.

    .venv/bin/python bench/message_memory.py [--mib 16]

Builds one append message just under ``--mib`` MiB of JSON text (PCM16 at 24 kHz in
base64, 12 MiB of audio for 16 MiB of text) and measures, with `tracemalloc`, the peak of
memory allocated above what was live before each stage (the text itself, which the socket
layer already holds, is not counted):

- ``parse``: the endpoint's codec turns the text into an `AudioAppend`
  (``/v1/duplex``: `parse_client_event`; ``/v1/realtime``: `RealtimeProjection.parse`;
  ``/v1/realtime`` G.711: the same at 8 kHz mu-law, one audio byte per sample).
- ``session``: the parse, then the session machine takes the event (resampling to the
  model rate, the energy VAD); for ``/v1/realtime`` also the resampling to 16 kHz the
  silero VAD link does (the server's default ``realtime_vad``).

numpy's buffers are tracked by `tracemalloc`, so the figures include the audio arrays.
docs/protocol/duplex.md ("Limits and defaults") quotes the result.
"""

from __future__ import annotations

import argparse
import base64
import tracemalloc
from collections.abc import Callable

import numpy as np

from duplex.sessions import AudioAppend, ConnectionAttached, SessionConfig, SessionMachine
from duplex.sessions._resample import StreamingResampler
from duplex.transport._duplex_wire import parse_client_event
from duplex.transport._realtime_wire import TURN_BASED_OPTIONS, RealtimeProjection, WireFormats

MIB = 1024 * 1024


def message(mib: float, *, width: int) -> str:
    """An append whose JSON text is just under ``mib`` MiB, with ``width``-byte samples."""
    head, tail = '{"type":"input_audio_buffer.append","audio":"', '"}'
    chars = int(mib * MIB) - len(head) - len(tail)
    size = chars // 4 * 3 // width * width
    rng = np.random.default_rng(0)
    audio = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    return head + base64.b64encode(audio).decode("ascii") + tail


def peak(stage: Callable[[], object]) -> int:
    """Bytes allocated at the peak of ``stage``, above what was live when it started."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = stage()
        top = tracemalloc.get_traced_memory()[1]
        del result
    finally:
        tracemalloc.stop()
    return top - base


def native_session(text: str) -> object:
    event = parse_client_event(text)
    machine = SessionMachine(SessionConfig())
    machine.handle(ConnectionAttached(1), 0.0)
    return machine.handle(event, 0.0)


def realtime_session(text: str, formats: WireFormats) -> object:
    event = RealtimeProjection(formats=formats).parse(text)
    assert isinstance(event, AudioAppend)
    config = SessionConfig().updated(TURN_BASED_OPTIONS)
    if formats.input != "pcm16":
        config = config.updated(
            type(TURN_BASED_OPTIONS)(input_audio_codec=formats.input, input_sample_rate=8_000)
        )
    machine = SessionMachine(config)
    machine.handle(ConnectionAttached(1), 0.0)
    out = machine.handle(event, 0.0)
    model_rate = np.zeros(0, dtype=np.float32)
    for effect in out:  # the model-rate PCM the actor pushes to the VAD link
        pcm = getattr(effect, "pcm", None)
        if isinstance(pcm, np.ndarray):
            model_rate = pcm
    return out, StreamingResampler(config.model_sample_rate, 16_000).process(model_rate)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=16.0)
    args = parser.parse_args()
    pcm_text = message(args.mib, width=2)
    ulaw_text = message(args.mib, width=1)
    ulaw = WireFormats("g711_ulaw", "g711_ulaw")
    stages: dict[str, Callable[[], object]] = {
        "/v1/duplex parse": lambda: parse_client_event(pcm_text),
        "/v1/duplex session": lambda: native_session(pcm_text),
        "/v1/realtime parse": lambda: RealtimeProjection().parse(pcm_text),
        "/v1/realtime session": lambda: realtime_session(pcm_text, WireFormats()),
        "/v1/realtime g711 parse": lambda: RealtimeProjection(formats=ulaw).parse(ulaw_text),
        "/v1/realtime g711 session": lambda: realtime_session(ulaw_text, ulaw),
    }
    size = len(pcm_text)
    print(f"message: {size / MIB:.2f} MiB of JSON text")
    print(f"{'stage':28} {'peak MiB':>9} {'x message':>10}")
    for name, stage in stages.items():
        top = peak(stage)
        print(f"{name:28} {top / MIB:9.1f} {top / size:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
