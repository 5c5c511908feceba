"""PersonaPlex time to ready: prompts replayed in the slack against NVIDIA's loop, alone and
beside live sessions, one engine in this process (no sockets).

    .venv/bin/python bench/prompt_replay.py                       # tiny-personaplex, CPU
    .venv/bin/python bench/prompt_replay.py --model personaplex-7b --device cuda \\
        --live 64 --join 16 --out bench/results/prompt-replay-7b.json

The model has seeded random weights (``tiny-personaplex``: a tiny checkpoint written to a
temporary folder; ``personaplex-7b``: `random_moshi` on the device, bf16, CUDA graphs
captured first). The voice is a WAV of ``--voice-seconds`` of seeded noisy tones put in
the model's ``voices/`` folder (random 7B weights have no folder: the bench gives the
runner one that holds only the voice), the persona ``--text``. One runner serves every
phase, so every phase has the same weights. The runner builds a prompt's replay once (the
voice Mimi-encoded, the text tokenized) and keeps it: that first build is timed apart
(``prepare_s``, a probe step before the phases), and every timed replay reuses it.

``alone``
    One session. ``reference``: NVIDIA's pattern (``LMGen.step_system_prompts``): the
    same prompt stepped back to back on one slot, `Engine.step` in a loop until its
    output says the next step takes input; timed from `Engine.acquire_slot`.
    ``slack``: an `EngineDriver` ticking on the real clock (steps on a worker thread, as
    the server runs them), the replay in the slack; timed from `EngineDriver.attach` to
    the subscriber's receipt of the first output after the replay (what turns into
    ``session.ready``). ``per_tick``: the same driver with ``replay_in_slack=False``:
    one frame per 80 ms tick, as before. ``--repeats`` pairs of reference and slack,
    interleaved (their per-repeat ratio is reported), then ``--per-tick-repeats``.
``load``
    ``--live`` unprompted sessions stream noise in real time (one frame pushed per
    period) from the start; after ``--settle`` seconds ``--join`` sessions attach at once
    with the prompt; the run ends ``--tail`` seconds after the last is ready. Three runs:
    ``no_joins`` (as long as the slack run), ``slack``, ``per_tick``. For the live
    sessions, over the window from the joins to the end (the same span of ``no_joins``):
    delay of each output (its receipt against its tick's scheduled time) p50/p99/max,
    ``missed`` (outputs received after the next tick was due), the driver's late ticks,
    and the live slots' underruns; for the joiners, time to ready p50/p99.

Prints a table and writes ``--out`` (JSON) if asked. On a shared CPU the figures move
with the other load: compare rows of one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import trio

from duplex.models import (
    Engine,
    EngineDriver,
    EngineRecorder,
    SlotOutput,
    SlotPrompt,
)
from duplex.models.moshi._checkpoint import (
    LoadedMoshi,
    MoshiCheckpoint,
    build_tiny_checkpoint,
    load_checkpoint,
    mimi_for,
    random_moshi,
)
from duplex.models.moshi._config import moshi_preset
from duplex.models.moshi._engine_runner import MoshiEngineRunner
from duplex.models.moshi._models import moshi_spec

PERSONA = (
    "You work for a small bakery and take orders over the phone. "
    "Be warm and brief, and confirm each order before you say goodbye."
)
VOICE = "bench-voice"
PERIOD = 0.08


def write_voice(path: Path, seconds: float, seed: int = 5) -> None:
    """A 24 kHz mono PCM16 WAV of varied tones and noise (its frames' codes vary)."""
    rate = 24_000
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    sound = 0.3 * np.sin(2 * np.pi * (180 + 60 * np.sin(2 * np.pi * 0.7 * t)) * t)
    sound = sound * np.abs(np.sin(2 * np.pi * 1.3 * t)) + 0.05 * rng.standard_normal(t.size)
    pcm = (np.clip(sound, -1, 1) * 32767).astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())


def load_model(args: argparse.Namespace, folder: Path) -> LoadedMoshi:
    write_voice(folder / "voices" / f"{VOICE}.wav", args.voice_seconds)
    if args.model == "tiny-personaplex":
        checkpoint = build_tiny_checkpoint(folder, seed=args.seed, preset=args.model)
        return load_checkpoint(checkpoint, device=args.device)
    cuda = args.device.startswith("cuda")
    loaded = random_moshi(
        args.model,
        args.seed,
        device=args.device,
        lm_dtype=torch.bfloat16 if cuda else torch.float32,
    )
    folder_only = MoshiCheckpoint(folder, moshi_preset(args.model), mimi_for(args.model))
    return dataclasses.replace(loaded, checkpoint=folder_only)  # its voices/ folder only


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def noise(rng: np.random.Generator) -> np.ndarray:
    return (0.05 * rng.standard_normal(1920)).astype(np.float32)


# -- alone ---------------------------------------------------------------------------------


def reference_once(runner: MoshiEngineRunner, prompt: SlotPrompt, device: str) -> float:
    """NVIDIA's loop: the prompt stepped back to back on one slot; seconds to ready."""
    engine = Engine(runner)
    sync(device)
    start = time.perf_counter()
    handle = engine.acquire_slot("reference", prompt)
    assert handle is not None
    while engine.step(0.0)[handle].frame.holds_input:
        pass
    sync(device)
    took = time.perf_counter() - start
    engine.release_slot(handle)
    engine.step(0.0)  # the release reaches the runner
    return took


async def driver_once(runner: MoshiEngineRunner, prompt: SlotPrompt, *, in_slack: bool) -> float:
    """One session on a ticking driver: seconds from attach to its first ready output."""
    driver = EngineDriver(Engine(runner), replay_in_slack=in_slack)
    send, recv = trio.open_memory_channel[SlotOutput](4096)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await trio.sleep(PERIOD / 2)  # between two ticks, as a session.create arrives
        start = trio.current_time()
        handle = driver.attach("alone", send, prompt=prompt)
        assert handle is not None
        async for out in recv:
            if not out.frame.holds_input:
                break
        took = trio.current_time() - start
        driver.detach(handle)
        await trio.sleep(2 * PERIOD)  # the release reaches the runner
        nursery.cancel_scope.cancel()
    return took


def summary(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {
        "p50": statistics.median(ordered),
        "p99": p99,
        "max": ordered[-1],
        "mean": statistics.fmean(ordered),
        "n": len(ordered),
    }


async def alone(args: argparse.Namespace, runner: MoshiEngineRunner) -> dict[str, Any]:
    """Each repeat runs the reference, then the slack replay (interleaved, so load on a shared
    machine falls on both alike); the one-frame-per-tick replay after them."""
    prompt = SlotPrompt(text=args.text, voice=VOICE)
    times: dict[str, list[float]] = {"reference": [], "slack": [], "per_tick": []}
    for _ in range(args.repeats):
        times["reference"].append(reference_once(runner, prompt, args.device))
        times["slack"].append(await driver_once(runner, prompt, in_slack=True))
    for _ in range(args.per_tick_repeats):
        times["per_tick"].append(await driver_once(runner, prompt, in_slack=False))
    result: dict[str, Any] = {name: summary(values) for name, values in times.items() if values}
    for name, row in result.items():
        print(f"alone {name:>9}: p50 {row['p50']:.3f} s, max {row['max']:.3f} s (n={row['n']})")
    ratios = [s / r for s, r in zip(times["slack"], times["reference"], strict=True)]
    result["slack_over_reference"] = summary(ratios)
    print(f"alone slack / reference, per repeat: p50 {statistics.median(ratios):.2f}")
    return result


# -- under load ----------------------------------------------------------------------------


async def load_run(
    args: argparse.Namespace, runner: MoshiEngineRunner, mode: str, duration: float | None
) -> tuple[dict[str, Any], float]:
    """One run of ``mode`` (``no_joins``, ``slack``, ``per_tick``); returns its figures and
    the span from the joins to the end."""
    recorder = EngineRecorder(runner.spec.name, runner.spec.max_slots)
    driver = EngineDriver(Engine(runner), recorder=recorder, replay_in_slack=mode == "slack")
    prompt = SlotPrompt(text=args.text, voice=VOICE)
    rng = np.random.default_rng(args.seed)
    received: dict[str, list[tuple[float, SlotOutput]]] = {}
    live_handles = []
    join_ready: dict[str, float] = {}
    joined_at = 0.0

    async def collect(name: str, recv: trio.MemoryReceiveChannel[SlotOutput]) -> None:
        async for out in recv:
            now = trio.current_time()
            received[name].append((now, out))
            if name.startswith("join") and name not in join_ready and not out.frame.holds_input:
                join_ready[name] = now - joined_at

    async def feed() -> None:
        start = trio.current_time()
        k = 0
        while True:
            for handle in live_handles:
                driver.push_input(handle, noise(rng))
            k += 1
            await trio.sleep_until(start + k * PERIOD)

    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        sends = {}
        names = [f"live{i}" for i in range(args.live)]
        if mode != "no_joins":
            names += [f"join{i}" for i in range(args.join)]
        for name in names:
            send, recv = trio.open_memory_channel[SlotOutput](4096)
            sends[name] = send
            received[name] = []
            nursery.start_soon(collect, name, recv)
        for name in names[: args.live]:
            handle = driver.attach(name, sends[name])
            assert handle is not None, "admission refused a live session"
            live_handles.append(handle)
        nursery.start_soon(feed)
        await trio.sleep(args.settle)
        joined_at = trio.current_time()
        if mode == "no_joins":
            assert duration is not None
            await trio.sleep(duration)
        else:
            for name in names[args.live :]:
                assert driver.attach(name, sends[name], prompt=prompt) is not None
            while len(join_ready) < args.join:
                await trio.sleep(PERIOD)
            await trio.sleep(args.tail)
        span = trio.current_time() - joined_at
        stats = driver.statistics()
        nursery.cancel_scope.cancel()
    delays = [
        at - out.at
        for name in names[: args.live]
        for at, out in received[name]
        if out.at >= joined_at
    ]
    underruns = sum(stats.engine.slot_underruns.get(h.slot, 0) for h in live_handles)
    figures: dict[str, Any] = {
        "span_s": span,
        "live_delay_ms": {k: v * 1000 if k != "n" else v for k, v in summary(delays).items()},
        "live_missed": sum(d > PERIOD for d in delays),
        "late_ticks": stats.late_ticks,
        "live_underruns": underruns,
        "replay_steps": stats.engine.replay_steps,
        "step_p99_ms": (stats.engine.scheduler.p99_step_s or 0.0) * 1000,
    }
    if join_ready:
        figures["ready_s"] = summary(list(join_ready.values()))
        figures["ready_histogram_count"] = recorder.ready.count
    return figures, span


async def under_load(args: argparse.Namespace, runner: MoshiEngineRunner) -> dict[str, Any]:
    result: dict[str, Any] = {}
    slack, span = await load_run(args, runner, "slack", None)
    result["slack"] = slack
    result["no_joins"], _ = await load_run(args, runner, "no_joins", span)
    result["per_tick"], _ = await load_run(args, runner, "per_tick", None)
    for mode in ("no_joins", "slack", "per_tick"):
        row = result[mode]
        delay = row["live_delay_ms"]
        ready = row.get("ready_s")
        said = "" if ready is None else f", ready p50 {ready['p50']:.2f} s p99 {ready['p99']:.2f} s"
        print(
            f"load {mode:>8}: live delay p50 {delay['p50']:.1f} ms p99 {delay['p99']:.1f} ms "
            f"max {delay['max']:.1f} ms, missed {row['live_missed']}, late ticks "
            f"{row['late_ticks']}, underruns {row['live_underruns']}{said}"
        )
    return result


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_model(args, Path(tmp))
        slots = max(2, args.live + args.join)
        spec = moshi_spec(args.model, slots)
        runner = MoshiEngineRunner(loaded, spec, seed=args.seed)
        if args.device.startswith("cuda"):
            runner.prepare_graphs()
        replay = SlotPrompt(text=args.text, voice=VOICE)
        probe = Engine(runner)
        handle = probe.acquire_slot("probe", replay)
        assert handle is not None
        sync(args.device)
        start = time.perf_counter()
        probe.step(0.0)  # builds the replay: the voice Mimi-encoded, the text tokenized
        sync(args.device)
        prepare_s = time.perf_counter() - start
        held = runner.replay(handle.slot).held  # type: ignore[union-attr]
        probe.release_slot(handle)
        probe.step(0.0)
        print(
            f"{args.model} on {args.device}: the prompt replays {held} frames; building it "
            f"(once per prompt and runner) took {prepare_s:.3f} s"
        )
        result: dict[str, Any] = {
            "model": args.model,
            "device": args.device,
            "torch_threads": torch.get_num_threads(),
            "voice_seconds": args.voice_seconds,
            "text": args.text,
            "load_average_at_start": os.getloadavg(),
            "replay_frames": held,
            "prepare_s": prepare_s,
            "alone": await alone(args, runner),
        }
        if args.live or args.join:
            result["load"] = {"live": args.live, "join": args.join}
            result["load"].update(await under_load(args, runner))
        result["load_average_at_end"] = os.getloadavg()
        print(f"load average: {result['load_average_at_start']} at the start, "
              f"{result['load_average_at_end']} at the end")  # fmt: skip
        return result


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("tiny-personaplex", "personaplex-7b"),
                        default="tiny-personaplex")  # fmt: skip
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--voice-seconds", type=float, default=10.0)
    parser.add_argument("--text", default=PERSONA)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--per-tick-repeats", type=int, default=1)
    parser.add_argument("--live", type=int, default=4)
    parser.add_argument("--join", type=int, default=2)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before the joins")
    parser.add_argument("--tail", type=float, default=2.0, help="seconds after the last ready")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--out", type=Path)
    return parser.parse_args(argv)


if __name__ == "__main__":
    options = parse()
    if not options.device.startswith("cuda"):
        torch.set_num_threads(options.threads)
    results = trio.run(main, options)
    if options.out is not None:
        options.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {options.out}")
