"""Image requests back to back against a running ``duplex serve --image-model``.

    python3 bench/images_load.py --url http://127.0.0.1:8000 [--clients 2] [--seconds 40]
        [--size 512x512] [--steps 30] [--out FILE.json]

``--clients`` clients each post ``POST /v1/images/generations`` (one image, ``--steps``
steps) one after another for ``--seconds`` (a request still running then is abandoned, so the
server stops it at its next step); reports images per minute and each image's
latency p50/p99. Run it alone and beside ``bench/served.py --url`` to see what the realtime
sessions leave the pipeline, and what the pipeline costs them.
"""

from __future__ import annotations

import argparse
import json
import time

import httpx
import numpy as np
import trio


async def main(args: argparse.Namespace) -> dict[str, object]:
    done: list[float] = []
    refused = 0
    end = time.monotonic() + args.seconds
    body = {"prompt": "a red cat", "size": args.size, "num_inference_steps": args.steps, "n": 1}

    async def client(k: int) -> None:
        nonlocal refused
        async with httpx.AsyncClient(base_url=args.url, timeout=600) as http:
            seed = k * 100_000
            while time.monotonic() < end:
                start = time.monotonic()
                seed += 1
                # a request still running at the end is abandoned
                with trio.move_on_at(trio.current_time() + end - start) as scope:
                    answer = await http.post("/v1/images/generations", json={**body, "seed": seed})
                if scope.cancelled_caught:
                    break
                if answer.status_code == 429:
                    refused += 1
                    await trio.sleep(0.5)
                    continue
                answer.raise_for_status()
                done.append(time.monotonic() - start)

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        for k in range(args.clients):
            nursery.start_soon(client, k)
    elapsed = min(time.monotonic(), end) - started
    return {
        "clients": args.clients,
        "size": args.size,
        "steps": args.steps,
        "seconds": round(elapsed, 1),
        "images": len(done),
        "images_per_min": round(len(done) * 60 / elapsed, 2),
        "latency_p50_s": round(float(np.percentile(done, 50)), 2) if done else None,
        "latency_p99_s": round(float(np.percentile(done, 99)), 2) if done else None,
        "refused_429": refused,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--size", default="512x512")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out")
    arguments = parser.parse_args()
    report = trio.run(main, arguments)
    print(json.dumps(report))
    if arguments.out:
        with open(arguments.out, "w") as f:
            json.dump(report, f, indent=2)
