"""The agent's LLM stage on vllm: one `AsyncLLM` shared by every session of the process.

vllm's engine is asyncio; the server is trio. The engine lives on its own thread with its
own asyncio loop (`VllmReplier.load` starts both); each reply is one ``generate`` call
scheduled onto that loop, whose outputs come back to trio through the trio token
(``run_sync_soon``: the vllm loop never waits for trio). Continuous batching is vllm's:
every session's requests share the engine. Cancelling the trio side cancels the asyncio
task, and vllm aborts the request (a barge-in frees its KV blocks at once).

The conversation becomes a prompt through the checkpoint's own chat template (tools
included); with tools, the reply is read as it streams by vllm's tool parser (``hermes``:
its ``extract_tool_calls_streaming``): text before a call comes back as text, a call as
tool-call `ReplyDelta` s, one as soon as its name is known and one per growth of its
arguments, the last at its ``</tool_call>`` (or the end of the reply).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
from collections.abc import AsyncIterator
from typing import Any

import trio

from ._reply import LLM_CAPABILITIES, ChatMessage, ReplyDelta, ReplyRequest

__all__ = ["VllmReplier"]

TOOL_TAG = "<tool_call>"


class VllmReplier:
    """A local chat checkpoint served by vllm.

    Args:
        path: the checkpoint folder (``config.json``, weights, tokenizer with a chat template).
        seed: the base sampling seed (a reply's seed is this plus its number).
        gpu_memory_utilization: vllm's share of device memory (of RAM on the CPU build).
        max_model_len: the longest prompt plus reply.
        tool_parser: vllm's tool-call parser for the checkpoint's format.
    """

    name = "vllm"
    capabilities = LLM_CAPABILITIES

    def __init__(
        self,
        path: str,
        *,
        seed: int = 0,
        gpu_memory_utilization: float = 0.2,
        max_model_len: int = 2048,
        tool_parser: str = "hermes",
    ) -> None:
        self.path = path
        self._seed = seed
        self._memory = gpu_memory_utilization
        self._max_len = max_model_len
        self._parser_name = tool_parser
        self._count = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._llm: Any = None
        self._tokenizer: Any = None

    def load(self) -> None:
        """Start the engine thread and load the model (blocking: seconds)."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="vllm-loop", daemon=True)
        thread.start()
        self._loop = loop
        future = asyncio.run_coroutine_threadsafe(self._make(), loop)
        self._llm, self._tokenizer = future.result()

    async def _make(self) -> tuple[Any, Any]:
        from transformers import AutoTokenizer
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=self.path,
            gpu_memory_utilization=self._memory,
            max_model_len=self._max_len,
            seed=self._seed,
            enforce_eager=True,
        )
        return AsyncLLM.from_engine_args(args), AutoTokenizer.from_pretrained(self.path)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the engine until cancelled, then shut it down."""
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            if self._llm is not None and self._loop is not None:
                self._llm.shutdown()
                self._loop.call_soon_threadsafe(self._loop.stop)

    def prompt(self, request: ReplyRequest) -> str:
        """The conversation as the checkpoint's chat template renders it."""
        messages: list[dict[str, Any]] = []
        if request.instructions:
            messages.append({"role": "system", "content": request.instructions})
        messages.extend(_chat(m) for m in request.messages)
        tools = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": json.loads(t.parameters_json),
                },
            }
            for t in request.tools
        ]
        text: str = self._tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=False
        )
        return text

    async def stream(self, request: ReplyRequest) -> AsyncIterator[ReplyDelta]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        assert self._loop is not None and self._llm is not None, "load() first"
        number = next(self._count)
        params = SamplingParams(
            temperature=request.temperature,
            max_tokens=request.max_tokens,
            seed=self._seed + number if request.seed is None else request.seed,
            output_kind=RequestOutputKind.DELTA,
            skip_special_tokens=not request.tools,
        )
        prompt = self.prompt(request)
        send, recv = trio.open_memory_channel[_Piece | BaseException](math.inf)
        token = trio.lowlevel.current_trio_token()
        llm = self._llm

        async def produce() -> None:
            try:
                async for output in llm.generate(prompt, params, f"reply-{number}"):
                    piece = output.outputs[0]
                    item = (piece.text, list(piece.token_ids), piece.finish_reason)
                    token.run_sync_soon(send.send_nowait, item)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # the engine failed: the reply fails with it
                token.run_sync_soon(send.send_nowait, exc)
            finally:
                token.run_sync_soon(send.close)

        future = asyncio.run_coroutine_threadsafe(produce(), self._loop)
        calls = _ToolCalls(self._tool_parser(request), number) if request.tools else None
        finish = "stop"
        try:
            async with recv:
                async for item in recv:
                    if isinstance(item, BaseException):
                        raise item
                    piece, ids, reason = item
                    finish = reason or finish
                    if calls is None:
                        if piece:
                            yield ReplyDelta(piece)
                        continue
                    for delta in calls.feed(piece, ids):
                        yield delta
        finally:
            future.cancel()  # cancels the asyncio task: vllm aborts the request
        if calls is not None:
            for delta in calls.end():
                yield delta
            if calls.called:
                yield ReplyDelta(finish="tool_calls")
                return
        yield ReplyDelta(finish="length" if finish == "length" else "stop")

    def _tool_parser(self, request: ReplyRequest) -> tuple[Any, Any]:
        """A fresh streaming tool parser for one reply, and the chat request it reads."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        tools = [
            {"type": "function", "function": {"name": t.name, "description": t.description,
             "parameters": json.loads(t.parameters_json)}}
            for t in request.tools
        ]  # fmt: skip
        chat = ChatCompletionRequest(messages=[], model=self.path, tools=tools)
        parser = ToolParserManager.get_tool_parser(self._parser_name)(self._tokenizer, chat.tools)
        return parser, chat


_Piece = tuple[str, list[int], str | None]
"""What vllm made since the last output: text, token ids, finish reason (or ``None``)."""


class _ToolCalls:
    """One reply read through a streaming tool parser: its text before any call, and each
    call as it grows (the parser re-reads the whole text at each step and says what is new).

    A call opens when the parser knows its name; each growth of its arguments is one delta;
    it is done at its end tag (``END_TAG`` counted in the text) or at the end of the reply.
    The deltas of a call, joined, are its arguments as the model wrote them.
    """

    END_TAG = "</tool_call>"

    def __init__(self, parser: tuple[Any, Any], number: int) -> None:
        self._parser, self._chat = parser
        self._number = number
        self._text = ""
        self._ids: list[int] = []
        self._sent = 0  # characters of text sent as text
        self._names: dict[int, str] = {}
        self._done: set[int] = set()

    @property
    def called(self) -> bool:
        return bool(self._names)

    def _call_id(self, index: int) -> str:
        return f"call_{self._number}_{index}"

    def feed(self, piece: str, ids: list[int]) -> list[ReplyDelta]:
        """The deltas the newest ``piece`` (and its token ``ids``) brings."""
        previous, previous_ids = self._text, self._ids
        self._text, self._ids = previous + piece, previous_ids + ids
        message = self._parser.extract_tool_calls_streaming(
            previous, self._text, piece, previous_ids, self._ids, ids, self._chat
        )
        out: list[ReplyDelta] = []
        if message is not None:
            if message.content and not self._names:
                self._sent += len(message.content)
                out.append(ReplyDelta(message.content))
            for call in message.tool_calls or ():
                index, function = call.index, call.function
                if function is None or index in self._done:
                    continue
                if function.name and index not in self._names:
                    self._names[index] = function.name
                    out.append(self._piece(index, ""))
                if function.arguments and index in self._names:
                    out.append(self._piece(index, function.arguments))
        for index in sorted(self._names):
            if index not in self._done and index < self._text.count(self.END_TAG):
                out.append(self._close(index))
        return out

    def end(self) -> list[ReplyDelta]:
        """The reply is over: text the parser held back (a possible start of a tag that
        never came), and every call still open, closed."""
        out = []
        if not self._names and TOOL_TAG not in self._text and len(self._text) > self._sent:
            out.append(ReplyDelta(self._text[self._sent :]))
            self._sent = len(self._text)
        out.extend(self._close(index) for index in sorted(self._names) if index not in self._done)
        return out

    def _piece(self, index: int, arguments: str) -> ReplyDelta:
        return ReplyDelta(arguments, self._call_id(index), self._names[index], call_done=False)

    def _close(self, index: int) -> ReplyDelta:
        self._done.add(index)
        return ReplyDelta("", self._call_id(index), self._names[index], call_done=True)


def _chat(message: ChatMessage) -> dict[str, Any]:
    if message.kind == "function_call":
        call = {"name": message.name, "arguments": json.loads(message.text or "{}")}
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": message.call_id, "type": "function", "function": call}],
        }
    if message.kind == "function_call_output":
        return {"role": "tool", "tool_call_id": message.call_id, "content": message.text}
    return {"role": message.role if message.role != "tool" else "user", "content": message.text}
