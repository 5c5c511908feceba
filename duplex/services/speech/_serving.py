"""The speech endpoints: thin adapters between the wire (``_speech_wire.py``) and the TTS engine.

``POST /v1/audio/speech`` (whole file, or ``stream: true``: audio sentence by
sentence as it is made), ``POST /v1/audio/speech/batch`` (results in input
order) and ``WS /v1/audio/speech/stream`` (``GET /v1/audio/voices`` lists the voices
with the uploaded ones: ``duplex.services.voices``). Each
request is one or more `SpeechRequest`s submitted to the process's TTS
`RequestEngine` (the one the voice agent speaks with), which batches them
across clients and runs them in the slack a realtime engine leaves.

Overload is ``429`` with ``Retry-After``; a client that leaves withdraws its
requests (HTTP: the handler watches for ``http.disconnect``; a stream: the
socket's reader ends the connection's nursery). Without a TTS engine
(``--tts none``) every speech route answers ``404``
``tts_not_loaded``; while it loads, ``503`` with ``Retry-After``.
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final, Protocol, TypeVar, final

import numpy as np
import trio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from duplex.codecs import MEDIA_TYPES, OPUS_RATE, AudioStream, encode_audio, resample_pcm16
from duplex.exceptions import EngineUnavailable, RequestFailed, RequestsOverloaded
from duplex.logs import get_logger
from duplex.metrics import Counter, MetricsRegistry
from duplex.models.tts import TTS_RUNNER, SpeechRequest, split_sentences, voice_problem
from duplex.refusals import Refusal
from duplex.runtime import RequestEngines, RequestService
from duplex.transport import refusal_response
from duplex.wire import dumps

from .._client import unless_gone
from .._cost import speech_audio_refusal
from ._protocol import (
    MAX_SPEECH_BODY,
    CloseStream,
    FinishUtterance,
    Reply,
    Speak,
    SpeechParams,
    SpeechStream,
    StreamConfig,
    error_event,
    parse_batch,
    parse_speech,
)

_T = TypeVar("_T")

__all__ = ["LOADING", "SpeechService", "UploadedVoices", "speech_routes"]

STREAM_CONFIG_TIMEOUT_S: Final = 10.0
"""A stream's ``session.config`` must come this soon (vLLM-Omni's limit)."""
STREAM_IDLE_TIMEOUT_S: Final = 30.0
"""A stream that sends nothing this long, with nothing queued, is closed (vLLM-Omni's)."""
STREAM_QUEUE: Final = 64
"""Sentences (and utterance ends) one stream may have queued; its reader waits beyond."""
OVERLOAD_RETRY_S: Final = 30.0
"""How long a started stream keeps retrying a sentence the full queue refused."""

NOT_LOADED = Refusal(
    404,
    "No text-to-speech model is loaded on this server (start it with --tts espeak, or "
    "--tts PATH for a VITS checkpoint).",
    "tts_not_loaded",
)
LOADING = Refusal(503, "The text-to-speech model is loading.", "tts_loading", retry_after_s=1.0)
FAILED = Refusal(500, "Speech synthesis failed.", "tts_failed")
UNAVAILABLE = Refusal(
    503,
    "The text-to-speech engine is restarting; retry shortly.",
    "tts_unavailable",
    retry_after_s=1.0,
)


def _overloaded(exc: RequestsOverloaded) -> Response:
    message = "Too many speech requests are waiting; retry later."
    refused = Refusal(429, message, "rate_limit_exceeded", retry_after_s=exc.retry_after_s)
    return refusal_response(refused)


class UploadedVoices(Protocol):
    """The uploaded voices, as the TTS's voice check asks after them."""

    def exists(self, name: str) -> bool: ...


@final
class SpeechService:
    """The server's TTS, as the speech routes see it: the request engine named ``tts`` in the
    process's registry (local, or in an engine process; replaced when it restarts).

    Args:
        requests: the process's request engines.
        registry: where the speech endpoints' counters go (the engine's own are exported by
            ``requests``, labelled ``runner="tts"``).
        uploaded: the uploaded voices (``None``: none kept here); a request naming one is
            refused ``voice_not_supported``, as no TTS served here conditions on a sample.
        max_audio_s: the most audio one request, or one batch together, may make, by its
            estimate (`duplex.services.speech_audio_refusal`); more is refused 400 up front.
    """

    def __init__(
        self,
        requests: RequestEngines,
        registry: MetricsRegistry | None = None,
        *,
        uploaded: UploadedVoices | None = None,
        max_audio_s: float = 600.0,
    ) -> None:
        self.requests = requests
        self.uploaded = uploaded
        self.max_audio_s = max_audio_s
        """The most audio one request or batch may make (``speech.max_audio_s``)."""
        self._workers = trio.CapacityLimiter(max(1, (os.cpu_count() or 2) - 1))
        """Resampling and encoding run in worker threads, at most one per core but one, so
        the sessions' event loop keeps a core however many clips are encoded at once."""
        self._outcomes: Counter | None = None
        if registry is not None:
            self._outcomes = registry.counter(
                "duplex_speech_requests_total",
                "Speech endpoint requests, by endpoint and outcome",
                ["endpoint", "outcome"],
            )

    @property
    def configured(self) -> bool:
        """This server serves a TTS (``--tts`` is not ``none``)."""
        return TTS_RUNNER in self.requests.configured

    @property
    def engine(self) -> RequestService | None:
        """The TTS engine now (``None``: starting, or restarting)."""
        return self.requests.get(TTS_RUNNER)

    def count(self, endpoint: str, outcome: str) -> None:
        if self._outcomes is not None:
            self._outcomes.inc(endpoint=endpoint, outcome=outcome)

    def _metadata(self) -> Mapping[str, Any]:
        engine = self.engine
        assert engine is not None
        return engine.metadata

    def check_voice(self, voice: str) -> str | Refusal | None:
        """The engine's verdict on ``voice``: ``None``, a message listing the valid ones, or,
        for an uploaded voice, ``voice_not_supported``: the TTS cannot speak with a sample,
        and another voice is never used instead."""
        problem = voice_problem(self._metadata(), voice)
        if problem is not None and self.uploaded is not None and self.uploaded.exists(voice):
            return Refusal(
                400,
                f"Voice {voice!r} is an uploaded sample, and the text-to-speech model served "
                "here cannot condition on a sample: use one of its built-in voices "
                "(GET /v1/audio/voices), or the uploaded voice with a model that takes "
                "voice prompts (PersonaPlex).",
                "voice_not_supported",
                "voice",
            )
        return problem

    @property
    def model(self) -> str:
        """The TTS's name, as ``GET /v1/models`` lists it (the engine's own: ``espeak``, a
        checkpoint's folder); a request's ``model`` names it or an OpenAI alias of it."""
        return str(self._metadata().get("model", TTS_RUNNER))

    @property
    def native_rate(self) -> int:
        return int(self._metadata()["sample_rate"])

    async def speak(self, text: str, params: SpeechParams | StreamConfig) -> np.ndarray:
        """``text`` spoken as ``params`` asks, at its output rate (int16).

        Raises:
            RequestsOverloaded, RequestFailed: as `RequestEngine.submit` (``RequestFailed``
                also when the engine is not running).
        """
        engine = self.engine
        if engine is None:
            raise RequestFailed("the TTS engine is not running")
        audio = await engine.submit(SpeechRequest(text, params.voice, params.speed))
        return await self.off_loop(
            resample_pcm16, audio.pcm, audio.sample_rate, self.output_rate(params)
        )

    async def off_loop(self, work: Callable[..., _T], *args: Any) -> _T:
        """``work(*args)`` in a worker thread: a 17 s clip took 235 ms to encode as MP3, 330
        ms as Opus (resampled to 24 kHz first: 55 ms more) on CPU-2, which on the event loop
        held every session's ticks (a served trial, 16 sessions and 6 SDK requests at once:
        delay p99 0.6-0.8 s, 130-170 missed ticks); the codecs release the GIL for most of
        it."""
        return await trio.to_thread.run_sync(work, *args, limiter=self._workers)

    def output_rate(self, params: SpeechParams | StreamConfig) -> int:
        if params.response_format == "opus":
            return OPUS_RATE
        return int(params.sample_rate or self.native_rate)

    def voices_body(self) -> dict[str, Any]:
        metadata = self._metadata()
        voices = metadata["voices"]
        return {
            "object": "list",
            "voices": [voice["name"] for voice in voices],
            "data": voices,
            "sample_rate": metadata["sample_rate"],
            "variants": metadata.get("variants", []),
        }


async def _read_body(request: Request) -> bytes | Refusal:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_SPEECH_BODY:
            return Refusal(413, f"The body is over {MAX_SPEECH_BODY} bytes.", "body_too_large")
    return body


def speech_routes(service: SpeechService | None) -> list[BaseRoute]:
    """The speech routes over ``service`` (``None``: no TTS here; each route says so)."""
    return SpeechRoutes(service).routes()


@final
class SpeechRoutes:
    """The handlers of the speech routes over one `SpeechService` (``None``: no TTS here)."""

    def __init__(self, service: SpeechService | None) -> None:
        self.service = service
        self.log = get_logger(component="speech")

    def _ready(self, endpoint: str) -> Response | None:
        service = self.service
        if service is None or not service.configured:
            return refusal_response(NOT_LOADED)
        if service.engine is None:
            service.count(endpoint, "loading")
            return refusal_response(LOADING)
        return None

    async def _attempt(self, endpoint: str, what: str, work: Callable[[], Awaitable[Any]]) -> Any:
        """``work``'s result, or the answer to its refusal (429) or failure (500, logged as
        ``what``), counted either way."""
        service = self.service
        assert service is not None
        try:
            return await work()
        except RequestsOverloaded as exc:
            service.count(endpoint, "refused")
            return _overloaded(exc)
        except EngineUnavailable as exc:  # its engine process is being restarted: retry
            service.count(endpoint, "unavailable")
            self.log.warning(what, error=str(exc))
            return refusal_response(UNAVAILABLE)
        except RequestFailed as exc:
            service.count(endpoint, "failed")
            self.log.error(what, exc_info=exc)
            return refusal_response(FAILED)

    async def _parsed_body(
        self, request: Request, endpoint: str, parse: Callable[..., Any]
    ) -> Any | Response:
        """The request, parsed and bounded; or the refusal. The body is read (within its
        bound) before anything is refused, a missing TTS too: an answer that leaves a
        body unread leaves the connection unusable for the client's next request."""
        body = await _read_body(request)
        if (early := self._ready(endpoint)) is not None:
            return early
        service = self.service
        assert service is not None
        if isinstance(body, Refusal):
            service.count(endpoint, "invalid")
            return refusal_response(body)
        parsed = parse(body, service.model, service.check_voice)
        if isinstance(parsed, Refusal):
            service.count(endpoint, "invalid")
            return refusal_response(parsed)
        items = parsed if isinstance(parsed, list) else [parsed]
        too_long = speech_audio_refusal(
            [(len(item.input), item.speed) for item in items],
            max(service.output_rate(item) for item in items),
            service.max_audio_s,
        )
        if too_long is not None:  # the response's size is bounded before any audio is made
            service.count(endpoint, "too_long")
            self.log.info("speech refused", reason="audio_too_long", items=len(items))
            return refusal_response(too_long)
        return parsed

    async def speech(self, request: Request) -> Response:
        service = self.service
        endpoint = "speech"
        params = await self._parsed_body(request, endpoint, parse_speech)
        if isinstance(params, Response):
            return params
        assert service is not None  # (a parsed request: the TTS is there)
        if params.stream:
            return await self._stream_http(request, params)
        outcome = await self._attempt(
            endpoint,
            "speech failed",
            lambda: unless_gone(request, lambda: service.speak(params.input, params)),
        )
        if isinstance(outcome, Response):
            return outcome
        done, pcm = outcome
        if not done:
            service.count(endpoint, "cancelled")
            return Response(status_code=499)  # nobody reads it
        service.count(endpoint, "ok")
        rate = service.output_rate(params)
        body = await service.off_loop(encode_audio, pcm, rate, params.response_format)
        return Response(body, media_type=MEDIA_TYPES[params.response_format])

    async def _stream_http(self, request: Request, params: SpeechParams) -> Response:
        """``stream: true``: the first sentence is made before answering (so overload is still
        a 429), the rest as the client reads."""
        service = self.service
        assert service is not None
        endpoint = "speech_stream"
        sentences = split_sentences(params.input)
        first = await self._attempt(
            endpoint, "speech failed", lambda: service.speak(sentences[0], params)
        )
        if isinstance(first, Response):
            return first
        encoder = AudioStream(params.response_format, service.output_rate(params))

        async def body() -> AsyncIterator[bytes]:
            outcome = "cancelled"  # until the last byte is handed over
            try:
                yield await service.off_loop(encoder.chunk, first)
                for sentence in sentences[1:]:
                    pcm = await self._speak_retrying(sentence, params)
                    yield await service.off_loop(encoder.chunk, pcm)
                yield await service.off_loop(encoder.end)
                outcome = "ok"
            except RequestFailed as exc:
                outcome = "failed"
                self.log.error("speech failed mid-stream", exc_info=exc)
            finally:
                service.count(endpoint, outcome)

        return StreamingResponse(body(), media_type=MEDIA_TYPES[params.response_format])

    async def _speak_retrying(self, text: str, params: SpeechParams) -> np.ndarray:
        """A started stream's next sentence: a full queue is waited out (up to
        `OVERLOAD_RETRY_S`), since the client already has the start of the audio."""
        service = self.service
        assert service is not None
        deadline = trio.current_time() + OVERLOAD_RETRY_S
        while True:
            try:
                return await service.speak(text, params)
            except RequestsOverloaded as exc:
                if trio.current_time() >= deadline:
                    raise RequestFailed("the TTS queue stayed full") from exc
                await trio.sleep(min(1.0, exc.retry_after_s))

    async def batch(self, request: Request) -> Response:
        service = self.service
        endpoint = "speech_batch"
        items = await self._parsed_body(request, endpoint, parse_batch)
        if isinstance(items, Response):
            return items
        assert service is not None  # (a parsed request: the TTS is there)
        results: list[np.ndarray | None] = [None] * len(items)

        async def all_items() -> None:
            failed: list[Exception] = []

            async def one(i: int, params: SpeechParams, everyone: trio.CancelScope) -> None:
                try:
                    results[i] = await service.speak(params.input, params)
                except (RequestsOverloaded, RequestFailed) as exc:  # the batch fails as one
                    failed.append(exc)
                    everyone.cancel()

            async with trio.open_nursery() as nursery:  # submitted together: batched together
                for i, params in enumerate(items):
                    nursery.start_soon(one, i, params, nursery.cancel_scope)
            if failed:
                raise failed[0]

        outcome = await self._attempt(
            endpoint, "speech batch failed", lambda: unless_gone(request, all_items)
        )
        if isinstance(outcome, Response):
            return outcome
        done, _ = outcome
        if not done:
            service.count(endpoint, "cancelled")
            return Response(status_code=499)
        service.count(endpoint, "ok")
        rates = [service.output_rate(params) for params in items]

        def answer() -> bytes:
            data = []
            for i, (params, pcm, rate) in enumerate(zip(items, results, rates, strict=True)):
                assert pcm is not None
                audio = encode_audio(pcm, rate, params.response_format)
                data.append(
                    {
                        "index": i,
                        "object": "audio.speech",
                        "format": params.response_format,
                        "media_type": MEDIA_TYPES[params.response_format],
                        "sample_rate": rate,
                        "duration_s": round(pcm.size / rate, 3),
                        "audio": base64.b64encode(audio).decode("ascii"),
                    }
                )
            return dumps({"object": "list", "model": items[0].model, "data": data}).encode()

        return Response(await service.off_loop(answer), media_type="application/json")

    async def stream_socket(self, websocket: WebSocket) -> None:
        service = self.service
        await websocket.accept()
        if service is None or not service.configured or service.engine is None:
            loading = service is not None and service.configured
            refused = LOADING if loading else NOT_LOADED
            await websocket.send_text(error_event(refused.message, refused.code))
            await websocket.close(1000 if loading else 1008, refused.code)
            return
        await SpeechSocket(service, websocket).run()

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/v1/audio/speech", self.speech, methods=["POST"]),
            Route("/v1/audio/speech/batch", self.batch, methods=["POST"]),
            WebSocketRoute("/v1/audio/speech/stream", self.stream_socket),
        ]


@final
class SpeechSocket:
    """One ``WS /v1/audio/speech/stream`` connection: a reader that feeds the protocol
    (`SpeechStream`) and answers its errors at once, and a speaker that runs its sentences in
    order. Either ending (the client left, ``session.close``) ends both."""

    def __init__(self, service: SpeechService, websocket: WebSocket) -> None:
        self.service = service
        self.ws = websocket
        self.protocol = SpeechStream(service.model, service.check_voice)
        self._send_lock = trio.Lock()
        self._unsaid = 0  # sentences queued and not yet sent

    async def run(self) -> None:
        send, receive = trio.open_memory_channel[Speak | FinishUtterance | CloseStream](
            STREAM_QUEUE
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._speaker, receive, nursery.cancel_scope)
            await self._reader(send)
            nursery.cancel_scope.cancel()  # the client left: withdraw what is queued
        if self._unsaid:  # counted once the connection's work is over: nothing more runs
            self.service.count("speech_stream_ws", "cancelled")

    async def _send_text(self, text: str) -> None:
        async with self._send_lock:
            await self.ws.send_text(text)

    async def _reader(self, queue: trio.MemorySendChannel[Any]) -> None:
        timeout = STREAM_CONFIG_TIMEOUT_S
        while True:
            with trio.move_on_after(timeout) as waited:
                try:
                    message = await self.ws.receive()
                except (RuntimeError, WebSocketDisconnect):
                    return
            if waited.cancelled_caught:
                reason = "config_timeout" if self.protocol.config is None else "idle_timeout"
                await self._send_text(error_event(f"no message for {timeout:g} s", reason))
                await self.ws.close(1000 if self.protocol.config else 1008, reason)
                return
            if message["type"] == "websocket.disconnect":
                return
            frame = message.get("text")
            if frame is None:
                frame = message.get("bytes") or b""
            for action in self.protocol.receive(frame):
                if isinstance(action, Reply):
                    await self._send_text(action.text)
                else:
                    self._unsaid += isinstance(action, Speak)
                    await queue.send(action)  # full: this reader waits (backpressure)
            timeout = STREAM_IDLE_TIMEOUT_S if self.protocol.config else STREAM_CONFIG_TIMEOUT_S

    async def _speaker(
        self, queue: trio.MemoryReceiveChannel[Any], everything: trio.CancelScope
    ) -> None:
        async for action in queue:
            if isinstance(action, CloseStream):
                await self.ws.close(action.code, action.reason)
                everything.cancel()
                return
            if isinstance(action, FinishUtterance):
                await self._send_text(action.event())
                continue
            await self._say(action)

    async def _say(self, speak: Speak) -> None:
        config = speak.config
        try:
            pcm = await self.service.speak(speak.text, config)
        except (RequestsOverloaded, RequestFailed) as exc:
            code = "rate_limit_exceeded" if isinstance(exc, RequestsOverloaded) else "tts_failed"
            self.service.count("speech_stream_ws", "refused" if code != "tts_failed" else "failed")
            await self._send_text(error_event(f"sentence {speak.sentence_index}: {exc}", code))
            self._unsaid -= 1
            return
        rate = self.service.output_rate(config)
        audio = await self.service.off_loop(encode_audio, pcm, rate, config.response_format)
        async with self._send_lock:
            await self.ws.send_text(speak.start_event(rate))
            await self.ws.send_bytes(audio)
            await self.ws.send_text(speak.done_event())
        self._unsaid -= 1
        self.service.count("speech_stream_ws", "ok")
