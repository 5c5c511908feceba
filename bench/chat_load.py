"""Live agent replies beside chat completions on one vllm engine: the replies' first-token
latency alone, with chat load beside them (chat at its own priority, behind the replies),
and with the same chat load at the replies' priority (what the priority buys).

    .venv-vllm/bin/python bench/chat_load.py [--replies 40] [--chat 8] [--chat-tokens 256]
        [--llm DIR] [--seed 0]

The engine is the agent's `VllmReplier` (the same object ``duplex serve --llm`` builds),
in this process, on a tiny random Llama built here (``tests/agent/tiny_llm.py``) unless
``--llm`` names a checkpoint. Replies are made one after another, each a short
conversation with a 16-token limit, like the agent's clause replies; each one's latency
is from its submission to its first text. The chat load is ``--chat`` streams at once,
each generating ``--chat-tokens`` tokens with ``ignore_eos``, restarted as each ends, for
the whole phase (``chat_deltas_per_s``: text pieces the chat streams got, about one
token each).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)) * 1000.0, 1)


async def _phase(replier: Any, args: argparse.Namespace, chat_priority: int | None) -> dict:
    from duplex.models.agent import (
        CHAT_PRIORITY,
        ChatMessage,
        ChatPart,
        ChatRequest,
        ChatTurn,
        ReplyDelta,
        ReplyRequest,
        Sampling,
    )

    latencies: list[float] = []
    chat_deltas = 0
    chat = ChatRequest(
        (ChatTurn("user", (ChatPart("text", "tell me the weather for tomorrow"),)),),
        Sampling(max_tokens=args.chat_tokens, ignore_eos=True, temperature=1.0),
    )

    async def chat_stream(stop: trio.Event) -> None:
        nonlocal chat_deltas
        priority = CHAT_PRIORITY if chat_priority is None else chat_priority
        while not stop.is_set():
            async for item in replier.chat(chat, 0, priority=priority):
                chat_deltas += isinstance(item, ReplyDelta) and bool(item.text)

    async with trio.open_nursery() as nursery:
        stop = trio.Event()
        if args.chat:
            for _ in range(args.chat):
                nursery.start_soon(chat_stream, stop)
            await trio.sleep(1.0)  # the load is running before the first reply
        started = trio.current_time()
        for i in range(args.replies):
            request = ReplyRequest(
                (ChatMessage("user", f"hello could you tell me the weather {i}"),),
                max_tokens=16,
                seed=i,
            )
            t0 = trio.current_time()
            first = None
            async for delta in replier.stream(request):
                if first is None and delta.text:
                    first = trio.current_time() - t0
            latencies.append(first if first is not None else trio.current_time() - t0)
        took = trio.current_time() - started
        stop.set()
        nursery.cancel_scope.cancel()
    return {
        "first_token_p50_ms": _pct(latencies, 50),
        "first_token_p95_ms": _pct(latencies, 95),
        "first_token_max_ms": round(max(latencies) * 1000.0, 1),
        "chat_deltas_per_s": round(chat_deltas / took, 1) if args.chat else 0.0,
    }


async def _main(args: argparse.Namespace) -> None:
    from duplex.models.agent._vllm import VllmReplier

    folder = args.llm
    if not folder:
        from tests.agent.tiny_llm import build

        folder = str(build(Path(tempfile.mkdtemp(prefix="chat-bench-")) / "tiny", seed=args.seed))
    replier = VllmReplier(folder, seed=args.seed)
    await trio.to_thread.run_sync(replier.load)
    async with trio.open_nursery() as nursery:
        await nursery.start(replier.run)
        results = {}
        warm = argparse.Namespace(**{**vars(args), "replies": 5, "chat": 0})
        await _phase(replier, warm, None)  # warm-up, not reported
        results["alone"] = await _phase(
            replier, argparse.Namespace(**{**vars(args), "chat": 0}), None
        )
        results["beside_chat"] = await _phase(replier, args, None)
        results["beside_chat_same_priority"] = await _phase(replier, args, 0)
        print(
            json.dumps(
                {
                    "replies": args.replies,
                    "chat_streams": args.chat,
                    "chat_tokens": args.chat_tokens,
                    **results,
                },
                indent=2,
            )
        )
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replies", type=int, default=40)
    parser.add_argument("--chat", type=int, default=8)
    parser.add_argument("--chat-tokens", type=int, default=256)
    parser.add_argument("--llm", default="")
    parser.add_argument("--seed", type=int, default=0)
    trio.run(_main, parser.parse_args())
