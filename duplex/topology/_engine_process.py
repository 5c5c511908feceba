"""An engine process: one engine (slot pool, scheduler, runner, tick clock) per device,
serving the links of every session process.

    python -m duplex.topology._engine_process --link-fd F --index I --path P \
        --device D --fingerprint H --config B64

Spawned by ``EngineProcesses`` (``_engines.py``), never by hand. It builds the
model on its device (capturing CUDA graphs before it says ``Ready``), runs the
engine under an ``EngineActor`` (a crash in a step starts a fresh engine in this
process) and listens on a Unix socket. Each session process connects once and
holds its sessions' slots over that link (``_engine_link.py``): slots are
granted or refused here, so no two session processes can oversubscribe the
engine. After every tick each link gets its slots' outputs as one message.

The request-batched models the config serves (`runner_specs`: the robot
policy, ...) run here too, each a supervised `RequestEngine` whose batch
units run in the slack this engine's ticks leave; session processes submit
over the same link and are answered one `RequestDone` per request.

When the engine restarts, every link is closed: each session process
reconnects, finds the new engine and moves its sessions onto it (they are told
``engine_error``), the same path as when this whole process dies and its
supervisor starts another. SIGINT is left to the server; ``Stop`` or the end
of the control link ends the process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from collections.abc import Sequence
from functools import partial
from typing import Any, final

import trio

from duplex.actors import ActorRef, open_actor_system
from duplex.config import Config
from duplex.exceptions import (
    PromptUnsupported,
    RequestFailed,
    RequestsOverloaded,
    SlotReleased,
    VideoInputUnsupported,
)
from duplex.logs import get_logger
from duplex.models import (
    EngineActor,
    EngineDriver,
    EngineRecorder,
    ModelSpec,
    Slack,
    SlotHandle,
    SlotOutput,
)
from duplex.progress import Startup
from duplex.runtime import RequestEngines

from ._children import child_config, child_parser
from ._engine_link import (
    STATUS_PERIOD_S,
    CancelRequest,
    CloseSlot,
    Commands,
    EngineStatus,
    Hello,
    OpenSlot,
    PushPcm,
    PushVideo,
    RequestDone,
    Reset,
    RunnerInfo,
    SlotOpened,
    SubmitRequest,
    decode,
    encode_outputs,
)
from ._link import EXIT_STALE_CODE, Link, Ready, Stop
from ._memory import trim_counts, trim_memory_every
from ._requests import runner_specs, start_request_engines
from ._server import (
    SERVER_DEAD_LETTERS,
    build_engine,
    freeze_startup_objects,
    limit_torch_threads,
    log_startup_progress,
    resolve_model,
)

ACCEPT_RETRY_S = 0.1


@final
class _Forward:
    """A slot's subscriber on this side: its outputs join its link's message of the tick."""

    __slots__ = ("link",)

    def __init__(self, link: SessionLink) -> None:
        self.link = link

    def send_nowait(self, output: SlotOutput, /) -> None:
        if self.link.gone:
            raise trio.ClosedResourceError("the session process's link is gone")
        self.link.pending.append(output)


@final
class SessionLink:
    """One session process's link: the slots it holds, its tick's outputs, and its requests
    to the request engines hosted here."""

    def __init__(
        self, link: Link, driver: EngineDriver, recorder: EngineRecorder, requests: RequestEngines
    ) -> None:
        self.link = link
        self.driver = driver
        self.recorder = recorder
        self.requests = requests
        self.in_flight: dict[int, trio.CancelScope] = {}
        self.nursery: trio.Nursery | None = None
        self.handles: dict[tuple[int, int], SlotHandle] = {}
        self.pending: list[SlotOutput] = []
        self.rejected: dict[tuple[int, int], int] = {}
        self.gone = False
        self._forward = _Forward(self)

    def flush(self) -> None:
        """Send this tick's outputs (one message), with the frames refused since the last."""
        if not self.pending:
            return
        outputs, self.pending = self.pending, []
        rejected = self.rejected
        entries = [
            (out, rejected.pop((out.handle.slot, out.handle.generation), 0)) for out in outputs
        ]
        self.link.post_framed(encode_outputs(entries))

    def status(self) -> None:
        driver = self.driver
        statistics = driver.statistics()
        engine = dataclasses.replace(
            statistics.engine, slot_underruns=dict(statistics.engine.slot_underruns)
        )  # a mapping proxy does not pickle
        requests = {}
        for name in self.requests.configured:
            service = self.requests.get(name)
            figures = None if service is None else service.statistics()
            if figures is not None:
                requests[name] = figures
        statistics = dataclasses.replace(statistics, engine=engine)
        self.link.post(
            EngineStatus(
                driver.capacity(), statistics, self.recorder.snapshot(), requests, trim_counts()
            )
        )

    def handle(self, message: Any) -> None:
        driver = self.driver
        match message:
            case Commands():
                for command in message:
                    handle = self.handles.get((command.slot, command.generation))
                    if handle is None:
                        continue  # closed by the session process a moment ago
                    with contextlib.suppress(SlotReleased):
                        self._apply(handle, command)
            case OpenSlot(request, owner, prompt):
                try:
                    handle = driver.attach(owner, self._forward, prompt=prompt)
                except PromptUnsupported as exc:
                    self.link.post(SlotOpened(request, -1, 0, driver.capacity(), str(exc)))
                    return
                if handle is None:
                    self.link.post(SlotOpened(request, -1, 0, driver.capacity()))
                    return
                self.handles[(handle.slot, handle.generation)] = handle
                self.link.post(
                    SlotOpened(request, handle.slot, handle.generation, driver.capacity())
                )
            case CloseSlot(slot, generation):
                handle = self.handles.pop((slot, generation), None)
                if handle is not None:
                    driver.detach(handle)
                self.rejected.pop((slot, generation), None)
            case SubmitRequest():
                assert self.nursery is not None
                scope = self.in_flight[message.request] = trio.CancelScope()
                self.nursery.start_soon(self._run_request, message, scope)
            case CancelRequest(request):
                scope = self.in_flight.pop(request, None)
                if scope is not None:
                    scope.cancel()
            case _:
                raise TypeError(f"unexpected message on an engine link: {message!r}")

    async def _run_request(self, message: SubmitRequest, scope: trio.CancelScope) -> None:
        """One request on its engine here, answered with `RequestDone` (none if cancelled)."""
        request = message.request
        with scope:
            try:
                service = self.requests.get(message.runner)
                if service is None:  # restarting after a crash
                    answer = RequestDone(request, error=f"{message.runner} is restarting")
                else:
                    done = await service.submit_timed(message.payload, priority=message.priority)
                    answer = RequestDone(request, done.result, done.run_ms, done.batch_size)
            except RequestsOverloaded as exc:
                answer = RequestDone(request, error=str(exc), retry_after_s=exc.retry_after_s)
            except RequestFailed as exc:
                cause = exc.__cause__
                detail = f" ({type(cause).__name__}: {str(cause)[:200]})" if cause else ""
                answer = RequestDone(request, error=f"{exc}{detail}")
            finally:
                self.in_flight.pop(request, None)
            if not self.gone:
                self.link.post(answer)

    def _apply(self, handle: SlotHandle, command: PushPcm | PushVideo | Reset) -> None:
        driver = self.driver
        match command:
            case PushPcm(_, _, pcm):
                push = driver.push_input(handle, pcm)
                if push.frames_rejected:
                    key = (handle.slot, handle.generation)
                    self.rejected[key] = self.rejected.get(key, 0) + push.frames_rejected
            case PushVideo(_, _, frame_id, pts_ms, payload):
                with contextlib.suppress(VideoInputUnsupported):
                    driver.push_video(handle, frame_id, pts_ms, payload)
            case Reset(_, _, epoch, clear_input):
                driver.reset(handle, epoch, clear_input=clear_input)

    def release_all(self) -> None:
        """The link ended: every slot it held goes back to the pool."""
        self.gone = True
        for handle in self.handles.values():
            self.driver.detach(handle)
        self.handles.clear()


@final
class EngineServer:
    """This process's engine and the session processes' links to it."""

    def __init__(self, spec: ModelSpec, index: int, requests: RequestEngines | None = None) -> None:
        self.spec = spec
        self.index = index
        self.requests = requests if requests is not None else RequestEngines(())
        self.recorder = EngineRecorder(spec.name, spec.max_slots)
        """Its histograms (a private registry: the session processes export them)."""
        self.driver: EngineDriver | None = None
        self.started = trio.Event()
        self.links: dict[SessionLink, trio.CancelScope] = {}
        self.log = get_logger(component="engine", model=spec.name, engine=index)

    async def engine_started(self, driver: EngineDriver) -> None:
        """The ``EngineActor``'s hand-over: a restarted engine closes every link."""
        previous, self.driver = self.driver, driver
        driver.on_tick = self._flush
        if previous is not None:
            self.log.error("engine restarted; session processes reconnect", links=len(self.links))
            for scope in self.links.values():
                scope.cancel()
        self.started.set()

    def _flush(self) -> None:
        for session_link in self.links:
            session_link.flush()

    async def serve(self, sock: trio.socket.SocketType) -> None:
        driver = self.driver
        assert driver is not None
        link = Link(trio.SocketStream(sock), decode=decode)
        session_link = SessionLink(link, driver, self.recorder, self.requests)
        with trio.CancelScope() as scope:
            self.links[session_link] = scope
            try:
                await link.while_sending(self._serve, session_link)
            finally:
                del self.links[session_link]
                session_link.release_all()
        with trio.CancelScope(shield=True):
            await link.stream.aclose()

    def hello(self) -> Hello:
        runners = []
        for name in sorted(self.requests.configured):
            service = self.requests.get(name)
            runners.append(RunnerInfo(name, dict(service.metadata) if service else {}))
        return Hello(self.spec, self.index, tuple(runners))

    async def _serve(self, session_link: SessionLink) -> None:
        session_link.link.post(self.hello())
        session_link.status()
        async with trio.open_nursery() as nursery:
            session_link.nursery = nursery
            nursery.start_soon(self._report, session_link)
            async for message in session_link.link.messages():
                session_link.handle(message)
            nursery.cancel_scope.cancel()

    @staticmethod
    async def _report(session_link: SessionLink) -> None:
        while True:
            await trio.sleep(STATUS_PERIOD_S)
            session_link.status()


async def run_engine_process(
    index: int, path: str, device: str, link_fd: int, config: Config
) -> None:
    control = Link(trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=link_fd))))
    config = dataclasses.replace(
        config, engine=dataclasses.replace(config.engine, model_device=device)
    )
    spec, factory = resolve_model(config)
    specs = runner_specs(config, device)
    requests = RequestEngines([runner.name for runner in specs])
    server = EngineServer(spec, index, requests)
    log = server.log
    slack = Slack()  # the realtime ticks first; the request engines here run in what they leave

    startup = Startup()
    request_refs: list[ActorRef[Any]] = []
    async with open_actor_system(
        name=f"duplex-engine-{index}", dead_letter_capacity=SERVER_DEAD_LETTERS
    ) as system:
        log.info("building the engine", device=device)
        async with trio.open_nursery() as progress:  # "still starting" lines meanwhile
            # one bar per terminal: engine 0 draws it, the others log lines
            bar = None if index == 0 else False
            progress.start_soon(partial(log_startup_progress, startup, bar=bar))
            with startup.step("engine", f"building model {spec.name} on {device}"):
                engine_ref = await system.spawn(
                    EngineActor,
                    partial(build_engine, spec, factory, config.session, server.recorder, slack),
                    server.engine_started,
                    trio.to_thread.run_sync,
                    name=f"engine-{spec.name}",
                )
                await server.started.wait()
            if specs:
                if device == "cpu":
                    limit_torch_threads()
                names = ", ".join(runner.name for runner in specs)
                with startup.step("requests", f"building {names} on {device}"):
                    request_refs = await start_request_engines(system, specs, requests, slack)
                    for runner in specs:
                        await requests.wait(runner.name)
            progress.cancel_scope.cancel()
        freeze_startup_objects()
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a socket left by this engine's previous process
        await listener.bind(path)
        listener.listen(128)

        async def accept(nursery: trio.Nursery) -> None:
            with listener:
                while True:
                    try:
                        sock, _ = await listener.accept()
                    except OSError as exc:
                        log.error("accepting a session process's link failed", error=str(exc))
                        await trio.sleep(ACCEPT_RETRY_S)
                        continue
                    nursery.start_soon(server.serve, sock)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(control.send_loop)
            nursery.start_soon(accept, nursery)
            nursery.start_soon(trim_memory_every, config.server.malloc_trim_interval_s, slack)
            control.post(Ready())
            log.info("engine ready", device=device, max_slots=spec.max_slots)
            async for message in control.messages():
                if isinstance(message, Stop):
                    break
            nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            for ref in reversed(request_refs):
                await system.stop(ref)
            await system.stop(engine_ref)


def main(argv: Sequence[str] | None = None) -> int:
    parser = child_parser(__doc__.splitlines()[0])
    parser.add_argument("--device", required=True)
    args = parser.parse_args(argv)
    config = child_config(args, component="engine", engine=args.index)
    if config is None:
        return EXIT_STALE_CODE
    trio.run(partial(run_engine_process, args.index, args.path, args.device, args.link_fd, config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
