"""Shared helpers for the session-core tests (imported as a plain module)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from duplex.sessions import (
    AudioAppend,
    Capabilities,
    ConnectionAttached,
    Effect,
    ModelFrame,
    Send,
    ServerEvent,
    SessionConfig,
    SessionMachine,
)

RATE = 24_000
FRAME = 1_920  # 80 ms at 24 kHz


def counter_random() -> Callable[[int], bytes]:
    """Deterministic stand-in for os.urandom: a counter, big-endian."""
    counter = itertools.count(1)
    return lambda n: next(counter).to_bytes(n, "big")


def machine(
    *, caps: Capabilities | None = None, attach: bool = True, **config: object
) -> SessionMachine:
    """A machine with a deterministic id source, attached as generation 1 at t=0."""
    m = SessionMachine(SessionConfig(**config), caps, random_bytes=counter_random())
    if attach:
        m.handle(ConnectionAttached(1), 0.0)
    return m


def sends(effects: list[Effect]) -> list[ServerEvent]:
    return [e.event for e in effects if isinstance(e, Send)]


def of(effects: list[Effect], cls: type) -> list:
    """Effects of ``cls``, or server events of ``cls`` carried by Send effects."""
    direct = [e for e in effects if isinstance(e, cls)]
    return direct or [e for e in sends(effects) if isinstance(e, cls)]


def silence(ms: float) -> AudioAppend:
    return AudioAppend(np.zeros(int(RATE * ms / 1000), dtype=np.float32))


def loud(ms: float) -> AudioAppend:
    n = int(RATE * ms / 1000)
    return AudioAppend((0.3 * np.sin(np.arange(n) * 0.2)).astype(np.float32))


def speaking(m: SessionMachine, text: str = "", *, end: bool = False, epoch: int | None = None):
    pcm = np.full(FRAME, 0.1, dtype=np.float32)
    return ModelFrame(m.epoch if epoch is None else epoch, pcm, text, True, end)


def listening(m: SessionMachine) -> ModelFrame:
    return ModelFrame(m.epoch, np.zeros(FRAME, dtype=np.float32), "", False, False)
