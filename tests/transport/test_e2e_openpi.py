"""The robot policy endpoint end to end: real servers on loopback, OpenPI's own client.

- ``duplex serve`` in a subprocess, driven by ``openpi-client``'s ``WebsocketClientPolicy``
  from its own virtual environment (it pins numpy<2; ``scripts/bootstrap.sh`` makes
  ``.venv-openpi`` beside ``.venv``);
- in-process servers driven by a websockets client speaking the same frames: several
  robots at once, bad input of every kind, the frame limit both ways, the idle close, a
  server without a policy.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest
import trio
from structlog.testing import capture_logs
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.trio.client import ClientConnection, connect

from duplex.models import PolicyOptions, PolicyRequest, ReferencePolicy
from duplex.wire._openpi import (
    INTERNAL_ERROR,
    INVALID_PAYLOAD,
    MAX_PAYLOAD_BYTES,
    pack,
    unpack,
)

from ..helpers import scrape, served
from .wsclient import Server, running_server

ROOT = Path(__file__).resolve().parents[2]
PATH = "/v1/realtime/robot/openpi"
ECHO = {"server.policy": "tests.transport.openpi_policies:echo"}
INVALID = {"type": "error", "message": INVALID_PAYLOAD}


def openpi_python() -> Path:
    """The interpreter of the virtual environment that holds ``openpi-client``."""
    for venv in (ROOT / ".venv-openpi", Path(sys.prefix).parent / ".venv-openpi"):
        if (venv / "bin" / "python").exists():
            return venv / "bin" / "python"
    pytest.fail(
        "no .venv-openpi beside .venv: run scripts/bootstrap.sh (it installs openpi-client)"
    )


def deterministic_observation(k: int) -> dict[str, Any]:
    """What tests/transport/openpi_client_run.py sends (no RNG: other numpy there)."""
    pixels = np.arange(224 * 224 * 3, dtype=np.int64).reshape(224, 224, 3)
    return {
        "observation/image": ((pixels * (k + 3)) % 251).astype(np.uint8),
        "observation/wrist_image": ((pixels * (k + 7)) % 241).astype(np.uint8),
        "observation/state": np.linspace(-1.0, 1.0, 8, dtype=np.float32) * (k + 1),
        "prompt": "pick up the red block",
    }


async def run_openpi_client(url: str, *, host_port: bool = False) -> dict[str, Any]:
    """openpi-client's ``WebsocketClientPolicy`` against the server at ``url`` (its own
    environment, a subprocess); its report. ``host_port``: built as OpenPI's own examples
    build it, ``WebsocketClientPolicy(host, port)``, which connects to ``ws://host:port/``;
    else given the robot path's full URL."""
    if host_port:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        target = [host, port]
    else:
        target = [url.replace("http://", "ws://") + PATH]
    ran = await trio.run_process(
        [str(openpi_python()), str(ROOT / "tests/transport/openpi_client_run.py"), *target],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr.decode()[-2000:]
    report: dict[str, Any] = json.loads(ran.stdout)
    return report


def check_openpi_report(report: dict[str, Any]) -> None:
    """The reference policy's answers, as openpi-client saw them."""
    assert report["numpy"].startswith("1.")  # really openpi-client's own environment
    metadata = report["metadata"]
    assert metadata["policy"] == "duplex-reference"
    assert (metadata["action_horizon"], metadata["action_dim"]) == (10, 8)
    reference = ReferencePolicy(PolicyOptions())
    for k, result in enumerate(report["results"]):
        assert (result["shape"], result["dtype"]) == ([10, 8], "<f4")
        (expected,) = reference.infer_batch([PolicyRequest(deterministic_observation(k))])
        np.testing.assert_allclose(result["actions"], expected["actions"], rtol=1e-5, atol=1e-6)
        assert result["server_timing"]["infer_ms"] > 0
    assert "prev_total_ms" not in report["results"][0]["server_timing"]
    assert report["results"][1]["server_timing"]["prev_total_ms"] > 0
    assert report["reset"] == {"status": "reset successful"}
    assert report["complex"] == "ValueError"
    assert report["bad_frame"] == INVALID
    assert report["after_bad"] == [10, 8]


async def test_openpi_client_against_duplex_serve() -> None:
    openpi_python()
    async with served("--policy", "reference") as url:
        async with httpx.AsyncClient() as http:
            healthz = await http.get(url + "/healthz")
            assert (healthz.status_code, healthz.text) == (200, "OK\n")
        report = await run_openpi_client(url)
        stock = await run_openpi_client(url, host_port=True)
        async with httpx.AsyncClient() as http:  # a GET on / is still the browser page
            page = await http.get(url + "/")
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    check_openpi_report(report)
    check_openpi_report(stock)  # the stock client, given only the host and the port


# -- in-process servers, a websockets client -----------------------------------------------


def robot_url(server: Server) -> str:
    return server.http.replace("http://", "ws://") + PATH


@asynccontextmanager
async def robot(server: Server) -> AsyncIterator[ClientConnection]:
    async with connect(robot_url(server), max_size=None) as ws:
        metadata = unpack(await ws.recv())
        assert isinstance(metadata, dict)
        yield ws


async def ask(ws: ClientConnection, value: Any) -> Any:
    await ws.send(value if isinstance(value, bytes | str) else pack(value))
    with trio.fail_after(30):
        return unpack(await ws.recv())


async def test_several_robots_at_once_each_get_their_own_results() -> None:
    """16 robots send at once: their requests share batches, and every answer is its own."""
    robots = 16
    # a long wait, so that 16 requests sent at once surely meet in one batch
    async with running_server(**ECHO, **{"server.policy_batch_wait_ms": 300}) as server:
        answers: dict[int, list[dict[str, Any]]] = {}

        async def one(i: int, ready: trio.Event, go: trio.Event) -> None:
            async with robot(server) as ws:
                ready.set()
                await go.wait()
                answers[i] = []
                for step in range(3):
                    state = np.array([i, step], np.float32)
                    answers[i].append(await ask(ws, {"state": state, "session_id": f"r{i}"}))

        go = trio.Event()
        async with trio.open_nursery() as nursery:
            for i in range(robots):
                ready = trio.Event()
                nursery.start_soon(one, i, ready, go)
                await ready.wait()
            go.set()
        clients = set()
        for i, replies in answers.items():
            for step, reply in enumerate(replies):
                assert reply["actions"].shape == (10, 2)
                assert reply["actions"][0].tolist() == [i, step]
                assert reply["session"] == f"r{i}" and reply["reset"] == (step == 0)
            clients.add(int(replies[0]["client"]))
        assert len(clients) == robots  # each robot its own client id
        assert max(int(r["batch"]) for replies in answers.values() for r in replies) > 1
        metrics = await scrape(server.http)
        assert metrics.sum("duplex_request_largest_batch", runner="policy") > 1
        batches = metrics.sum("duplex_request_batches_total", runner="policy")
        assert 0 < batches < metrics.sum("duplex_requests_batched_total", runner="policy")


def marker(**fields: Any) -> dict[bytes, Any]:
    base = {b"__ndarray__": True, b"data": bytes(8), b"dtype": "<f4", b"shape": [2]}
    base.update({k.encode(): v for k, v in fields.items()})
    return {k: v for k, v in base.items() if v is not None}


BAD_FRAMES = [
    pytest.param(b"\x00\x01\x02 definitely not msgpack", id="non-msgpack-bytes"),
    pytest.param(json.dumps({"observation/state": [0.0, 1.0]}), id="json-text-frame"),
    pytest.param(msgpack.packb([1, 2, 3]), id="not-a-map"),
    pytest.param(msgpack.packb({"x": marker(dtype="|O")}), id="object-dtype"),
    pytest.param(msgpack.packb({"x": marker(dtype="<c8", data=bytes(16))}), id="complex-dtype"),
    pytest.param(msgpack.packb({"x": marker(dtype="V8")}), id="structured-dtype"),
    pytest.param(msgpack.packb({"x": marker(shape=None)}), id="missing-shape"),
    pytest.param(msgpack.packb({"x": marker(data=None)}), id="missing-data"),
    pytest.param(msgpack.packb({"x": marker(dtype=None)}), id="missing-dtype"),
    pytest.param(msgpack.packb({"endpoint": "train"}), id="unknown-endpoint"),
]


@pytest.mark.parametrize("frame", BAD_FRAMES)
async def test_bad_input_answers_invalid_payload_and_the_robot_goes_on(
    frame: bytes | str,
) -> None:
    async with running_server(**ECHO) as server, robot(server) as ws:
        first = await ask(ws, {"state": np.ones(1, np.float32), "session_id": "a"})
        assert first["reset"]
        assert await ask(ws, frame) == INVALID
        after = await ask(ws, {"state": np.ones(1, np.float32)})
        assert (after["session"], after["reset"]) == ("a", False)  # the session went on
        errors = (await scrape(server.http)).sum(
            "duplex_robot_errors_total", reason="invalid_payload"
        )
        assert errors == 1


async def test_inference_failures_answer_without_a_traceback() -> None:
    async with running_server(**ECHO) as server, robot(server) as ws:
        failed = await ask(ws, {"boom": True})
        assert failed == {"type": "error", "message": INTERNAL_ERROR}
        assert (await ask(ws, {"state": np.zeros(1, np.float32)}))["reset"]  # still pending
        assert (await scrape(server.http)).sum("duplex_requests_failed_total", runner="policy") == 1


async def test_the_64_mib_limit_refuses_and_recovers() -> None:
    """A frame just over 64 MiB is answered and the socket stays; far over, hypercorn closes
    it (1009) without reading it all."""
    async with running_server(**ECHO) as server:
        async with robot(server) as ws:
            over = pack({"blob": bytes(MAX_PAYLOAD_BYTES)})
            assert len(over) > MAX_PAYLOAD_BYTES
            assert await ask(ws, over) == INVALID
            at_limit = pack({"state": np.ones(1, np.float32), "blob": bytes(1024)})
            assert (await ask(ws, at_limit))["actions"].shape == (10, 1)
        async with robot(server) as ws:
            await ws.send(bytes(2 * MAX_PAYLOAD_BYTES + 1))
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_an_idle_robot_is_closed() -> None:
    """Its behaviour in time, both ways, is in test_openpi_connection.py under MockClock."""
    async with (
        running_server(**ECHO, **{"server.policy_idle_timeout_s": 0.3}) as server,
        robot(server) as ws,
    ):
        with pytest.raises(ConnectionClosed) as closed, trio.fail_after(20):
            await ws.recv()
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1000, "idle_timeout")


async def test_without_a_policy_the_endpoint_says_so_and_closes() -> None:
    async with (
        running_server(**{"server.policy": "none"}) as server,
        connect(robot_url(server)) as ws,
    ):
        assert json.loads(await ws.recv()) == {
            "type": "error",
            "error": "Robot policy not available",
            "code": "unsupported",
        }
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        async with httpx.AsyncClient() as http:
            assert (await http.get(server.http + PATH)).status_code == 426
            assert (await http.get(server.http + "/healthz")).status_code == 200


async def test_without_a_policy_a_websocket_on_root_is_refused_with_why() -> None:
    """OpenPI's client given only host and port opens ``ws://host:port/``: with no policy
    the upgrade is refused 404, the body says why (a policy is not loaded, and where the
    other clients connect), and the log says so too."""
    async with running_server(**{"server.policy": "none"}) as server:
        root = server.http.replace("http://", "ws://") + "/"
        with capture_logs() as logs, pytest.raises(InvalidStatus) as refused:
            async with connect(root):
                pass
        response = refused.value.response
        assert response.status_code == 404
        error = json.loads(response.body)["error"]
        assert error["code"] == "policy_not_loaded"
        assert "--policy" in error["message"] and "/v1/realtime" in error["message"]
        assert [e["code"] for e in logs if e["event"] == "robot refused"] == ["policy_not_loaded"]
        metrics = await scrape(server.http)
        assert metrics.sum("duplex_robot_errors_total", reason="policy_not_loaded") == 1
        async with httpx.AsyncClient() as http:  # the page and the health are untouched
            assert (await http.get(server.http + "/")).status_code == 200
            assert (await http.get(server.http + "/healthz")).status_code == 200


async def test_an_upgrade_no_route_takes_is_refused_with_why() -> None:
    """Starlette's own answer is a 403 with no body and no log line."""
    async with running_server(**ECHO) as server:
        url = server.http.replace("http://", "ws://") + "/v1/no/such/socket"
        with capture_logs() as logs, pytest.raises(InvalidStatus) as refused:
            async with connect(url):
                pass
        response = refused.value.response
        assert response.status_code == 404
        error = json.loads(response.body)["error"]
        assert error["code"] == "not_found"
        assert "/v1/no/such/socket" in error["message"] and PATH in error["message"]
        assert any(e["event"] == "websocket refused" and e["status"] == 404 for e in logs)
        metrics = await scrape(server.http)
        assert metrics.sum("duplex_access_refused_total", code="not_found") == 1
        async with robot(server) as ws:  # the server goes on
            assert (await ask(ws, {"state": np.ones(1, np.float32)}))["reset"]


async def test_root_is_the_robot_endpoint_with_its_own_frame_limit() -> None:
    """On ``/`` as on the robot path: a 20 MiB observation (over the sessions' 16 MiB)
    reaches the policy."""
    async with running_server(**ECHO) as server:
        root = server.http.replace("http://", "ws://") + "/"
        async with connect(root, max_size=None) as ws:
            assert isinstance(unpack(await ws.recv()), dict)
            big = {"state": np.ones(2, np.float32), "blob": bytes(20 * 1024 * 1024)}
            assert (await ask(ws, pack(big)))["actions"].shape == (10, 2)


async def test_a_key_in_openpi_clients_scheme_is_accepted_and_a_wrong_one_refused() -> None:
    """openpi-client's ``api_key`` sends ``Authorization: Api-Key <key>``."""
    key = "robot-key-0123456789abcdef"
    async with running_server(**ECHO, **{"server.api_keys": (key,)}) as server:
        for wrong in (None, "Api-Key not-the-key-0123456789", f"Basic {key}"):
            headers = {} if wrong is None else {"Authorization": wrong}
            with pytest.raises(InvalidStatus) as refused:
                async with connect(robot_url(server), additional_headers=headers):
                    pass
            assert refused.value.response.status_code == 401, wrong
        headers = {"Authorization": f"Api-Key {key}"}
        async with connect(robot_url(server), additional_headers=headers, max_size=None) as ws:
            assert isinstance(unpack(await ws.recv()), dict)  # the metadata frame
            answer = await ask(ws, {"observation/state": np.ones(3, np.float32)})
            assert "server_timing" in answer
