"""``WS /v1/video/chat/stream``: the I/O shell around `VideoChat` (``_protocol.py``).

One connection is a reader and the work the protocol asks for, in one nursery: the
reader parses each message, decodes a frame's thumbnail (in a worker thread, one at a
time per connection: frames faster than that wait in the socket, never in memory) and
feeds the protocol; a `Prefill` runs the buffered frames through the engine with a
one-token limit, so their KV blocks sit in vllm's prefix cache; an `Answer` streams the
reply's text (``response.text.delta``), says which frames it was made over
(``video.frames.consumed``, after its first output), then speaks it sentence by sentence
through the agent's TTS when ``audio`` is among the modalities
(``response.audio.delta``: base64 PCM16 at the TTS's rate), and ends with
``response.done``. The prompt is the conversation the chat template renders: the system
prompt, one user turn with the frames, one with the question; so a prefill's prompt is a
prefix of the query's, and the query pays for its own suffix only.

Needs a vision-language checkpoint (``--llm DIR`` whose config has a vision tower);
otherwise the socket is told ``model_not_loaded`` (or ``image_input_not_supported``) and
closed.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Awaitable, Callable
from typing import Any, Final, final

import numpy as np
import trio
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from duplex.exceptions import DuplexError, ProtocolError
from duplex.logs import get_logger
from duplex.metrics import Counter, MetricsRegistry
from duplex.models.agent import (
    ChatEngine,
    ChatPart,
    ChatRequest,
    ChatTurn,
    ChatUsage,
    Sampling,
)
from duplex.models.tts import split_sentences
from duplex.pcm import float_to_pcm16

from .._models import VIDEO_CHAT, served_names
from ._protocol import (
    Answer,
    Frame,
    Prefill,
    Send,
    State,
    VideoChat,
    VideoChatConfig,
    error,
    parse_event,
)

__all__ = ["VIDEO_CHAT_PATH", "VideoChatService", "video_chat_routes"]

VIDEO_CHAT_PATH: Final = "/v1/video/chat/stream"
THUMBNAIL: Final = 8
"""Pixels a side of the grey thumbnail the near-duplicate filter compares."""
MAX_ANSWER_TOKENS: Final = 256
CONFIG_TIMEOUT_S: Final = 10.0
"""``session.config`` must come this soon."""

Speak = Callable[[str, str], Awaitable[tuple[np.ndarray, int]]]
"""The agent's TTS: text and voice in, float samples and their rate out."""


@final
class VideoChatService:
    """The engine and the voice a video chat uses.

    Args:
        engine: the running chat engine (``None``: loading, or none).
        speak: the agent's TTS (``None``: no speech; ``audio`` is refused).
        configured: a chat model is configured (``--llm`` with the agent on).
        registry: where the route's counters go.
    """

    def __init__(
        self,
        engine: Callable[[], ChatEngine | None],
        speak: Callable[[], Speak | None],
        *,
        configured: bool,
        registry: MetricsRegistry | None = None,
    ) -> None:
        self._engine = engine
        self._speak = speak
        self.configured = configured
        self._counts: Counter | None = None
        if registry is not None:
            self._counts = registry.counter(
                "duplex_video_chat_total",
                "Live video chat events, by what happened (frames, skipped, evicted, "
                "queries, errors)",
                ["what"],
            )

    @property
    def engine(self) -> ChatEngine | None:
        return self._engine()

    @property
    def speak(self) -> Speak | None:
        return self._speak()

    def count(self, what: str, n: int = 1) -> None:
        if self._counts is not None and n:
            self._counts.inc(n, what=what)


def _thumbnail(image: bytes) -> bytes:
    """A frame's grey thumbnail (`THUMBNAIL` squared bytes), decoded off the event loop.

    Raises:
        ValueError: the image does not decode (or is over 16.7 M pixels by its header).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(image)) as picture:
            width, height = picture.size
            if width * height > 4096 * 4096:
                raise ValueError(f"{width}x{height} is over 16.7 M pixels")
            small = picture.convert("L").resize((THUMBNAIL, THUMBNAIL))
            return small.tobytes()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"the image does not decode: {exc}") from exc


def _request(
    config: VideoChatConfig, frames: tuple[Frame, ...], question: str | None
) -> ChatRequest:
    """The conversation: system prompt, the frames, the question (``None``: a prefill,
    whose prompt is the query's prefix)."""
    turns = []
    if config.system_prompt:
        turns.append(ChatTurn("system", (ChatPart("text", config.system_prompt),)))
    turns.append(ChatTurn("user", tuple(ChatPart("image", image=f.image) for f in frames)))
    if question is not None:
        turns.append(ChatTurn("user", (ChatPart("text", question),)))
    limit = 1 if question is None else MAX_ANSWER_TOKENS
    return ChatRequest(tuple(turns), Sampling(max_tokens=limit, temperature=0.0))


@final
class VideoChatSocket:
    """One connection: the protocol, its reader and the work it asks for."""

    def __init__(self, service: VideoChatService, engine: ChatEngine, websocket: WebSocket) -> None:
        self.service = service
        self.engine = engine
        self.ws = websocket
        self.chat = VideoChat()
        self._lock = trio.Lock()
        self._decoder = trio.CapacityLimiter(1)
        self._log = get_logger(component="video_chat")

    async def send(self, action: Send) -> None:
        if action.event.get("type") == "error":
            self.service.count("errors")
        async with self._lock:
            await self.ws.send_text(action.text())

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            await self._reader(nursery)
            nursery.cancel_scope.cancel()  # the client left: its work is withdrawn

    async def _reader(self, nursery: trio.Nursery) -> None:
        configured = False
        while True:
            with trio.move_on_after(math.inf if configured else CONFIG_TIMEOUT_S) as waited:
                try:
                    message = await self.ws.receive()
                except (RuntimeError, WebSocketDisconnect):
                    return
            if waited.cancelled_caught:
                late = f"no session.config in {CONFIG_TIMEOUT_S:g} s"
                await self.send(error("config_timeout", late))
                await self.ws.close(1008, "config_timeout")
                return
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            if raw is None:
                raw = message.get("bytes") or b""
            event = parse_event(raw)
            if isinstance(event, Frame) and self.chat.state is not State.AWAIT_CONFIG:
                try:
                    thumb = await trio.to_thread.run_sync(
                        _thumbnail, event.image, limiter=self._decoder
                    )
                except ValueError as exc:
                    await self.send(error("invalid_image", str(exc), "image"))
                    continue
                event = Frame(event.image, event.frame_id, event.pts_ms, thumb)
                skipped, evicted = self.chat.skipped, self.chat.evicted
                actions = self.chat.receive(event)
                self.service.count("frames")
                self.service.count("skipped", self.chat.skipped - skipped)
                self.service.count("evicted", self.chat.evicted - evicted)
            else:
                actions = self.chat.receive(event)
            if not configured and self.chat.state is not State.AWAIT_CONFIG:
                configured = True
                refused = self._check_config(self.chat.config)
                if refused is not None:
                    await self.send(refused)
                    await self.ws.close(1008, str(refused.event["error"]["code"]))
                    return
            await self._act(actions, nursery)

    def _check_config(self, config: VideoChatConfig) -> Send | None:
        try:  # "" is left out
            VIDEO_CHAT.accepted(config.model or None, served_names(self.engine.model))
        except ProtocolError as exc:
            return error(exc.code, exc.message, exc.param)
        if config.max_frames > self.engine.max_images:
            return error(
                "invalid_value",
                f"max_frames: the loaded model takes at most {self.engine.max_images} frames",
                "max_frames",
            )
        if "audio" in config.modalities and self.service.speak is None:
            return error(
                "audio_output_not_available", 'no TTS: ask modalities ["text"]', "modalities"
            )
        return None

    async def _act(self, actions: list[Any], nursery: trio.Nursery) -> None:
        for action in actions:
            if isinstance(action, Send):
                await self.send(action)
            elif isinstance(action, Prefill):
                nursery.start_soon(self._prefill, action, nursery)
            elif isinstance(action, Answer):
                self.service.count("queries")
                nursery.start_soon(self._answer, action, nursery)

    async def _prefill(self, prefill: Prefill, nursery: trio.Nursery) -> None:
        try:
            async for _ in self.engine.chat(_request(prefill.config, prefill.frames, None), 0):
                pass
        except DuplexError as exc:
            self._log.warning("prefill failed", error=str(exc))
            await self.send(error("prefill_failed", str(exc)))
        await self._act(self.chat.prefill_done(), nursery)

    async def _answer(self, answer: Answer, nursery: trio.Nursery) -> None:
        config = answer.config
        if answer.query.audio or answer.audio:
            await self.send(
                Send(
                    {
                        "type": "warning",
                        "warning": {
                            "code": "audio_input_not_used",
                            "message": "the loaded model takes no audio input: the "
                            "query's audio and the buffered audio were not used",
                        },
                    }
                )
            )
        text, told, usage = "", False, ChatUsage(0, 0)
        try:
            request = _request(config, answer.frames, answer.query.text)
            async for item in self.engine.chat(request, 0):
                if isinstance(item, ChatUsage):
                    usage = item
                    continue
                if item.text:
                    text += item.text
                    await self.send(Send({"type": "response.text.delta", "delta": item.text}))
                    if not told:
                        told = True
                        await self.send(self.chat.consumed(answer))
            if not told:
                await self.send(self.chat.consumed(answer))
            await self.send(Send({"type": "response.text.done", "text": text}))
            speak = self.service.speak
            if "audio" in config.modalities and speak is not None and text.strip():
                for sentence in split_sentences(text):
                    samples, rate = await speak(sentence, "alloy")
                    pcm = float_to_pcm16(samples).tobytes()
                    await self.send(
                        Send(
                            {
                                "type": "response.audio.delta",
                                "sample_rate": rate,
                                "audio": base64.b64encode(pcm).decode("ascii"),
                            }
                        )
                    )
                await self.send(Send({"type": "response.audio.done"}))
            await self.send(
                Send(
                    {
                        "type": "response.done",
                        "usage": {
                            "prompt_tokens": usage.prompt_tokens,
                            "completion_tokens": usage.completion_tokens,
                        },
                    }
                )
            )
        except DuplexError as exc:
            self._log.warning("video query failed", error=str(exc))
            await self.send(error("query_failed", str(exc)))
        await self._act(self.chat.answer_done(answer), nursery)


def video_chat_routes(service: VideoChatService | None) -> list[BaseRoute]:
    """The live video chat route over ``service`` (``None``: none here; it says so)."""

    async def socket(websocket: WebSocket) -> None:
        await websocket.accept()
        engine = service.engine if service is not None and service.configured else None
        if service is None or not service.configured:
            refused = error(
                "model_not_loaded",
                "No vision-language model is loaded on this "
                "server (start it with --llm DIR, a local vision-language checkpoint "
                "served by vLLM).",
            )
        elif engine is None:
            refused = error("model_loading", "The model is loading; retry shortly.")
        elif not engine.multimodal:
            refused = error(
                "image_input_not_supported",
                "The loaded model is text-only: "
                "live video chat needs a vision-language checkpoint (--llm DIR).",
            )
        else:
            await VideoChatSocket(service, engine, websocket).run()
            return
        await websocket.send_text(refused.text())
        await websocket.close(1008, str(refused.event["error"]["code"]))

    return [WebSocketRoute(VIDEO_CHAT_PATH, socket)]
