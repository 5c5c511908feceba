"""Realtime ticks with and without batch work in their slack, in one process, one run.

    python bench/slack.py --model loopback --sessions 64 --runner matmul --seconds 10
    python bench/slack.py --model moshi-7b --random-weights --kv-cache-dtype fp8 \
        --device cuda --sessions 64 --runner unet --seconds 20

Three phases, each ``--seconds`` long, in this order:

``realtime``  ``--sessions`` slots on the model's engine (the server's `EngineDriver`, with
              the process's `Slack`), each fed one input frame per period, as live sessions
              are; per output: delay = delivered - the tick's scheduled time.
``batch``     the request engine alone (no slot live: the slack is open), ``--clients``
              clients submitting back to back; units and requests per second.
``both``      the two together.

Reported: output delay p50/p99/max, late ticks and step p99 for ``realtime`` and ``both``,
with the ratio of the p99s (the goal: at most 1.1), and batch throughput for ``batch`` and
``both`` with their ratio (the goal: at least 0.8 of alone). ``--rounds R`` runs the
three phases R times in turn (the sessions attached after each ``batch`` phase, detached
after each ``both``); the p99s then pool every round's delays and each throughput is the
rounds' mean (espeak-ng's rate alone varied 13.6-16.5 requests/s between single phases).

Runners (one request = ``--units`` units, `gate.next_unit()` between them):

``matmul``  a chain of ``--dim`` square matmuls per unit (CPU or GPU), for the CPU check.
``tts``     one sentence of espeak-ng speech (the default TTS of ``/v1/audio/speech``).
``unet``    one denoising step of a Stable-Diffusion-1.5-sized UNet (diffusers
            ``UNet2DConditionModel`` at its published config, seeded random weights, fp16 on
            CUDA) on a 512x512 latent with classifier-free guidance (batch 2 per image), per
            unit: the real work of an image pipeline's step.
``image``   the server's own image runner (``duplex.models.diffusion.ImageRunner``) over the
            pipeline ``--image-model`` names (``tiny`` or a folder): one image of ``--size``
            with ``--units`` steps per request, the engine holding the first unit and the
            runner asking for each next one from the pipeline's ``callback_on_step_end``.

Writes ``<out>.json`` (every figure and the exact command).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from duplex.models import (  # noqa: E402
    Engine,
    EngineDriver,
    ModelOptions,
    RequestEngine,
    Slack,
    SlotOutput,
    UnitGate,
    get_model,
)
from duplex.topology._requests import BATCH_SWITCH_INTERVAL_S  # noqa: E402

SD15_UNET = {
    "sample_size": 64,
    "in_channels": 4,
    "out_channels": 4,
    "layers_per_block": 2,
    "block_out_channels": (320, 640, 1280, 1280),
    "down_block_types": (
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "DownBlock2D",
    ),
    "up_block_types": (
        "UpBlock2D",
        "CrossAttnUpBlock2D",
        "CrossAttnUpBlock2D",
        "CrossAttnUpBlock2D",
    ),
    "cross_attention_dim": 768,
    "attention_head_dim": 8,
}
"""Stable Diffusion 1.5's UNet (860 M parameters), as its published config.json has it."""


class MatmulRunner:
    name = "matmul"
    max_batch = 1

    def __init__(self, device: str, dim: int, units: int) -> None:
        import torch

        self.torch = torch
        self.units = units
        generator = torch.Generator(device="cpu").manual_seed(0)
        self.weight = (torch.randn(dim, dim, generator=generator) / dim**0.5).to(device)
        self.device = device

    def run_batch(self, requests: Sequence[int], gate: UnitGate) -> list[int]:
        x = self.weight
        for unit in range(self.units):
            if unit:
                gate.next_unit()
            for _ in range(4):
                x = self.weight @ x
            if self.device != "cpu":
                self.torch.cuda.synchronize()
        return list(requests)


class UnetRunner:
    name = "unet"
    max_batch = 1

    def __init__(self, device: str, units: int) -> None:
        import torch
        from diffusers import UNet2DConditionModel

        torch.manual_seed(0)
        dtype = torch.float16 if device != "cpu" else torch.float32
        self.torch = torch
        self.unet = UNet2DConditionModel(**SD15_UNET).to(device=device, dtype=dtype).eval()
        self.units = units
        self.device = device
        self.latents = torch.randn(2, 4, 64, 64, device=device, dtype=dtype)
        self.text = torch.randn(2, 77, 768, device=device, dtype=dtype)

    def run_batch(self, requests: Sequence[int], gate: UnitGate) -> list[int]:
        torch = self.torch
        latents = self.latents
        with torch.inference_mode():
            for unit in range(self.units):
                if unit:
                    gate.next_unit()
                noise = self.unet(latents, 999 - unit, encoder_hidden_states=self.text).sample
                latents = latents - 0.01 * noise
                if self.device != "cpu":
                    torch.cuda.synchronize()
        return list(requests)


class ImageRequests:
    """The bench's clients submit numbers; each becomes one image request (seed = the number)."""

    name = "image"
    max_batch = 1

    def __init__(self, device: str, model: str, size: str, units: int) -> None:
        from duplex.models.diffusion import load_image_runner, resolve_diffusion

        self.runner = load_image_runner(resolve_diffusion(model, "image", ModelOptions()), device)
        self.width, self.height = (int(side) for side in size.split("x"))
        self.units = units

    def run_batch(self, requests: Sequence[int], gate: UnitGate) -> list[int]:
        from duplex.models.diffusion import ImageRequest

        asked = [
            ImageRequest(
                prompt="a red cat",
                width=self.width,
                height=self.height,
                seed=k,
                steps=self.units,
            )
            for k in requests
        ]
        self.runner.run_batch(asked, gate)
        return list(requests)


class TtsRunner:
    """espeak-ng, the server's default TTS (``duplex.models.tts``): one request is a text of
    ``--units`` sentences (units: `EspeakRunner`'s, a sentence or about 2 ms of synthesis)."""

    name = "tts"
    max_batch = 1

    def __init__(self, units: int) -> None:
        from duplex.models.tts import EspeakRunner, SpeechRequest

        self.runner = EspeakRunner()
        self.elastic_unit_s = self.runner.elastic_unit_s  # its units end at a window's close
        sentence = "The quick brown fox jumps over the lazy dog near the river bank."
        self.request = SpeechRequest(" ".join([sentence] * units))

    def run_batch(self, requests: Sequence[int], gate: UnitGate) -> list[int]:
        self.runner.run_batch([self.request] * len(requests), gate)
        return list(requests)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def phase(
    driver: EngineDriver | None,
    handles: list[Any],
    receivers: list[trio.MemoryReceiveChannel[SlotOutput]],
    engine: RequestEngine[int, int] | None,
    *,
    seconds: float,
    period: float,
    frame: int,
    clients: int,
) -> dict[str, Any]:
    delays: list[float] = []
    done = {"requests": 0}
    silence = np.zeros(frame, np.float32)
    before = driver.statistics() if driver is not None else None

    async def feed() -> None:
        assert driver is not None
        next_at = trio.current_time()
        while True:
            for handle in handles:
                driver.push_input(handle, silence)
            next_at += period
            await trio.sleep_until(next_at)

    async def drain(channel: trio.MemoryReceiveChannel[SlotOutput]) -> None:
        async for output in channel:
            delays.append(trio.current_time() - output.at)

    async def client(k: int) -> None:
        assert engine is not None
        while True:
            await engine.submit(k)
            done["requests"] += 1

    async with trio.open_nursery() as nursery:
        if driver is not None:
            nursery.start_soon(feed)
            for channel in receivers:
                nursery.start_soon(drain, channel)
        if engine is not None:
            for k in range(clients):
                nursery.start_soon(client, k)
        await trio.sleep(1.0)  # warm-up: the estimate and the queues settle
        delays.clear()
        done["requests"] = 0
        start = trio.current_time()
        before = driver.statistics() if driver is not None else None
        await trio.sleep(seconds)
        elapsed = trio.current_time() - start
        result: dict[str, Any] = {"seconds": round(elapsed, 2)}
        if driver is not None and before is not None:
            after = driver.statistics()
            result.update(
                _delays=list(delays),
                outputs=len(delays),
                delay_p50_ms=round(percentile(delays, 50) * 1000, 2),
                delay_p99_ms=round(percentile(delays, 99) * 1000, 2),
                delay_max_ms=round(max(delays, default=float("nan")) * 1000, 2),
                late_ticks=after.late_ticks - before.late_ticks,
                ticks=after.ticks - before.ticks,
                step_p99_ms=round((after.engine.scheduler.p99_step_s or 0) * 1000, 2),
            )
        if engine is not None:
            result.update(
                requests=done["requests"],
                requests_per_s=round(done["requests"] / elapsed, 3),
            )
        nursery.cancel_scope.cancel()
    return result


async def main(args: argparse.Namespace) -> dict[str, Any]:
    options = ModelOptions(
        device=args.device, random_weights=args.random_weights, kv_cache_dtype=args.kv_cache_dtype
    )
    if args.device == "cpu":  # as the server does when request runners share the CPU
        import torch

        torch.set_num_threads(1)  # two threads on a loaded 2-core host: 10-30x slower steps
    spec, factory = get_model(args.model, options)
    slack = Slack()
    engine = Engine(await trio.to_thread.run_sync(factory, spec), max_input_frames=8)
    driver = EngineDriver(engine, slack=slack)
    if args.runner == "unet":
        runner: Any = await trio.to_thread.run_sync(UnetRunner, args.device, args.units)
    elif args.runner == "image":
        runner = await trio.to_thread.run_sync(
            ImageRequests, args.device, args.image_model, args.size, args.units
        )
    elif args.runner == "tts":
        runner = TtsRunner(args.units)
    else:
        runner = MatmulRunner(args.device, args.dim, args.units)
    if args.beside:  # as batch_beside_realtime makes a GPU pipeline: any window, run on into a step
        runner.beside_realtime = True
    requests = RequestEngine(runner, max_wait_s=0.0, slack=slack)
    # as the server's processes that host request runners do (`start_request_engines`)
    sys.setswitchinterval(min(sys.getswitchinterval(), BATCH_SWITCH_INTERVAL_S))
    period = spec.frame_period_s
    out: dict[str, Any] = {
        "command": "python3 bench/slack.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPU cores, {_gpu() or 'no GPU'}",
        "model": spec.name,
        "sessions": args.sessions,
        "runner": args.runner,
        "units_per_request": args.units,
        "commit": _commit(),
    }
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await nursery.start(requests.run)
        common = {"seconds": args.seconds, "period": period, "frame": spec.frame_samples}
        rounds = []
        for _ in range(args.rounds):
            batch = await phase(None, [], [], requests, clients=args.clients, **common)
            print("batch", batch, flush=True)
            handles, receivers = [], []
            for i in range(args.sessions):
                send, receive = trio.open_memory_channel[SlotOutput](64)
                handle = driver.attach(f"s{i}", send)
                if handle is None:
                    raise SystemExit(f"admission refused session {i}: {driver.capacity()}")
                handles.append(handle)
                receivers.append(receive)
            realtime = await phase(driver, handles, receivers, None, clients=0, **common)
            print("realtime", {k: v for k, v in realtime.items() if k != "_delays"}, flush=True)
            both = await phase(driver, handles, receivers, requests, clients=args.clients, **common)
            print("both", {k: v for k, v in both.items() if k != "_delays"}, flush=True)
            for handle in handles:  # the next round's batch phase runs with no session live
                driver.detach(handle)
            rounds.append((batch, realtime, both))
        nursery.cancel_scope.cancel()
    stats = slack.statistics()
    out["slack"] = {"units": stats.units, "deferred": stats.deferred, "overran": stats.overran}
    alone = [d for _, realtime, _ in rounds for d in realtime.pop("_delays")]
    beside = [d for _, _, both in rounds for d in both.pop("_delays")]
    out["batch"], out["realtime"], out["both"] = rounds[0]
    out["rounds"] = [{"batch": a, "realtime": r, "both": b} for a, r, b in rounds[1:]]
    alone_rate = sum(batch["requests_per_s"] for batch, _, _ in rounds) / len(rounds)
    batch_rate = sum(both["requests_per_s"] for _, _, both in rounds) / len(rounds)
    # pooled over the rounds: one round's p99 rests on a few ticks
    out["delay_p99_ms_pooled"] = round(percentile(alone, 99) * 1000, 2)
    out["both_delay_p99_ms_pooled"] = round(percentile(beside, 99) * 1000, 2)
    out["delay_p99_ratio"] = round(out["both_delay_p99_ms_pooled"] / out["delay_p99_ms_pooled"], 3)
    out["batch_throughput_ratio"] = round(batch_rate / alone_rate, 3)
    return out


def _gpu() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        return None


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    except OSError:
        return "unknown"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="loopback")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runner", choices=["matmul", "unet", "image", "tts"], default="matmul")
    parser.add_argument("--image-model", default="tiny", help="the image runner's pipeline")
    parser.add_argument("--size", default="64x64", help="the image runner's WIDTHxHEIGHT")
    parser.add_argument("--units", type=int, default=10, help="units per request")
    parser.add_argument("--dim", type=int, default=512, help="matmul size")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, default=1, help="batch / realtime / both rounds, in turn"
    )
    parser.add_argument("--out", default="")
    parser.add_argument(
        "--beside",
        action="store_true",
        help="the runner's units may start in any window and run on into a step",
    )
    arguments = parser.parse_args()
    started = time.time()
    result = trio.run(main, arguments)
    result["wall_s"] = round(time.time() - started, 1)
    text = json.dumps(result, indent=2)
    print(text)
    if arguments.out:
        Path(arguments.out + ".json").write_text(text + "\n")
