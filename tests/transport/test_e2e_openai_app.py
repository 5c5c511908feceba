"""A typical OpenAI Realtime app, on the official ``openai`` SDK, against ``/v1/realtime``.

The app configures its session the way real apps do (instructions, voice, input
transcription, text-only output, a function tool with ``tool_choice: auto``), holds a
text turn, feeds a tool result back and asks again, then asks an out-of-band question.
Every event is read raw and checked strictly against the SDK's own types
(``check_wire``), then parsed by the SDK as an app would.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import trio
from openai import AsyncOpenAI

from ..wire.test_realtime import check_wire
from .wsclient import ENERGY_VAD, running_server

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


async def until(
    conn: Any, kind: str, seen: list[dict[str, Any]], *, timeout_s: float = 10.0
) -> dict[str, Any]:
    """Read events (each validated strictly) until one of ``kind``; returns it."""
    async with asyncio.timeout(timeout_s):
        while True:
            event = json.loads(await conn.recv_bytes())
            check_wire(event, schema="ga", duplex=False)
            conn.parse_event(json.dumps(event))  # the SDK's own parse, as the app's loop does
            seen.append(event)
            if event["type"] in (kind, "error"):
                return event


async def weather_turns(
    conn: Any, seen: list[dict[str, Any]], *, max_output_tokens: int, timeout_s: float = 10.0
) -> None:
    """The app's session and its two turns: configure, ask, feed a tool result, ask again."""
    await configure_weather_app(
        conn, seen, max_output_tokens=max_output_tokens, timeout_s=timeout_s
    )
    await conn.conversation.item.create(
        item={
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Weather in Paris?"}],
        }
    )
    await conn.response.create()
    await until(conn, "response.done", seen, timeout_s=timeout_s)
    await conn.conversation.item.create(
        item={
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        }
    )
    await conn.conversation.item.create(
        item={"type": "function_call_output", "call_id": "call_1", "output": "21 C, sunny"}
    )
    await conn.response.create()
    await until(conn, "response.done", seen, timeout_s=timeout_s)


async def configure_weather_app(
    conn: Any,
    seen: list[dict[str, Any]],
    *,
    max_output_tokens: int,
    timeout_s: float = 10.0,
    tools_callable: bool = False,
) -> None:
    """The app's session set-up: instructions, text out, voice, transcription, a tool.

    ``tools_callable``: the model that answers can call tools (the agent with ``--llm``);
    else the server takes the tool and warns, once, that it will never be called."""
    await until(conn, "session.created", seen, timeout_s=timeout_s)
    await conn.session.update(
        session={
            "type": "realtime",
            "instructions": "You are a terse weather assistant.",
            "output_modalities": ["text"],
            "audio": {
                "input": {"transcription": {"model": "whisper-1"}, "turn_detection": None},
                "output": {"voice": "marin"},
            },
            "tools": [WEATHER],  # type: ignore[list-item]
            "tool_choice": "auto",
            "max_output_tokens": max_output_tokens,
        }
    )
    await until(conn, "session.updated", seen, timeout_s=timeout_s)
    if not tools_callable:
        warning = await until(conn, "error", seen, timeout_s=timeout_s)
        assert warning["error"]["code"] == "tools_not_supported", warning
        assert warning["error"]["param"] == "session.tools"


async def _app(base_url: str) -> list[dict[str, Any]]:
    client = AsyncOpenAI(api_key="unused", websocket_base_url=base_url)
    seen: list[dict[str, Any]] = []
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await weather_turns(conn, seen, max_output_tokens=512)
        await conn.response.create(
            response={
                "conversation": "none",
                "output_modalities": ["text"],
                "metadata": {"purpose": "title"},
                "input": [{"type": "item_reference", "id": seen_user_item(seen)}],
            }
        )
        await until(conn, "response.done", seen)
    return seen


def seen_user_item(seen: list[dict[str, Any]]) -> str:
    return next(
        e["item"]["id"]
        for e in seen
        if e["type"] == "conversation.item.added" and e["item"].get("role") == "user"
    )


async def test_a_typical_app_session_runs_and_every_event_validates() -> None:
    async with running_server(**ENERGY_VAD) as server:
        base = server.http.replace("http://", "ws://") + "/v1"
        seen = await trio.to_thread.run_sync(lambda: asyncio.run(_app(base)))
    kinds = [e["type"] for e in seen]
    errors = [e["error"]["code"] for e in seen if e["type"] == "error"]
    assert errors == ["tools_not_supported"]  # the loopback's responder calls no tool
    (updated,) = (e["session"] for e in seen if e["type"] == "session.updated")
    assert updated["instructions"] == "You are a terse weather assistant."
    assert updated["output_modalities"] == ["text"]
    assert updated["audio"]["output"]["voice"] == "marin"
    assert updated["audio"]["input"]["transcription"] == {"model": "whisper-1"}
    assert updated["tools"] == [WEATHER] and updated["tool_choice"] == "auto"
    assert updated["max_output_tokens"] == 512
    # text-only: text deltas, never audio
    assert not any("audio" in k and "delta" in k for k in kinds)
    dones = [e for e in seen if e["type"] == "response.done"]
    texts = [e["text"] for e in seen if e["type"] == "response.output_text.done"]
    assert len(dones) == 3 and [d["response"]["status"] for d in dones] == ["completed"] * 3
    assert texts == ["Weather in Paris?", "21 C, sunny", "Weather in Paris?"]
    deltas = "".join(e["delta"] for e in seen if e["type"] == "response.output_text.delta")
    assert deltas == "".join(texts)
    # the tool items round-trip in the conversation
    added = [e["item"] for e in seen if e["type"] == "conversation.item.added"]
    call = next(i for i in added if i["type"] == "function_call")
    assert (call["call_id"], call["name"]) == ("call_1", "get_weather")
    output = next(i for i in added if i["type"] == "function_call_output")
    assert output["output"] == "21 C, sunny"
    # out of band: no conversation item, the metadata echoed, no conversation id
    oob = dones[-1]["response"]
    assert oob["metadata"] == {"purpose": "title"} and oob["conversation_id"] is None
    oob_item = oob["output"][0]["id"]
    assert not any(i["id"] == oob_item for i in added)


async def _tools_on_the_echo(base_url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The SDK: ``models.list()``, then a session that sets a tool, is told, and goes on."""
    client = AsyncOpenAI(api_key="unused", base_url=base_url)
    cards = [model.model_dump() for model in (await client.models.list()).data]
    seen: list[dict[str, Any]] = []
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await configure_weather_app(conn, seen, max_output_tokens=64)  # the tool: warned
        await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
        await until(conn, "session.updated", seen)  # no tools in it: no second warning
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Weather in Paris?"}],
            }
        )
        await conn.response.create()
        await until(conn, "response.done", seen)
    return cards, seen


async def test_tools_the_reply_model_cannot_call_are_flagged() -> None:
    """With the voice agent's default reply model (the echo, no ``--llm``): ``GET
    /v1/models`` says it calls no tools and follows no instructions, and a
    ``session.update`` that sets tools gets a ``tools_not_supported`` warning after its
    ``session.updated``; the session goes on and answers. With ``--llm`` neither (the
    warning's absence there: tests/services/test_e2e_chat_vllm.py)."""
    async with running_server(**{"server.agent": True}) as server:
        cards, seen = await trio.to_thread.run_sync(
            lambda: asyncio.run(_tools_on_the_echo(server.http + "/v1"))
        )
    chat = next(card for card in cards if card.get("kind") == "chat")
    assert chat["id"] == "echo"
    assert chat["capabilities"] == {"tools": False, "instructions": False, "text_only": True}
    realtime = cards[0]["capabilities"]
    assert (realtime["agent_cascade"], realtime["reply_tools"]) == (True, False)
    kinds = [e["type"] for e in seen]
    assert kinds.count("session.updated") == 2
    (warning,) = [e["error"] for e in seen if e["type"] == "error"]
    assert kinds.index("error") == kinds.index("session.updated") + 1  # right after it
    assert "--llm" in warning["message"] and warning["type"] == "invalid_request_error"
    done = seen[-1]["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["text"] == "You said: Weather in Paris?."
