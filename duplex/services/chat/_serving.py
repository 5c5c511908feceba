"""The chat completion routes: thin adapters between the wire (``_protocol.py``) and the
agent's reply engine.

``POST /v1/chat/completions`` (whole, or ``stream: true``: server-sent events, one chunk
per piece the engine makes, a usage chunk last when asked) and ``POST
/v1/chat/completions/batch`` (one choice per conversation, in input order). Each choice
is one request on the engine the voice agent replies with (``--llm DIR``), behind every
live session's reply (``duplex.models.agent.CHAT_PRIORITY``).

Bounds: at most ``max_choices`` choices in flight (a request that would pass it gets
``429`` with ``Retry-After``, and is served again once others finish); every body and
field bounded in ``_protocol.py``. A client that leaves withdraws its choices (vllm
aborts them). Without ``--llm``: ``404`` ``model_not_loaded``; while it loads, ``503``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Final, final

import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from duplex.exceptions import PromptUnsupported
from duplex.logs import get_logger
from duplex.metrics import Counter, MetricsRegistry
from duplex.models.agent import ChatEngine, ChatRequest, ChatUsage
from duplex.refusals import Refusal
from duplex.transport import refusal_response
from duplex.wire import dumps

from .._client import unless_gone
from .._models import served_names
from ._protocol import (
    MAX_CHAT_BODY,
    ChatBatch,
    ChatCompletion,
    Choice,
    ModelInfo,
    chunk,
    completion_body,
    parse_batch,
    parse_chat,
    usage_chunk,
)

__all__ = ["CHAT_PATHS", "ChatService", "chat_modalities", "chat_routes"]

CHAT_PATHS: Final = ("/v1/chat/completions", "/v1/chat/completions/batch")
MAX_CHOICES: Final = 64
"""Choices in flight at once, every request together (a batch counts each conversation)."""
RETRY_AFTER_S: Final = 1.0
MAX_CHAT_IMAGES: Final = 8
"""The most images one conversation carries."""

NOT_LOADED = Refusal(
    404,
    "No chat model is loaded on this server (start it with --llm DIR, a local chat "
    "checkpoint served by vLLM; the voice agent must be on).",
    "model_not_loaded",
)
LOADING = Refusal(503, "The chat model is loading.", "model_loading", retry_after_s=1.0)
FAILED = Refusal(500, "The chat model failed on this request.", "model_failed")


@final
class ChatService:
    """The engine chat completions run on, as the routes see it.

    Args:
        engine: the running engine (``None``: still loading); called per request.
        configured: a chat model is configured (``--llm`` with the agent on).
        registry: where the endpoints' counters go.
        max_choices: choices in flight at once before requests are refused (429).
        wall_clock: seconds since the epoch, for ``created``.
    """

    def __init__(
        self,
        engine: Callable[[], ChatEngine | None],
        *,
        configured: bool,
        registry: MetricsRegistry | None = None,
        max_choices: int = MAX_CHOICES,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self.configured = configured
        self.max_choices = max_choices
        self.in_flight = 0
        self.wall_clock = wall_clock
        self._outcomes: Counter | None = None
        if registry is not None:
            self._outcomes = registry.counter(
                "duplex_chat_requests_total",
                "Chat completion requests, by endpoint and outcome",
                ["endpoint", "outcome"],
            )

    @property
    def engine(self) -> ChatEngine | None:
        return self._engine()

    def count(self, endpoint: str, outcome: str) -> None:
        if self._outcomes is not None:
            self._outcomes.inc(endpoint=endpoint, outcome=outcome)

    def model_info(self, engine: ChatEngine) -> ModelInfo:
        return ModelInfo(
            served_names(engine.model), engine.multimodal, min(engine.max_images, MAX_CHAT_IMAGES)
        )

    def admit(self, choices: int) -> Refusal | None:
        """Take ``choices`` places, or the 429 that refuses them (give them back with
        `release`)."""
        if self.in_flight + choices > self.max_choices:
            return Refusal(
                429,
                f"Too many chat choices in flight ({self.in_flight} of {self.max_choices}); "
                "retry shortly.",
                "rate_limit_exceeded",
                retry_after_s=RETRY_AFTER_S,
            )
        self.in_flight += choices
        return None

    def release(self, choices: int) -> None:
        self.in_flight -= choices


def chat_modalities(engine: ChatEngine | None) -> list[str]:
    """What the chat model takes, for its model card (``[]``: not running yet)."""
    if engine is None:
        return []
    return ["text", "image"] if engine.multimodal else ["text"]


async def _read_body(request: Request) -> bytes | Refusal:
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > MAX_CHAT_BODY:
            return Refusal(413, f"The body is over {MAX_CHAT_BODY} bytes.", "body_too_large")
    return bytes(body)


async def _run_choice(
    engine: ChatEngine, request: ChatRequest, index: int, choice: Choice
) -> ChatUsage:
    usage = ChatUsage(0, 0)
    async for item in engine.chat(request, index):
        if isinstance(item, ChatUsage):
            usage = item
        else:
            choice.add(item)
    return usage


def _invalid_prompt(exc: PromptUnsupported) -> Refusal:
    return Refusal(400, f"The model cannot take this prompt: {exc}", "invalid_prompt", "messages")


def chat_routes(service: ChatService | None) -> list[BaseRoute]:
    """The chat routes over ``service`` (``None``: no chat model here; each route says so)."""
    log = get_logger(component="chat")

    def ready() -> ChatEngine | Response:
        if service is None or not service.configured:
            return refusal_response(NOT_LOADED)
        engine = service.engine
        if engine is None:
            return refusal_response(LOADING)
        return engine

    async def answer(
        endpoint: str, choices: int, work: Callable[[], Awaitable[Response]]
    ) -> Response:
        """``work``'s response within ``choices`` admitted places; refusals and failures
        answered and counted."""
        assert service is not None
        refused = service.admit(choices)
        if refused is not None:
            service.count(endpoint, "refused")
            return refusal_response(refused)
        try:
            response = await work()
        except PromptUnsupported as exc:
            service.count(endpoint, "invalid")
            return refusal_response(_invalid_prompt(exc))
        except Exception as exc:
            service.count(endpoint, "failed")
            log.error("chat completion failed", endpoint=endpoint, exc_info=exc)
            return refusal_response(FAILED)
        finally:
            service.release(choices)
        return response

    async def completions(request: Request) -> Response:
        endpoint = "chat_completions"
        engine = ready()
        if isinstance(engine, Response):
            return engine
        assert service is not None
        body = await _read_body(request)
        parsed = body if isinstance(body, Refusal) else parse_chat(body, service.model_info(engine))
        if isinstance(parsed, Refusal):
            service.count(endpoint, "invalid")
            return refusal_response(parsed)
        if parsed.stream:
            return await stream(engine, parsed)
        return await answer(endpoint, parsed.n, lambda: whole(request, engine, parsed))

    async def whole(request: Request, engine: ChatEngine, parsed: ChatCompletion) -> Response:
        assert service is not None
        endpoint = "chat_completions"
        choices = [Choice(i, not parsed.parallel_tool_calls) for i in range(parsed.n)]
        usages: list[ChatUsage] = []

        async def every() -> None:
            async def one(i: int) -> None:
                usages.append(await _run_choice(engine, parsed.request, i, choices[i]))

            await _together([partial(one, i) for i in range(parsed.n)])

        done, _ = await unless_gone(request, every)
        if not done:
            service.count(endpoint, "cancelled")
            return Response(status_code=499)  # nobody reads it
        service.count(endpoint, "ok")
        created = int(service.wall_clock())
        body = completion_body(
            _completion_id(),
            created,
            parsed.model,
            choices,
            usages[0].prompt_tokens,
            sum(u.completion_tokens for u in usages),
        )
        return Response(dumps(body), media_type="application/json")

    async def stream(engine: ChatEngine, parsed: ChatCompletion) -> Response:
        """Server-sent events: a role chunk per choice, then each piece as the engine makes
        it, each choice's finish, the usage chunk when asked, ``[DONE]``. Admission is
        decided before answering (a full server is a ``429``); a prompt the engine refuses
        once the stream has begun ends it with an error event (as vLLM's server does)."""
        assert service is not None
        endpoint = "chat_completions_stream"
        refused = service.admit(parsed.n)
        if refused is not None:
            service.count(endpoint, "refused")
            return refusal_response(refused)
        id_, created, model = _completion_id(), int(service.wall_clock()), parsed.model
        usage = parsed.include_usage

        failure: list[Exception] = []

        async def produce(out: trio.MemorySendChannel[tuple[int, Any]]) -> None:
            async def one(i: int) -> None:
                async for item in engine.chat(parsed.request, i):
                    await out.send((i, item))

            async with out:  # closed when every choice is over: the reader's loop ends
                try:
                    await _together([partial(one, i) for i in range(parsed.n)])
                except Exception as exc:  # raised by the reader, which answers it
                    failure.append(exc)

        async def run(write: Callable[[bytes], Awaitable[None]]) -> None:
            outcome = "cancelled"  # until the last byte is handed over
            prompt_tokens, completion_tokens = 0, 0
            choices = [Choice(i, not parsed.parallel_tool_calls) for i in range(parsed.n)]
            try:
                for i in range(parsed.n):
                    role = {"role": "assistant", "content": ""}
                    await write(_event(chunk(id_, created, model, i, role, include_usage=usage)))
                send, receive = trio.open_memory_channel[tuple[int, Any]](0)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(produce, send)
                    async for index, item in receive:
                        if isinstance(item, ChatUsage):
                            prompt_tokens = item.prompt_tokens
                            completion_tokens += item.completion_tokens
                            continue
                        delta = choices[index].add(item)
                        if delta is not None:
                            await write(
                                _event(
                                    chunk(id_, created, model, index, delta, include_usage=usage)
                                )
                            )
                        if item.finish is not None:
                            finish = choices[index].finish
                            await write(
                                _event(
                                    chunk(
                                        id_, created, model, index, {}, finish, include_usage=usage
                                    )
                                )
                            )
                if failure:
                    raise failure[0]
                if usage:
                    await write(
                        _event(usage_chunk(id_, created, model, prompt_tokens, completion_tokens))
                    )
                await write(b"data: [DONE]\n\n")
                outcome = "ok"
            except PromptUnsupported as exc:
                outcome = "invalid"
                await write(_event(_invalid_prompt(exc).body()))
            except Exception as exc:
                outcome = "failed"
                log.error("chat stream failed", exc_info=exc)
                await write(_event(FAILED.body()))
            finally:
                service.release(parsed.n)
                service.count(endpoint, outcome)

        return EventStream(run)

    async def batch(request: Request) -> Response:
        endpoint = "chat_completions_batch"
        engine = ready()
        if isinstance(engine, Response):
            return engine
        assert service is not None
        body = await _read_body(request)
        parsed = (
            body if isinstance(body, Refusal) else parse_batch(body, service.model_info(engine))
        )
        if isinstance(parsed, Refusal):
            service.count(endpoint, "invalid")
            return refusal_response(parsed)
        return await answer(
            endpoint, len(parsed.requests), lambda: batch_answer(request, engine, parsed)
        )

    async def batch_answer(request: Request, engine: ChatEngine, parsed: ChatBatch) -> Response:
        assert service is not None
        endpoint = "chat_completions_batch"
        choices = [Choice(i) for i in range(len(parsed.requests))]
        usages: list[ChatUsage | None] = [None] * len(parsed.requests)

        async def every() -> None:
            async def one(i: int, conversation: ChatRequest) -> None:
                usages[i] = await _run_choice(engine, conversation, 0, choices[i])

            await _together([partial(one, i, c) for i, c in enumerate(parsed.requests)])

        done, _ = await unless_gone(request, every)
        if not done:
            service.count(endpoint, "cancelled")
            return Response(status_code=499)
        service.count(endpoint, "ok")
        counted = [u for u in usages if u is not None]
        body = completion_body(
            _completion_id(),
            int(service.wall_clock()),
            parsed.model,
            choices,
            sum(u.prompt_tokens for u in counted),
            sum(u.completion_tokens for u in counted),
        )
        return Response(dumps(body), media_type="application/json")

    return [
        Route(CHAT_PATHS[0], completions, methods=["POST"]),
        Route(CHAT_PATHS[1], batch, methods=["POST"]),
    ]


@final
class EventStream(Response):
    """A ``text/event-stream`` answer written by ``run(write)`` in the request's own task:
    a client that leaves cancels it (its engine requests are aborted), and its nursery
    never spans a ``yield``."""

    media_type = "text/event-stream"

    def __init__(
        self, run: Callable[[Callable[[bytes], Awaitable[None]]], Awaitable[None]]
    ) -> None:
        super().__init__(headers={"cache-control": "no-cache"})
        del self.headers["content-length"]  # a stream: its length is not known
        self._run = run

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        async def write(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        async def watch(cancel: trio.CancelScope) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            cancel.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, nursery.cancel_scope)
            await self._run(write)
            nursery.cancel_scope.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _together(works: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run ``works`` at once (submitted together: vllm batches them); the first to fail
    cancels the others and is raised as itself, not in an exception group."""
    failed: list[Exception] = []

    async def guarded(work: Callable[[], Awaitable[None]], everyone: trio.CancelScope) -> None:
        try:
            await work()
        except Exception as exc:  # raised below, outside the nursery's group
            failed.append(exc)
            everyone.cancel()

    async with trio.open_nursery() as nursery:
        for work in works:
            nursery.start_soon(guarded, work, nursery.cancel_scope)
    if failed:
        raise failed[0]


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + dumps(body).encode() + b"\n\n"


def _completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)
