"""The server's process layout when ``connection_workers`` or ``session_shards`` is ``auto``.

One H200 serving Moshi-7B (146 slots, fp8 KV) measured the rule this encodes
(docs/benchmarks.md, "Served"): the engine process alone holds 64 sessions best (a
worker hop costs more than it saves there), and fails at 128 (p99 79-85 ms, missed
ticks), while 4 connection workers and 2 session shards hold 128-144 with every frame.
So: a GPU engine with more than ``ONE_PROCESS_SESSIONS`` slots gets a shard per
``SESSIONS_PER_SHARD`` slots and two workers per shard, within the cores the engine
processes leave. A CPU model stays in one process (the reasons are in
docs/operations.md, "Layout"). Pure: numbers in, numbers out.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import final

from duplex.config import Config

__all__ = ["Layout", "available_cores", "layout", "resolve_layout"]

ONE_PROCESS_SESSIONS = 64
"""Slots up to which one session process carries every session of a GPU engine."""

SESSIONS_PER_SHARD = 75
"""Sessions one session process carries with room (the 16-core host's rule of thumb,
one shard per 50-100 sessions)."""

WORKERS_PER_SHARD = 2
"""Connection workers per session shard (4 workers and 2 shards held 128-144 on one H200)."""

MAX_AUTO_SHARDS = 8
MAX_AUTO_WORKERS = 16


@final
@dataclass(frozen=True, slots=True)
class Layout:
    """What ``auto`` resolves to.

    Args:
        connection_workers: worker processes for the sockets (0: the server process).
        session_shards: session processes (1: the server process only).
        reason: one line for the startup log: why this layout.
    """

    connection_workers: int
    session_shards: int
    reason: str


def layout(cores: int, slots: int, device: str) -> Layout:
    """The layout for a server on ``cores`` CPU cores whose engines hold ``slots`` sessions
    in all, on ``device`` (``model_device``: ``cpu``, ``cuda``, ``cuda:0,cuda:1``).

    Each engine process keeps a core of its own; the session processes (the server
    process is shard 0) and the workers share the rest, shards first, and shards above
    one need a worker (the workers route to them). Never more processes than cores.
    """
    devices = [part.strip() for part in device.split(",") if part.strip()]
    if not devices or all(part == "cpu" for part in devices):
        return Layout(0, 1, "a CPU model: one process")
    if slots <= ONE_PROCESS_SESSIONS:
        return Layout(0, 1, f"{slots} slots: the session process carries them alone")
    spare = cores - len(devices)  # what the engine processes leave
    if spare < 3:  # a shard and a worker need a core each beside the server process
        return Layout(0, 1, f"{cores} cores for {len(devices)} engines: no room for more")
    shards = min(math.ceil(slots / SESSIONS_PER_SHARD), MAX_AUTO_SHARDS, spare // 3)
    shards = max(shards, 1)
    workers = min(WORKERS_PER_SHARD * shards, MAX_AUTO_WORKERS, spare - shards)
    return Layout(
        workers,
        shards,
        f"{slots} slots on {len(devices)} GPU engine(s), {cores} cores: "
        f"{shards} session process(es), {workers} connection workers",
    )


def available_cores() -> int:
    """The cores this process may run on (its affinity, as ``taskset`` sets it)."""
    return len(os.sched_getaffinity(0))


def resolve_layout(config: Config, *, slots: int, cores: int) -> tuple[Config, Layout]:
    """``config`` with ``auto`` workers and shards replaced by numbers, and the layout.

    A number the operator gave is kept; ``auto`` takes ``layout``'s. Shards above one
    get at least one worker when the workers are ``auto``; ``auto`` shards stay at one
    when the operator asked for no workers. Without engine processes the engine runs in
    the session process, which must not be split: one process.

    Raises:
        ConfigError: the resulting numbers break a rule of ``ServerConfig``.
    """
    server = config.server
    workers, shards = server.connection_workers, server.session_shards
    if workers != "auto" and shards != "auto":
        return config, Layout(workers, shards, "as configured")
    if config.engine_processes:
        chosen = layout(cores, slots, config.engine.model_device)
    else:
        chosen = Layout(0, 1, "the engine runs in the session process: one process")
    if shards == "auto":
        shards = chosen.session_shards if workers != 0 else 1
    if workers == "auto":
        workers = chosen.connection_workers if shards == 1 else max(chosen.connection_workers, 1)
    server = dataclasses.replace(server, connection_workers=workers, session_shards=shards)
    chosen = Layout(workers, shards, chosen.reason)
    return dataclasses.replace(config, server=server), chosen
