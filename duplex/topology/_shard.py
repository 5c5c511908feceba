"""A session shard process: its own sessions and engine, reached by the workers' links.

    python -m duplex.topology._shard --link-fd F --index I --path P --fingerprint H \
        --config B64

Spawned by ``ShardProcesses`` (``_shards.py``), never by hand. It runs what the
server process runs for its own sessions (``open_backend``: hub, engine, VAD)
and serves every link a connection worker opens on its Unix socket, exactly as
the server serves its workers' links (``LinkServer``). Over its control link it
tells the server it listens (``Ready``), answers ``/health`` and ``/metrics``
queries, and stops on ``Stop``: its sockets close with 1001, and it exits once
the workers, finishing their own shutdown, have closed their links. When the
server goes away it closes its sockets and exits. SIGINT is left to the server.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Sequence
from functools import partial
from typing import Any

import trio

from duplex.actors import open_actor_system
from duplex.config import Config
from duplex.logs import get_logger
from duplex.metrics import REGISTRY

from ._children import child_config, child_parser
from ._link import EXIT_STALE_CODE, Link, Ready, ShardAnswer, ShardQuery, Stop
from ._requests import open_request_engines
from ._server import SERVER_DEAD_LETTERS, open_backend
from ._sleep import SLEEP_REASON
from ._workers import LinkServer

ACCEPT_RETRY_S = 0.1


async def run_shard(
    index: int, path: str, link_fd: int, config: Config, engine_paths: Sequence[str] = ()
) -> None:
    log = get_logger(component="shard", shard=index)
    control_socket = trio.socket.from_stdlib_socket(socket.socket(fileno=link_fd))
    control = Link(trio.SocketStream(control_socket))
    async with (
        open_actor_system(
            name=f"duplex-shard-{index}", dead_letter_capacity=SERVER_DEAD_LETTERS
        ) as system,
        # with engine processes a shard reaches their request engines (the agent's ASR and
        # TTS) as the server process does; their counters are the server process's to export
        open_request_engines(config, system, None, None, local=False) as requests,
        open_backend(
            config,
            system,
            REGISTRY,
            shard=index,
            engine_paths=engine_paths,
            requests=requests if engine_paths else None,
        ) as backend,
    ):
        await backend.ready.wait()  # the server sends this shard sessions once it says Ready
        links = LinkServer(backend, REGISTRY)
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a socket left by this shard's previous process
        await listener.bind(path)
        listener.listen(128)

        async def serve_link(sock: trio.socket.SocketType) -> None:
            link = Link(trio.SocketStream(sock))
            await link.while_sending(partial(links.serve, link, name="worker"))

        async def accept(nursery: trio.Nursery) -> None:
            with listener:
                while True:
                    try:
                        sock, _ = await listener.accept()
                    except OSError as exc:  # out of descriptors, say: the workers try again
                        log.error("accepting a worker's link failed", error=str(exc))
                        await trio.sleep(ACCEPT_RETRY_S)
                        continue
                    nursery.start_soon(serve_link, sock)

        hub = backend.hub

        async def evict(request: int) -> None:
            """A forced sleep: every live session told and ended; how many."""
            control.post(ShardAnswer(request, await hub.evict_all(SLEEP_REASON)))

        def answer(what: str) -> Any:
            """This shard's part of ``/health`` or ``/metrics``, or of a sleep (``sleep``,
            ``wake``: admission closed or opened, and the sessions live); ``None`` leaves
            it out."""
            try:
                if what == "health":
                    return backend.health_of()
                if what == "metrics":
                    return REGISTRY.families()
                if what in ("sleep", "wake", "live"):
                    if what != "live":
                        hub.sleeping = what == "sleep"
                    return hub.live_sessions
            except Exception:  # a scrape must never end the shard and its sessions
                log.exception("answering the server failed", query=what)
            return None

        async with trio.open_nursery() as nursery:
            nursery.start_soon(control.send_loop)
            nursery.start_soon(accept, nursery)
            control.post(Ready())
            stopped = False
            async for message in control.messages():
                match message:
                    case Stop():
                        stopped = True
                        break
                    case ShardQuery(request, "evict"):
                        nursery.start_soon(evict, request)
                    case ShardQuery(request, what):
                        control.post(ShardAnswer(request, answer(what)))
            if not stopped:
                log.error("server process gone; closing sockets")
            await backend.connections.close_all(config.server.shutdown_grace_s / 2)
            if stopped:  # the workers close their links once their sockets are done
                with trio.move_on_after(config.server.shutdown_grace_s + 2):
                    await links.wait_unlinked()
            nursery.cancel_scope.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    parser = child_parser(__doc__.splitlines()[0])
    parser.add_argument("--engine-path", action="append", default=[])
    args = parser.parse_args(argv)
    config = child_config(args, component="shard", shard=args.index)
    if config is None:
        return EXIT_STALE_CODE
    trio.run(run_shard, args.index, args.path, args.link_fd, config, args.engine_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
