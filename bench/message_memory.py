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
``--rss`` also runs each stage in a fresh process and reports its resident memory
above what the process held with the text built (Linux; glibc's mmap threshold fixed
so freed blocks go back to the system); it would show what `tracemalloc` does not
see, and the two agree to 1 MiB. A 16 MiB G.711 append is over half
an hour of 8 kHz audio: the session refuses it (``input_backpressure``), so its
``session`` stage is its parse. docs/protocol/duplex.md ("Limits and defaults") quotes
the result.
"""

from __future__ import annotations

import argparse
import base64
import gc
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Callable

import numpy as np

from duplex.sessions import (
    AudioAppend,
    ConnectionAttached,
    SessionConfig,
    SessionMachine,
    StreamingResampler,
)
from duplex.wire._native import parse_client_event
from duplex.wire._realtime import TURN_BASED_OPTIONS, RealtimeProjection, WireFormats

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


def stages(pcm_text: str, ulaw_text: str) -> dict[str, Callable[[], object]]:
    ulaw = WireFormats("g711_ulaw", "g711_ulaw")
    return {
        "/v1/duplex parse": lambda: parse_client_event(pcm_text),
        "/v1/duplex session": lambda: native_session(pcm_text),
        "/v1/realtime parse": lambda: RealtimeProjection().parse(pcm_text),
        "/v1/realtime session": lambda: realtime_session(pcm_text, WireFormats()),
        "/v1/realtime g711 parse": lambda: RealtimeProjection(formats=ulaw).parse(ulaw_text),
        "/v1/realtime g711 session": lambda: realtime_session(ulaw_text, ulaw),
    }


def _status(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def rss_peak(mib: float, name: str) -> int:
    """Resident memory at the peak of stage ``name``, above the process holding the text.

    Linux only: the high-water mark is reset (``/proc/self/clear_refs``) once the text
    is built, so building it does not hide the stage's own peak.
    """
    stage = stages(message(mib, width=2), message(mib, width=1))[name]
    gc.collect()
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    base = _status("VmRSS")
    stage()
    return _status("VmHWM") - base


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=16.0)
    parser.add_argument("--rss", action="store_true", help="also RSS, one process per stage")
    parser.add_argument("--stage", help=argparse.SUPPRESS)  # the child of --rss
    args = parser.parse_args()
    if args.stage:
        print(rss_peak(args.mib, args.stage))
        return 0
    pcm_text = message(args.mib, width=2)
    size = len(pcm_text)
    print(f"message: {size / MIB:.2f} MiB of JSON text")
    print(
        f"{'stage':28} {'peak MiB':>9} {'x message':>10}" + (f" {'RSS MiB':>8}" if args.rss else "")
    )
    for name, stage in stages(pcm_text, message(args.mib, width=1)).items():
        top = peak(stage)
        line = f"{name:28} {top / MIB:9.1f} {top / size:10.2f}"
        if args.rss:
            command = [sys.executable, __file__, "--mib", str(args.mib), "--stage", name]
            # a fixed mmap threshold: glibc returns every large block when it is freed,
            # so building the text leaves no freed heap for the stage to reuse unseen
            env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
            child = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
            rss = int(child.stdout)
            line += f" {rss / MIB:8.1f}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
