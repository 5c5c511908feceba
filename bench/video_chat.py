"""A live video chat query's first text token with its frames prefilled as they came
(warm prefix) against the same query over frames the engine has not seen (cold), in one
run, as `WS /v1/video/chat/stream` asks the engine for them.

    .venv-vllm/bin/python bench/video_chat.py [--frames 50] [--rounds 5] [--llm DIR]

The engine is the agent's `VllmReplier` (what ``duplex serve --llm`` builds), in this
process, on a tiny random Idefics3 built here (``tests/services/tiny_vl.py``) unless
``--llm`` names a vision-language checkpoint. Each round draws fresh frames (random
colours, so no round reuses another's cache): cold, the query's prompt (system prompt,
the frames, the question) goes in whole; warm, the frames' prefix was prefilled first
(the route's `Prefill`: the same conversation without the question, one token), then
the query. Latency: from submitting the query to its first text.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _frames(rng: random.Random, count: int) -> tuple[Any, ...]:
    from PIL import Image

    from duplex.services.videochat import Frame

    frames = []
    for i in range(count):
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        out = io.BytesIO()
        Image.new("RGB", (64, 48), colour).save(out, "PNG")
        frames.append(Frame(out.getvalue(), str(i), i * 80.0))
    return tuple(frames)


async def _first_token(replier: Any, request: Any) -> float:
    from duplex.models.agent import ReplyDelta

    start = trio.current_time()
    first = None
    async for item in replier.chat(request, 0):
        if first is None and isinstance(item, ReplyDelta) and item.text:
            first = trio.current_time() - start
    return first if first is not None else trio.current_time() - start


async def _main(args: argparse.Namespace) -> None:
    from duplex.models.agent._vllm import VllmReplier
    from duplex.services.videochat import VideoChatConfig
    from duplex.services.videochat._serving import _request

    folder = args.llm
    if not folder:
        from tests.services.tiny_vl import build

        folder = str(build(Path(tempfile.mkdtemp(prefix="video-chat-bench-")) / "vl"))
    replier = VllmReplier(folder, seed=0)
    await trio.to_thread.run_sync(replier.load)
    rng = random.Random(args.seed)
    config = VideoChatConfig(system_prompt="Describe what the camera sees.")
    cold, warm = [], []
    async with trio.open_nursery() as nursery:
        await nursery.start(replier.run)
        await _first_token(replier, _request(config, _frames(rng, args.frames), "warm-up?"))
        for _ in range(args.rounds):
            frames = _frames(rng, args.frames)
            cold.append(await _first_token(replier, _request(config, frames, "what is it?")))
            frames = _frames(rng, args.frames)
            async for _item in replier.chat(_request(config, frames, None), 0):
                pass  # the prefill: the frames' prefix in the cache
            warm.append(await _first_token(replier, _request(config, frames, "what is it?")))
        nursery.cancel_scope.cancel()
    cold_ms = statistics.median(cold) * 1000.0
    warm_ms = statistics.median(warm) * 1000.0
    print(
        json.dumps(
            {
                "frames": args.frames,
                "rounds": args.rounds,
                "cold_first_token_ms": [round(x * 1000.0, 1) for x in cold],
                "warm_first_token_ms": [round(x * 1000.0, 1) for x in warm],
                "cold_median_ms": round(cold_ms, 1),
                "warm_median_ms": round(warm_ms, 1),
                "warm_over_cold": round(warm_ms / cold_ms, 3),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--llm", default="")
    parser.add_argument("--seed", type=int, default=0)
    trio.run(_main, parser.parse_args())
