"""Whisper as the agent's ASR (`WhisperRunner`): time of one batched ``generate`` at 1/4/8
streams, and how long the trio event loop stalls while it runs in a worker thread.

    python bench/whisper_asr.py --streams 1,4,8 --repeats 5 [--shape tiny|whisper-tiny]
        [--model DIR] [--out bench/results/whisper-asr]

The model is a random-weight Whisper built here (``tests/agent/tiny_whisper.py``; or
``--model DIR``, any local checkpoint): ``tiny`` is the test model (d_model 32, one layer),
``whisper-tiny`` openai/whisper-tiny's shape (d_model 384, 4+4 layers; its vocabulary is
the test tokenizer's 330 tokens, not 51865). Random weights say random words: the figures
are the work of a batch, not accuracy. Each stream's chunk is the ``final`` of a 3 s turn
of the espeak-ng fixture (so every stream is decoded); tokens decoded per row are reported.

The stall: a trio task sleeps 5 ms again and again and records how late it wakes while
batches run through ``trio.to_thread.run_sync`` (as the request engine runs them), with
the server's settings (one torch thread, a 1 ms GIL switch interval). The same for
pocketsphinx in a thread (a 3 s chunk per stream), which is why it runs in child processes.

Writes ``<out>.json`` (every figure and the exact command).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _served import commit, machine, write_report  # noqa: E402

from duplex.models.agent import AsrChunk, PocketSphinxRunner, WhisperRunner  # noqa: E402
from duplex.models.agent._asr import _NoGate  # noqa: E402
from tests.agent.test_asr_process import hello_16k  # noqa: E402
from tests.agent.tiny_whisper import TINY, WHISPER_TINY, build  # noqa: E402

TICK_S = 0.005


def _ms(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)) * 1000.0, 1)


async def _stalls(work: Any, batches: int) -> dict[str, Any]:
    """Run ``work()`` ``batches`` times in a thread; the ticker's lateness meanwhile."""
    late: list[float] = []
    runs: list[float] = []
    done = trio.Event()

    async def ticker() -> None:
        while not done.is_set():
            start = trio.current_time()
            await trio.sleep(TICK_S)
            late.append(trio.current_time() - start - TICK_S)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        for _ in range(batches):
            start = time.perf_counter()
            await trio.to_thread.run_sync(work)
            runs.append(time.perf_counter() - start)
        done.set()
    return {
        "batches": batches,
        "batch_ms_median": _ms(runs, 50),
        "ticks": len(late),
        "late_ms_p50": _ms(late, 50),
        "late_ms_p99": _ms(late, 99),
        "late_ms_max": _ms(late, 100),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,4,8")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shape", choices=["tiny", "whisper-tiny"], default="tiny")
    parser.add_argument("--model", help="a local Whisper checkpoint folder instead")
    parser.add_argument("--max-new-tokens", type=int, default=28)
    parser.add_argument("--device", default="cpu", help="torch device (cuda on a GPU host)")
    parser.add_argument("--out", default="bench/results/whisper-asr")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # as the server (limit_torch_threads)
    sys.setswitchinterval(0.001)  # as a process hosting request runners
    turn = np.tile(hello_16k(), 2)[: 3 * 16_000]
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            folder = Path(args.model)
        else:
            shape = TINY if args.shape == "tiny" else WHISPER_TINY
            std = 0.5 if args.shape == "tiny" else 0.02
            folder = build(Path(tmp) / "whisper", shape=shape, init_std=std)
        runner = WhisperRunner(folder, device=args.device, max_new_tokens=args.max_new_tokens)
        runner.prepare()
        params = sum(p.numel() for p in runner._model.parameters())
        gate = _NoGate()
        serial = iter(range(10**9))

        def batch(n: int) -> list[Any]:
            return [AsrChunk(f"s{next(serial)}", turn, final=True) for _ in range(n)]

        runner.run_batch(batch(1), gate)  # warm-up
        generate: dict[str, Any] = {}
        for n in [int(s) for s in args.streams.split(",")]:
            times = []
            for _ in range(args.repeats):
                requests = batch(n)
                start = time.perf_counter()
                texts = runner.run_batch(requests, gate)
                times.append(time.perf_counter() - start)
            tok = runner._processor.tokenizer
            tokens = [len(tok(t.text, add_special_tokens=False).input_ids) for t in texts]
            generate[str(n)] = {
                "ms_median": _ms(times, 50),
                "ms_min": _ms(times, 0),
                "ms_per_stream": round(statistics.median(times) * 1000.0 / n, 1),
                "tokens_per_row": round(float(np.mean(tokens)), 1),
            }
            print(f"whisper B={n}: {generate[str(n)]}", flush=True)
        most = max(int(s) for s in args.streams.split(","))
        stall: dict[str, Any] = {
            "idle": trio.run(_stalls, lambda: time.sleep(0.2), args.repeats),
            f"whisper_B{most}": trio.run(
                _stalls, lambda: runner.run_batch(batch(most), gate), args.repeats
            ),
        }
        if importlib.util.find_spec("pocketsphinx") is not None:  # (not on every host)
            sphinx = PocketSphinxRunner(warm=most, max_batch=most)
            sphinx.prepare()
            stall[f"pocketsphinx_B{most}"] = trio.run(
                _stalls, lambda: sphinx.run_batch(batch(most), gate), args.repeats
            )
        for name, figures in stall.items():
            print(f"stall {name}: {figures}", flush=True)
    report = {
        "bench": "whisper_asr",
        "command": "python " + " ".join(["bench/whisper_asr.py", *sys.argv[1:]]),
        "machine": machine(),
        "commit": commit(),
        "model": Path(args.model).name if args.model else f"random {args.shape}",
        "parameters": params,
        "max_new_tokens": args.max_new_tokens,
        "device": args.device,
        "torch_threads": torch.get_num_threads(),
        "generate": generate,
        "stall": stall,
    }
    write_report(Path(args.out + ".json"), report)


if __name__ == "__main__":
    main()
