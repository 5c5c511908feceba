"""Engine processes end to end: real engine, shard and worker processes, killed on purpose.

With ``server.engine_process = "on"`` the server runs the engine in
``python -m duplex.topology._engine_process``; this process and each session shard
link to it. These tests find it among this process's children and kill it, or kill
a shard, and check what every client is told.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect as ws_connect

from duplex.services.robots._serving import UNAVAILABLE
from duplex.sessions import shard_of
from duplex.wire._openpi import pack, unpack

from ..helpers import parse_metrics
from ..transport.test_e2e_duplex import open_session
from ..transport.test_e2e_shards import (
    SHARDED,
    close_code,
    health_over_http,
    shard_pids,
)
from ..transport.test_e2e_workers import (
    BASE,
    OPEN_TIMEOUT_S,
    child_pids,
    client,
    echo,
    heard,
    metrics_over_http,
)
from ..transport.wsclient import Client, Server, running_server, tone

ROOT = Path(__file__).resolve().parent.parent.parent
ENGINE = b"duplex.topology._engine_process"
ON = {"server.engine_process": "on"}


def engine_pids() -> list[int]:
    return child_pids(ENGINE)


def sample(text: str, name: str, **labels: str) -> float | None:
    """One sample of ``/metrics`` text (labels in any order), or ``None``."""
    return parse_metrics(text).one(name, **labels)


async def engine_live_slots(server: Server) -> float | None:
    text = await metrics_over_http(server)
    return sample(text, "duplex_engine_live_slots", model="loopback", shard="0")


async def sleep_and_wake(server: Server) -> None:
    """The GPU default's layout (engine process, shards, workers) sleeps: live sessions of
    both shards refuse it, a forced sleep tells them and stops the engine process (its
    memory goes with it: no restart, no crash logged); asleep, sessions and speech are
    refused; a wake starts it again."""
    async with (
        httpx.AsyncClient(base_url=server.http, timeout=60) as http,
        AsyncExitStack() as stack,
    ):
        (before,) = engine_pids()
        live = [await stack.enter_async_context(client(server)) for _ in range(2)]
        for c in live:
            await open_session(c)
        refused = await http.post("/v1/omni/sleep")
        assert refused.status_code == 409, refused.text
        assert "2 session(s)" in refused.json()["error"]["message"]
        assert (await http.get("/health")).json()["status"] == "ok"  # admission open again
        assert (await http.post("/v1/audio/speech", json={"input": "Hi."})).status_code == 200

        slept = await http.post("/v1/omni/sleep", json={"force": True})
        assert slept.status_code == 200, slept.text
        answer = slept.json()
        assert answer["sessions_told"] == 2 and answer["engine_released"] is True, answer
        assert answer["memory_before"]["engine_processes"] == 1
        assert answer["memory_before"]["rss_bytes"] > 50 * 2**20  # the model, the TTS
        assert answer["memory_asleep"]["rss_bytes"] == 0
        for c in live:
            told = await c.until("error")
            assert "engine_sleeping" in told["error"]["message"]
            await c.until("session.closed")
        assert engine_pids() == []
        health = (await http.get("/health")).json()
        assert health["status"] == "sleeping", health
        async with client(server) as c:
            await c.send({"type": "session.create", "event_id": "x"})
            assert (await c.until("error"))["error"]["code"] == "engine_sleeping"
        speech = await http.post("/v1/audio/speech", json={"input": "Hi."})
        assert (speech.status_code, speech.json()["error"]["code"]) == (503, "engine_sleeping")

        woke = await http.post("/v1/omni/wakeup")
        assert woke.status_code == 200 and woke.json()["status"] == "awake", woke.text
        (after,) = engine_pids()
        assert after != before and woke.json()["memory_awake"]["engine_processes"] == 1
        assert (await http.post("/v1/audio/speech", json={"input": "Hi."})).status_code == 200
        restarts = parse_metrics(await metrics_over_http(server)).sum(
            "duplex_engine_process_restarts_total"
        )
        assert restarts == 0  # a pause, no crash


async def test_sessions_of_two_shards_share_one_engine_process_sleep_and_hear_only_themselves() -> (
    None
):
    """After a sleep and a wake of the engine process (`sleep_and_wake`), every shard
    admits sessions on the new one and each hears only itself; a shard killed takes only
    its own sessions and their slots."""
    overrides = {**SHARDED, **ON, "server.tts": "espeak"}
    async with running_server(**overrides) as server, AsyncExitStack() as stack:
        assert len(engine_pids()) == 1 and len(shard_pids()) == 1
        await sleep_and_wake(server)
        clients: list[Client] = []
        ids = []
        for _ in range(4):
            clients.append(c := await stack.enter_async_context(client(server)))
            ids.append((await open_session(c))["session"]["id"])
        assert sorted(shard_of(i) for i in ids) == [0, 0, 1, 1], ids
        said = [tone(6, amplitude=0.05 + 0.07 * n, start=3 * n) for n in range(4)]
        async with trio.open_nursery() as nursery:
            for c, spoken in zip(clients, said, strict=True):
                nursery.start_soon(partial(echo, c, spoken, timeout=40))
        assert [heard(c.events) for c in clients] == said
        # one engine: its figures are exported once (by shard 0), counting every shard's slots
        assert await engine_live_slots(server) == 4
        text = await metrics_over_http(server)
        assert sample(text, "duplex_engine_live_slots", model="loopback", shard="1") is None
        status, health = await health_over_http(server)
        assert status == 200 and health["status"] == "ok"
        assert [s["sessions"]["live"] for s in health["shards"]] == [2, 2]
        # one engine, counted once: each shard may fill all its slots, the server not twice
        (slots,) = {e["slots"] for s in health["shards"] for e in s["engines"]}
        assert slots > 0 and [s["sessions"]["capacity"] for s in health["shards"]] == [slots] * 2
        assert health["sessions"] == {"live": 4, "capacity": slots}
        assert sample(text, "duplex_server_sessions_capacity") == slots
        assert sample(text, "duplex_server_sessions_live") == 4

        # a session process killed: its sessions go, and so do their engine slots
        (shard,) = shard_pids()
        os.kill(shard, signal.SIGKILL)
        lost = [c for c, i in zip(clients, ids, strict=True) if shard_of(i) == 1]
        for c in lost:
            assert await close_code(c) == 1011
        with trio.fail_after(10):
            while await engine_live_slots(server) != 2:
                await trio.sleep(0.1)
        kept = [c for c, i in zip(clients, ids, strict=True) if shard_of(i) == 0]
        for n, c in enumerate(kept):
            await echo(c, tone(4, amplitude=0.3 + 0.1 * n))  # untouched


async def test_a_killed_engine_process_is_replaced_and_its_sessions_are_told_and_moved() -> None:
    async with running_server(**BASE, **ON) as server, AsyncExitStack() as stack:
        (pid,) = engine_pids()
        speaking = await stack.enter_async_context(client(server))
        idle = await stack.enter_async_context(client(server))
        for c in (speaking, idle):
            await open_session(c)
        await speaking.stream(tone(30), realtime=False)  # a long answer: killed in its middle
        await speaking.until("response.audio.delta", timeout=20)
        os.kill(pid, signal.SIGKILL)
        for c in (speaking, idle):
            error = await c.until("error", timeout=OPEN_TIMEOUT_S)
            assert error["error"]["code"] == "engine_error"
        done = speaking.of("response.done")
        assert [d["response"]["status"] for d in done] == ["failed"]
        # told again when the new engine process takes them (what they sent meanwhile is lost)
        for c in (speaking, idle):
            error = await c.until("error", timeout=OPEN_TIMEOUT_S)
            assert error["error"]["code"] == "engine_error"
            assert "restarted" in error["error"]["message"]
        # both sessions carry on, on the new engine process
        for n, c in enumerate((speaking, idle)):
            c.events.clear()
            await echo(c, tone(4, amplitude=0.2 + 0.1 * n), timeout=30)
        (new_pid,) = engine_pids()
        assert new_pid != pid
        status, health = await health_over_http(server)
        assert status == 200 and health["engine_starts"] == 2
        assert health["sessions"]["live"] == 2
        text = await metrics_over_http(server)
        assert sample(text, "duplex_engine_process_restarts_total") == 1
        assert sample(text, "duplex_engine_live_slots", model="loopback") == 2


async def test_a_new_session_is_refused_while_the_engine_restarts_and_admitted_after() -> None:
    async with running_server(**BASE, **ON) as server:
        (pid,) = engine_pids()
        os.kill(pid, signal.SIGKILL)
        with trio.fail_after(10):  # the link ends at once: the engine is out of admission
            while True:
                status, health = await health_over_http(server)
                if status == 503:
                    break
                await trio.sleep(0.02)
        assert health["status"] == "starting"
        async with client(server) as c:
            await c.send({"type": "session.create", "event_id": "x", "session": {}})
            answer = await c.recv(OPEN_TIMEOUT_S)
            assert answer["type"] == "error" and answer["error"]["code"] == "resource_exhausted"
        with trio.fail_after(OPEN_TIMEOUT_S):  # and it is back
            while (await health_over_http(server))[0] != 200:
                await trio.sleep(0.1)
        async with client(server) as c:
            await open_session(c)
            await echo(c, tone(3, amplitude=0.4))


async def test_a_stopped_engine_process_is_reported_stalled_and_recovers() -> None:
    never = {"server.engine_stall_timeout_s": 0}  # reported only: no watchdog (next test)
    async with running_server(**BASE, **ON, **never) as server, client(server) as c:
        (pid,) = engine_pids()
        await open_session(c)
        await echo(c, tone(3))
        os.kill(pid, signal.SIGSTOP)  # no tick ends, yet the process lives
        try:
            with trio.fail_after(10):
                while True:
                    status, health = await health_over_http(server)
                    if health["status"] == "degraded":
                        break
                    await trio.sleep(0.2)
            engines = [(e["engine"], e["status"]) for e in health["engines"]]
            assert status == 200 and engines == [(0, "stalled")]
            text = await metrics_over_http(server)
            assert sample(text, "duplex_engine_stalled", model="loopback", engine="0") == 1
        finally:
            os.kill(pid, signal.SIGCONT)
        with trio.fail_after(10):
            while (await health_over_http(server))[1]["status"] != "ok":
                await trio.sleep(0.1)
        c.events.clear()
        await echo(c, tone(3, amplitude=0.2), timeout=30)


async def test_an_engine_process_stopped_past_the_stall_timeout_is_killed_and_replaced() -> None:
    stall = {"server.engine_stall_timeout_s": 1.0}
    async with running_server(**BASE, **ON, **stall) as server, AsyncExitStack() as stack:
        (pid,) = engine_pids()
        speaking = await stack.enter_async_context(client(server))
        idle = await stack.enter_async_context(client(server))
        for c in (speaking, idle):
            await open_session(c)
        await speaking.stream(tone(30), realtime=False)  # stopped in the middle of an answer
        await speaking.until("response.audio.delta", timeout=20)
        os.kill(pid, signal.SIGSTOP)
        try:  # told as on a crash: the watchdog killed it (SIGKILL ends a stopped process)
            for c in (speaking, idle):
                error = await c.until("error", timeout=OPEN_TIMEOUT_S)
                assert error["error"]["code"] == "engine_error"
            assert [d["response"]["status"] for d in speaking.of("response.done")] == ["failed"]
            for c in (speaking, idle):
                error = await c.until("error", timeout=OPEN_TIMEOUT_S)
                assert "restarted" in error["error"]["message"]
        finally:
            if pid in engine_pids():
                os.kill(pid, signal.SIGCONT)
        for n, c in enumerate((speaking, idle)):
            c.events.clear()
            await echo(c, tone(4, amplitude=0.2 + 0.1 * n), timeout=30)
        (new_pid,) = engine_pids()
        assert new_pid != pid
        text = await metrics_over_http(server)
        assert sample(text, "duplex_engine_stall_kills_total") == 1
        assert sample(text, "duplex_engine_process_restarts_total") == 1
        assert sample(text, "duplex_engine_live_slots", model="loopback") == 2
        # the new one ticks at its own pace: never killed while it does
        await trio.sleep(3.0)
        await echo(speaking, tone(3, amplitude=0.4), timeout=30)
        assert sample(await metrics_over_http(server), "duplex_engine_stall_kills_total") == 1
        assert engine_pids() == [new_pid]


@pytest.fixture
def served_bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``bench/served.py`` as a module (its pure parts, tested without a server)."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # as when run: its siblings import
    spec = importlib.util.spec_from_file_location("served_bench", ROOT / "bench" / "served.py")
    assert spec is not None and spec.loader is not None
    served = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "served_bench", served)  # its dataclass looks itself up
    spec.loader.exec_module(served)
    return served


def test_a_step_down_plan_admits_the_survivors_first_and_spaces_its_windows(
    served_bench: Any,
) -> None:
    plan = served_bench.Plan((4, 2), warmup=1.0, seconds=2.0, settle=0.5)
    gap, period = served_bench.TIER_GAP, served_bench.PERIOD
    assert [plan.last_window(i) for i in range(4)] == [1, 1, 0, 0]
    # the survivors (0, 1) start first, the leavers a tier later; all spread over one period
    assert [plan.start(i) for i in range(4)] == [0.0, period / 4, gap + period / 2, gap + 0.06]
    first = gap + period + 1.0  # every session started, then the warm-up
    assert plan.window(0) == (first, first + 2.0)
    assert plan.window(1) == (first + 2.5, first + 4.5)  # --settle between them
    assert [plan.end(i) for i in range(4)] == [first + 4.5] * 2 + [first + 2.0] * 2
    one = served_bench.Plan((3,), warmup=1.0, seconds=2.0)  # a plain N: no tiers
    assert one.start(2) == 2 * period / 3 and one.window(0) == (period + 1.0, period + 3.0)
    args = argparse.Namespace(counts=served_bench._counts("128,capacity,256"), step_down=True)
    assert served_bench._streams(args, 290) == [(290, 256, 128)]  # one stream, largest first
    args.step_down = False
    assert served_bench._streams(args, 290) == [(128,), (290,), (256,)]


def test_the_served_bench_times_the_engine_at_the_servers_precisions(served_bench: Any) -> None:
    """``--engine-bench`` runs the engine alone as the server is told to run it."""
    served = served_bench
    args = ["--model", "moshi-7b", "--kv-cache-dtype", "int4", "--weight-dtype=fp8"]
    command = served.engine_bench_command([128, 256], [*args, "--codec-dtype", "bf16"], Path("o"))
    assert command[command.index("--phases") + 1] == "ours-int4-staggered"
    assert command[command.index("--batches") + 1] == "128,256"
    assert command[command.index("--weight-dtype") + 1] == "fp8"
    assert command[command.index("--codec-dtype") + 1] == "bf16"
    plain = served.engine_bench_command([64], ["--model", "moshi-7b"], Path("o"))
    assert plain[plain.index("--phases") + 1] == "ours-fp8-staggered"  # as before
    assert "--weight-dtype" not in plain and "--codec-dtype" not in plain
    bf16 = served.engine_bench_command([64], ["--kv-cache-dtype", "bf16"], Path("o"))
    assert bf16[bf16.index("--phases") + 1] == "ours"
    # a run served past the ring's length compares with every ring full
    full = served.engine_bench_command([256], args, Path("o"), "full")
    assert full[full.index("--phases") + 1] == "ours-int4"
    bf16_full = served.engine_bench_command([64], ["--kv-cache-dtype", "bf16"], Path("o"), "full")
    assert bf16_full[bf16_full.index("--phases") + 1] == "ours-full"


def test_the_served_bench_runs_the_topology_end_to_end(tmp_path: Path) -> None:
    """``bench/served.py --step-down`` on the CPU: a test of the layout it serves and of the
    stream's windows, not a timing."""
    out = tmp_path / "served.json"
    subprocess.run(
        [
            sys.executable, str(ROOT / "bench" / "served.py"), "--counts", "2,4", "--step-down",
            "--seconds", "1", "--warmup", "0.5", "--settle", "1", "--client-procs", "2",
            "--out", str(out), "--", "--engine-process", "on",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    wide, narrow = json.loads(out.read_text())["rows"]
    assert (wide["sessions"], narrow["sessions"]) == (4, 2)  # the largest first
    for row in (wide, narrow):
        assert row["admitted"] == row["sessions"] and not row["refused"]
        assert row["frames_ratio"] > 0 and row["delay_p99_ms"] is not None
    assert wide["window_s"][1] + 1 == narrow["window_s"][0]  # --settle between the windows
    # the survivors were admitted first: they hold the lowest slots, so the step narrowed
    assert (wide["slot_span"], narrow["slot_span"]) == (4, 2)


def test_the_served_bench_times_the_engine_alone_after_the_server(tmp_path: Path) -> None:
    """``--engine-bench`` with the tiny Moshi on the CPU: the engine alone runs once the
    server has stopped, at the N served, as the server ran it. One session: admission's
    step-time rule never holds the first back, however busy the host."""
    out, engine_out = tmp_path / "served.json", tmp_path / "engine"
    subprocess.run(
        [
            sys.executable, str(ROOT / "bench" / "served.py"), "--counts", "1",
            "--seconds", "1", "--warmup", "0.5", "--client-procs", "1", "--engine-bench",
            "--engine-context", "full", "--engine-out", str(engine_out), "--out", str(out),
            "--", "--model", "tiny", "--random-weights", "--model-device", "cpu",
            "--tts", "none", "--no-agent",
        ],
        check=True,
        capture_output=True,
        timeout=180,
    )  # fmt: skip
    (row,) = json.loads(out.read_text())["rows"]
    assert row["admitted"] == 1 and row["frames_ratio"] > 0
    assert row["engine_only_step_p99_ms"] > 0 and row["window_over_engine_step"] > 0
    engine = json.loads(engine_out.with_suffix(".json").read_text())
    assert engine["params"]["preset"] == "tiny" and engine["params"]["batches"] == [1]
    assert engine["phases"]["ours-fp8"]["mode"] == "full"  # every ring full, as asked


async def test_two_engine_processes_share_the_sessions_and_a_lost_one_costs_only_its_own() -> None:
    devices = {"server.model_device": "cpu,cpu"}
    async with running_server(**BASE, **ON, **devices) as server, AsyncExitStack() as stack:
        assert len(engine_pids()) == 2
        clients = []
        for _ in range(4):
            clients.append(c := await stack.enter_async_context(client(server)))
            await open_session(c)
        with trio.fail_after(5):  # the engines' figures come with their status, 4 a second
            while True:
                text = await metrics_over_http(server)
                per_engine = [
                    sample(text, "duplex_engine_live_slots", model="loopback", engine=str(i))
                    for i in (0, 1)
                ]
                if sum(v or 0 for v in per_engine) == 4:
                    break
                await trio.sleep(0.1)
        assert per_engine == [2, 2]  # each new session went to the engine with most room
        for n, c in enumerate(clients):
            await echo(c, tone(3, amplitude=0.1 + 0.1 * n))
        # kill the engine process that hosts slots of two of them: only those two are told
        victim = max(engine_pids())
        os.kill(victim, signal.SIGKILL)
        with trio.fail_after(5):  # out of admission at once; back after its restart
            while (health := (await health_over_http(server))[1])["status"] != "degraded":
                await trio.sleep(0.02)
        assert sorted(e["status"] for e in health["engines"]) == ["ok", "unavailable"]
        told: list[str] = []

        async def listen(c: Client) -> None:
            with trio.move_on_after(3):
                told.append((await c.until("error", timeout=3))["error"]["code"])

        async with trio.open_nursery() as nursery:
            for c in clients:
                nursery.start_soon(listen, c)
        assert told == ["engine_error"] * 2  # only the two sessions on the lost engine
        with trio.fail_after(OPEN_TIMEOUT_S):
            while (await health_over_http(server))[1]["status"] != "ok":
                await trio.sleep(0.1)
        for n, c in enumerate(clients):
            c.events.clear()
            await echo(c, tone(3, amplitude=0.5 + 0.05 * n), timeout=30)


async def test_the_robot_policy_runs_in_the_engine_process_and_survives_its_restart() -> None:
    """``--policy`` with engine processes: the policy is built and batched in the engine
    process (its metadata and counters come over the link); a robot whose engine process is
    killed is answered ``Policy unavailable`` (not the policy's ``Internal inference
    error``) or waits, keeps its socket, and is served again."""
    policy = {"server.policy": "reference"}
    async with running_server(**BASE, **ON, **policy) as server:
        (pid,) = engine_pids()
        url = server.http.replace("http://", "ws://") + "/v1/realtime/robot/openpi"
        observation = {"observation/state": np.zeros(8, np.float32), "prompt": "stack"}
        async with ws_connect(url, max_size=None) as ws:
            metadata = unpack(await ws.recv())
            assert metadata["policy"] == "duplex-reference"

            async def ask() -> dict[str, Any]:
                await ws.send(pack(observation))
                with trio.fail_after(30):
                    answer = unpack(await ws.recv())
                assert isinstance(answer, dict)
                return answer

            assert (await ask())["actions"].shape == (10, 8)
            # the engine process's counters come with its status, a snapshot that may be
            # taken between the request's queueing and its batch: wait for the batch
            with trio.fail_after(5):
                while sample(text := await metrics_over_http(server),
                             "duplex_requests_batched_total", runner="policy") != 1:  # fmt: skip
                    await trio.sleep(0.05)
            assert sample(text, "duplex_requests_total", runner="policy") == 1
            # the policy's batch ran in the engine's slack, counted with the engine's figures
            slack_units = re.search(r"^duplex_engine_slack_units_total\{[^}]*\} (\S+)$", text, re.M)
            assert slack_units is not None and float(slack_units.group(1)) >= 1
            os.kill(pid, signal.SIGKILL)
            answers = []
            with trio.fail_after(OPEN_TIMEOUT_S):
                while "actions" not in (answer := await ask()):
                    answers.append(answer)
                    await trio.sleep(0.05)
            assert answer["actions"].shape == (10, 8)
            assert all(a == {"type": "error", "message": UNAVAILABLE} for a in answers)
            text = await metrics_over_http(server)
            assert sample(text, "duplex_robot_errors_total", reason="engine_unavailable") == len(
                answers
            )
            assert sample(text, "duplex_robot_errors_total", reason="inference_failed") in (0, None)
        (new_pid,) = engine_pids()
        assert new_pid != pid


async def test_a_video_job_and_stream_whose_engine_process_dies_fail_engine_unavailable() -> None:
    """A video generation running in the engine process when it is killed ends ``failed``
    with ``engine_unavailable`` (not ``generation_failed``: the pipeline did not fail), the
    stream with that error and 1011; the same request then succeeds on the new process."""
    media = {
        "server.video_model": "tiny",
        "server.video_chunk_frames": 4,
        "server.media_max_request_s": 86400.0,  # its long job runs until its engine is killed
    }
    async with (
        running_server(**BASE, **ON, **media) as server,
        httpx.AsyncClient(timeout=60) as http,
    ):
        (pid,) = engine_pids()
        form = {"prompt": "waves", "size": "32x16", "seconds": "0.5", "fps": "8"}
        long = {**form, "seconds": "10", "num_inference_steps": "500"}  # minutes on this CPU
        job = (await http.post(server.http + "/v1/videos", data=long)).json()
        start = {"type": "session.start", "prompt": "waves", "format": "m4s", "width": 32,
                 "height": 16, "fps": 8, "num_frames": 80, "num_inference_steps": 500}  # fmt: skip
        video_url = server.http.replace("http://", "ws://") + "/v1/realtime/video"
        async with ws_connect(video_url) as ws:
            await ws.send(json.dumps(start))
            assert json.loads(await ws.recv())["type"] == "video.start"
            with trio.fail_after(30):
                while (await video_job(http, server, job["id"]))["status"] != "in_progress":
                    await trio.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
            with trio.fail_after(30):
                error = json.loads(await ws.recv())
                assert (error["type"], error["code"]) == ("error", "engine_unavailable"), error
                with pytest.raises(ConnectionClosed):
                    await ws.recv()
            assert ws.close_code == 1011
        with trio.fail_after(30):
            while (failed := await video_job(http, server, job["id"]))["status"] != "failed":
                await trio.sleep(0.1)
        assert failed["error"]["code"] == "engine_unavailable", failed
        assert "engine process" in failed["error"]["message"]
        # the same kind of job succeeds once the new engine process serves (503 until then)
        with trio.fail_after(60):
            while True:
                answer = await http.post(server.http + "/v1/videos",
                                         data={**form, "num_inference_steps": "2"})  # fmt: skip
                if answer.status_code == 200:
                    break
                assert answer.status_code == 503, answer.text
                assert answer.json()["error"]["code"] == "model_starting"
                await trio.sleep(0.2)
        again = answer.json()
        with trio.fail_after(120):
            while (done := await video_job(http, server, again["id"]))["status"] not in (
                "completed",
                "failed",
            ):
                await trio.sleep(0.1)
        assert done["status"] == "completed", done
        assert engine_pids() != [pid]


async def video_job(http: httpx.AsyncClient, server: Server, job_id: str) -> dict[str, Any]:
    return (await http.get(f"{server.http}/v1/videos/{job_id}")).json()  # type: ignore[no-any-return]


def engine_histograms(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``_count`` samples of the engine histograms in ``/metrics`` text (prometheus_client's
    parser), keyed by name and sorted labels."""
    counts = {}
    for family in text_string_to_metric_families(text):
        if family.name not in ("duplex_engine_step_seconds", "duplex_engine_tick_lateness_seconds"):
            continue
        assert family.type == "histogram"
        for s in family.samples:
            if s.name.endswith("_count"):
                counts[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return counts


async def test_engine_process_histograms_are_exported_once_per_engine() -> None:
    """The engine process ships its step-time and tick-lateness histograms in its status;
    the server exports them with an ``engine`` label, and they count the steps it ran."""
    async with running_server(**ON) as server:
        assert len(engine_pids()) == 1
        async with client(server) as c:
            await open_session(c)
            await echo(c, tone(6))
        with trio.fail_after(10):  # the next status (every 0.25 s) carries the steps
            while True:
                counts = engine_histograms(await metrics_over_http(server))
                steps = counts.get(
                    (
                        "duplex_engine_step_seconds_count",
                        (("batch", "1"), ("engine", "0"), ("model", "loopback")),
                    ),
                    0,
                )
                if steps >= 6:
                    break
                await trio.sleep(0.1)
        late = counts[
            (
                "duplex_engine_tick_lateness_seconds_count",
                (("engine", "0"), ("model", "loopback")),
            )
        ]
        assert late >= steps  # a tick per step at least
        assert {labels for _, labels in counts} >= {
            (("batch", str(1 << i)), ("engine", "0"), ("model", "loopback")) for i in range(3)
        }  # every batch bucket, from the start
        assert all(dict(labels)["engine"] == "0" for _, labels in counts)  # one engine, once
