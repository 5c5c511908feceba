"""What the server really sends on ``/v1/realtime``, recorded for ``tests/test_docs.py``.

One default server (``duplex serve``'s configuration: the voice agent answers, silero
VAD), one scripted conversation per schema (GA, beta, ``?duplex=1``), every server event
kept as it came off the socket. The docs' JSON examples are checked against these
recordings (event names, fields, defaults), and every refusal the docs promise is sent
here and its ``error`` kept (`REFUSALS`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from websockets.trio.client import ClientConnection, connect

from tests.agent.agentkit import grammar_file, silence, wav_pcm16
from tests.transport.wsclient import running_server

FRAME_BYTES = 3840  # 80 ms of PCM16 at 24 kHz


@dataclass(frozen=True)
class Refusal:
    """A client event the docs say is refused: what to send (``{"binary": True}``: a binary
    frame), the ``error.code`` it gets, and ``doc_phrase``: words of the docs that promise it.
    Every line of the page that names a refusal must hold one refusal's phrase
    (``tests/test_docs.py``)."""

    doc_phrase: str
    event: dict[str, Any]
    code: str


def _update(session: dict[str, Any]) -> dict[str, Any]:
    return {"type": "session.update", "session": session}


def _item(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "conversation.item.create", "item": item}


def _user(*parts: dict[str, Any]) -> dict[str, Any]:
    return _item({"type": "message", "role": "user", "content": list(parts)})


REFUSALS: tuple[Refusal, ...] = (
    Refusal("`transcription_session.update`", {"type": "transcription_session.update",
            "session": {}}, "unsupported_event"),
    Refusal('`"transcription"`', _update({"type": "transcription"}), "unsupported_parameter"),
    Refusal("`semantic_vad`", _update({"audio": {"input": {"turn_detection": {
            "type": "semantic_vad"}}}}), "unsupported_turn_detection"),
    Refusal("`truncation`", _update({"truncation": "auto"}), "unsupported_parameter"),
    Refusal("`include`", _update({"include": ["item.input_audio_transcription.logprobs"]}),
            "unsupported_parameter"),
    Refusal("`reasoning`", _update({"reasoning": {"effort": "low"}}), "unsupported_parameter"),
    Refusal("MCP tools", _update({"tools": [{"type": "mcp", "server_label": "x",
            "server_url": "https://example.invalid"}]}), "unsupported_parameter"),
    Refusal('`"required"`', _update({"tool_choice": "required"}), "unsupported_parameter"),
    Refusal("only the `?model=` value", _update({"model": "another-model"}),
            "unsupported_parameter"),
    Refusal("any other type is `unsupported_parameter`", _item({"type": "mcp_call"}),
            "unsupported_parameter"),
    Refusal("`1` / `1.0` only", _update({"audio": {"output": {"speed": 1.5}}}),
            "unsupported_parameter"),
    Refusal("`null` only", _update({"tracing": "auto"}), "unsupported_parameter"),
    Refusal("`unsupported_audio_format`", _update({"audio": {"input": {"format": {
            "type": "audio/pcm", "rate": 48000}}}}), "unsupported_audio_format"),
    Refusal("Two or more content parts", _user({"type": "input_text", "text": "a"},
            {"type": "input_text", "text": "b"}), "unsupported_parameter"),
    Refusal("An assistant audio part", _item({"type": "message", "role": "assistant",
            "content": [{"type": "output_audio", "transcript": "x"}]}), "unsupported_parameter"),
    Refusal("`transcript` on `input_audio`", _user({"type": "input_audio", "audio": "AAAA",
            "transcript": "hi"}), "unsupported_parameter"),
    Refusal("`prompt` and `reasoning` are `unsupported_parameter`", {"type": "response.create",
            "response": {"reasoning": {"effort": "low"}}}, "unsupported_parameter"),
    Refusal("`session.resume` is\n  `unknown_event`", {"type": "session.resume",
            "session_id": "x", "resume_token": "y", "last_received_server_event_seq": 0},
            "unknown_event"),
    Refusal("`binary_frame_unsupported`", {"binary": True}, "binary_frame_unsupported"),
)  # fmt: skip
"""What docs/protocol/realtime.md says ``/v1/realtime`` refuses."""

NATIVE_REFUSALS: tuple[Refusal, ...] = (
    Refusal("`binary_frame_unsupported`", {"binary": True}, "binary_frame_unsupported"),
    Refusal("`unsupported_audio_format`", {"type": "input_audio_buffer.append",
            "audio": "AAAA", "sample_rate": 44100}, "unsupported_audio_format"),
    Refusal("`g711_ulaw` or `g711_alaw`", {"type": "input_audio_buffer.append", "audio": "AAAA",
            "format": "g711_ulaw"}, "unsupported_audio_format"),
    Refusal("`param` `session.prompt`", {"type": "session.create",
            "session": {"prompt": {"voice": "NATF2.pt"}}}, "unsupported_parameter"),
)  # fmt: skip
"""What docs/protocol/duplex.md says ``/v1/duplex`` refuses (of a session, on the default
server)."""


@dataclass
class Recorded:
    """Every server event of one socket, in order; the refusals' errors by doc phrase."""

    events: list[dict[str, Any]] = field(default_factory=list)
    refused: dict[str, dict[str, Any]] = field(default_factory=dict)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


class _Socket:
    def __init__(self, ws: ClientConnection, recorded: Recorded) -> None:
        self.ws = ws
        self.recorded = recorded

    async def pump(self) -> None:
        async for text in self.ws:
            self.recorded.events.append(json.loads(text))

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def until(self, kind: str, *, after: int = 0, timeout: float = 30.0) -> dict[str, Any]:
        with trio.fail_after(timeout):
            while True:
                for event in self.recorded.events[after:]:
                    if event["type"] == kind:
                        return event
                await trio.sleep(0.01)

    async def ask(self, event: dict[str, Any], kind: str) -> dict[str, Any]:
        """Send ``event``; the first ``kind`` after it (or its ``error``)."""
        mark = len(self.recorded.events)
        await self.send(event)
        with trio.fail_after(30):
            while True:
                for seen in self.recorded.events[mark:]:
                    if seen["type"] in (kind, "error"):
                        return seen
                await trio.sleep(0.01)

    async def stream(self, pcm: bytes) -> None:
        for i in range(0, len(pcm), FRAME_BYTES):
            chunk = base64.b64encode(pcm[i : i + FRAME_BYTES]).decode()
            await self.send({"type": "input_audio_buffer.append", "audio": chunk})
            await trio.sleep(0.02)  # 4x real time: what the VAD keeps up with


Script = Callable[[_Socket], Awaitable[None]]


async def _ga(sock: _Socket) -> None:
    await sock.until("session.created")
    await sock.ask(
        _update(
            {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}
        ),
        "session.updated",
    )
    await sock.stream(wav_pcm16("hello.wav") + silence(1200))
    done = await sock.until("response.done")
    await sock.until("rate_limits.updated")
    assistant = done["response"]["output"][0]["id"]
    truncate = {"type": "conversation.item.truncate", "item_id": assistant, "content_index": 0}
    await sock.ask({**truncate, "audio_end_ms": 100}, "conversation.item.truncated")
    await sock.ask({**truncate, "audio_end_ms": 99999}, "error")
    await sock.ask({"type": "conversation.item.retrieve", "item_id": assistant},
                   "conversation.item.retrieved")  # fmt: skip
    await sock.ask({"type": "conversation.item.retrieve", "item_id": "item_nope"}, "error")
    await sock.ask(_user({"type": "input_text", "text": "hello"}), "conversation.item.done")
    mark = len(sock.recorded.events)
    await sock.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    await sock.until("response.done", after=mark)
    mark = len(sock.recorded.events)
    await sock.send({"type": "response.create"})  # and cancelled: a cancelled response.done
    await sock.until("response.created", after=mark)
    await sock.send({"type": "response.cancel"})
    await sock.until("response.done", after=mark)
    await _refusals(sock, REFUSALS)


async def _refusals(sock: _Socket, refusals: tuple[Refusal, ...]) -> None:
    for refusal in refusals:
        if "binary" in refusal.event:
            mark = len(sock.recorded.events)
            await sock.ws.send(b"\x00\x01")
            sock.recorded.refused[refusal.doc_phrase] = await sock.until("error", after=mark)
            continue
        sock.recorded.refused[refusal.doc_phrase] = await sock.ask(refusal.event, "error")


async def _beta(sock: _Socket) -> None:
    await sock.until("session.created")
    await sock.ask(_update({"input_audio_transcription": {"model": "whisper-1"}}),
                   "session.updated")  # fmt: skip
    await sock.ask(_user({"type": "input_text", "text": "hello"}), "conversation.item.created")
    mark = len(sock.recorded.events)
    await sock.send({"type": "response.create"})
    await sock.until("response.done", after=mark)


async def _duplex(sock: _Socket) -> None:
    await sock.until("session.created")
    await sock.ask(_update({}), "session.updated")
    await sock.stream(wav_pcm16("hello.wav") + silence(1200))
    await sock.until("response.done")


async def _native(sock: _Socket) -> None:
    """``/v1/duplex``: a session as docs/protocol/duplex.md opens one (after one with a
    prompt, which the loopback model refuses), its refusals, its close."""
    prompt, *others = NATIVE_REFUSALS[::-1]
    await _refusals(sock, (prompt,))
    await sock.send({"type": "session.create", "event_id": "evt_1",
                     "session": {"playback_commit_policy": "ack_only"}})  # fmt: skip
    await sock.until("session.created")
    await sock.ask({"type": "session.update", "event_id": "evt_2",
                    "session": {"overlap_barge_in_ms": 900}}, "session.updated")  # fmt: skip
    await _refusals(sock, tuple(others))
    await sock.ask({"type": "session.close", "event_id": "evt_7"}, "session.closed")


async def _run(url: str, script: Script, headers: dict[str, str]) -> Recorded:
    recorded = Recorded()
    async with (
        connect(url, max_queue=None, additional_headers=headers) as ws,
        trio.open_nursery() as nursery,
    ):
        sock = _Socket(ws, recorded)
        nursery.start_soon(sock.pump)
        await script(sock)
        nursery.cancel_scope.cancel()
    return recorded


async def replay(tmp_path: Path) -> dict[str, Recorded]:
    """The three conversations on one default server (the voice agent on, as ``duplex
    serve`` runs; a grammar makes its ASR deterministic)."""
    overrides = {"server.agent": True, "server.agent_asr_grammar": grammar_file(tmp_path)}
    async with running_server(**overrides) as server:
        base = server.http.replace("http://", "ws://") + "/v1/realtime"
        beta = {"OpenAI-Beta": "realtime=v1"}
        native = server.http.replace("http://", "ws://") + "/v1/duplex"
        return {
            "ga": await _run(base + "?model=gpt-realtime", _ga, {}),
            "beta": await _run(base, _beta, beta),
            "duplex": await _run(base + "?duplex=1&model=gpt-realtime", _duplex, {}),
            "native": await _run(native, _native, {}),
        }


if __name__ == "__main__":  # print the recordings (how the docs' examples are refreshed)
    import sys
    import tempfile

    async def main() -> None:
        with tempfile.TemporaryDirectory() as folder:
            recorded = await replay(Path(folder))
        for name, rec in recorded.items():
            print(f"## {name}")
            for event in rec.events:
                print(json.dumps(event, separators=(",", ":")))
            for phrase, error in rec.refused.items():
                print("refused", json.dumps(phrase), json.dumps(error, separators=(",", ":")))

    trio.run(main)
    sys.exit(0)
