"""Exposure end to end: each access rule refuses over a real socket, then lets the right one in."""

from __future__ import annotations

import json
import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from structlog.testing import capture_logs
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.trio.client import connect

from duplex.transport import _app

from .wsclient import Client, Server, running_server

KEY = "sk-duplex-" + "k" * 24
KEYED = {"server.api_keys": [KEY]}
BEARER = {"Authorization": f"Bearer {KEY}"}
Layout = dict[str, int]


@pytest.fixture(params=[0, 2], ids=["one-process", "two-workers"])
def workers(request: pytest.FixtureRequest) -> Layout:
    return {"server.connection_workers": request.param}


def realtime(server: Server) -> str:
    return server.url.replace("/v1/duplex", "/v1/realtime")


async def refused(url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of a refused WebSocket handshake."""
    with pytest.raises(InvalidStatus) as caught:
        async with connect(url, **kwargs):
            pass  # pragma: no cover
    response = caught.value.response
    return response.status_code, json.loads(response.body or b"{}")


async def opens_a_session(url: str, **kwargs: Any) -> dict[str, Any]:
    """Connect to ``/v1/realtime`` and read its ``session.created``."""
    async with connect(url, max_queue=None, **kwargs) as ws:
        created = await Client(ws).recv()
        assert created["type"] == "session.created"
        return {"subprotocol": ws.subprotocol}


async def test_api_key_on_every_route_wrong_then_right(workers: Layout) -> None:
    # five wrong keys, most on one kept-alive connection (one worker), then the right one:
    # with two workers each holds half the server's budget, so the budget is twice that
    budget = {"server.auth_failure_burst": 12}
    async with (
        running_server(**KEYED, **workers, **budget) as server,
        httpx.AsyncClient() as http,
    ):
        for path in ("/health", "/v1/models", "/metrics"):
            missing = await http.get(server.http + path)
            wrong = await http.get(server.http + path, headers={"Authorization": "Bearer nope"})
            for answer in (missing, wrong):
                assert answer.status_code == 401
                error = answer.json()["error"]
                assert error["code"] == "invalid_api_key" and "nope" not in answer.text
            assert (await http.get(server.http + path, headers=BEARER)).status_code == 200
        for url in (server.url, realtime(server)):
            status, body = await refused(url)
            assert status == 401 and body["error"]["type"] == "invalid_request_error"
            assert (await refused(url, additional_headers={"Authorization": "Bearer x"}))[0] == 401
        await opens_a_session(realtime(server), additional_headers=BEARER)
        # a browser: the key in the subprotocol; we echo "realtime", never the key
        offered = ["realtime", f"openai-insecure-api-key.{KEY}"]
        opened = await opens_a_session(realtime(server), subprotocols=offered)
        assert opened["subprotocol"] == "realtime"


async def test_wrong_keys_are_rate_limited_then_recover() -> None:
    limits = {"server.auth_failure_burst": 3, "server.auth_failure_window_s": 1.5}
    async with running_server(**KEYED, **limits) as server, httpx.AsyncClient() as http:
        for _ in range(3):
            wrong = await http.get(server.http + "/health", headers={"Authorization": "Bearer x"})
            assert wrong.status_code == 401
        limited = await http.get(server.http + "/health", headers=BEARER)
        assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limited"
        assert (await refused(server.url, additional_headers=BEARER))[0] == 429
        await trio.sleep(1.6)  # the budget refills
        assert (await http.get(server.http + "/health", headers=BEARER)).status_code == 200
        metrics = (await http.get(server.http + "/metrics", headers=BEARER)).text
        assert 'duplex_access_refused_total{code="invalid_api_key"} 3' in metrics
        assert 'duplex_access_refused_total{code="rate_limited"} 2' in metrics


async def test_workers_share_one_wrong_key_budget_then_recover() -> None:
    """Two connection workers: a peer's wrong keys, each on a new connection (wherever the
    kernel hands it), get at most the server's burst of 401s before ``rate_limited``, not a
    burst per worker; the budget refills at the server's rate."""
    limits = {"server.auth_failure_burst": 4, "server.auth_failure_window_s": 2.0}
    async with running_server(**KEYED, **limits, **{"server.connection_workers": 2}) as server:
        statuses = []
        for _ in range(10):
            async with httpx.AsyncClient() as fresh:  # a new connection each time
                wrong = {"Authorization": "Bearer x"}
                statuses.append(
                    (await fresh.get(server.http + "/health", headers=wrong)).status_code
                )
        assert set(statuses) == {401, 429} and statuses.count(401) <= 4
        assert statuses[statuses.index(429) :].count(401) <= 2  # a second worker's share at most
        await trio.sleep(2.1)  # every worker's share refills
        async with httpx.AsyncClient() as fresh:
            assert (await fresh.get(server.http + "/health", headers=BEARER)).status_code == 200


async def test_client_secret_works_once_not_twice_not_after_expiry(
    workers: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_server(**KEYED, **workers) as server, httpx.AsyncClient() as http:
        mint = server.http + "/v1/realtime/client_secrets"
        assert (await http.post(mint)).status_code == 401  # minting needs a real key
        body = {"expires_after": {"anchor": "created_at", "seconds": 10}, "session": {"x": 1}}
        answer = await http.post(mint, headers=BEARER, json=body)
        assert answer.status_code == 200
        secret = answer.json()
        assert secret["value"].startswith("ek_") and secret["session"] == {"x": 1}
        assert 9 <= secret["expires_at"] - _app.wall_time() <= 10
        bad = await http.post(mint, headers=BEARER, json={"expires_after": {"seconds": 1}})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_value"
        huge = await http.post(mint, headers=BEARER, content=b" " * 70_000)
        assert huge.status_code == 413
        # a client secret is no API key
        as_key = {"Authorization": f"Bearer {secret['value']}"}
        assert (await http.get(server.http + "/health", headers=as_key)).status_code == 401
        assert (await http.post(mint, headers=as_key)).status_code == 401

        offered = ["realtime", f"openai-insecure-api-key.{secret['value']}"]
        opened = await opens_a_session(realtime(server), subprotocols=offered)
        assert opened["subprotocol"] == "realtime"
        assert (await refused(realtime(server), subprotocols=offered))[0] == 401  # used up

        later = (await http.post(mint, headers=BEARER, json=body)).json()["value"]
        now = _app.wall_time()
        monkeypatch.setattr(_app, "wall_time", lambda: now + 11)
        offered = ["realtime", f"openai-insecure-api-key.{later}"]
        assert (await refused(realtime(server), subprotocols=offered))[0] == 401  # expired
        monkeypatch.undo()
        fresh = (await http.post(mint, headers=BEARER)).json()  # the default lifetime
        assert fresh["expires_at"] - now >= 590
        fresh_offer = ["realtime", f"openai-insecure-api-key.{fresh['value']}"]
        await opens_a_session(realtime(server), subprotocols=fresh_offer)


async def test_cross_origin_browsers_are_refused_listed_and_own_origin_pass() -> None:
    listed = {"server.allowed_origins": ["https://app.example"]}
    async with running_server(**listed) as server, httpx.AsyncClient() as http:
        for url in (server.url, realtime(server)):
            status, body = await refused(url, origin="http://evil.example")
            assert status == 403 and body["error"]["code"] == "origin_not_allowed"
        evil = await http.get(server.http + "/health", headers={"Origin": "http://evil.example"})
        assert evil.status_code == 403
        await opens_a_session(realtime(server), origin="https://app.example")
        await opens_a_session(realtime(server), origin=server.http)  # the page served here
        await opens_a_session(realtime(server))  # not a browser: no Origin


async def test_dns_rebinding_host_is_refused_on_loopback() -> None:
    async with running_server(**{"server.allowed_hosts": ["duplex.test"]}) as server:
        port = server.http.rsplit(":", 1)[1]
        async with httpx.AsyncClient() as http:
            rebound = {"Host": f"attacker.example:{port}"}
            answer = await http.get(server.http + "/health", headers=rebound)
            assert (
                answer.status_code == 421 and answer.json()["error"]["code"] == "host_not_allowed"
            )
            for host in (f"localhost:{port}", f"duplex.test:{port}", f"127.0.0.1:{port}"):
                ok = await http.get(server.http + "/health", headers={"Host": host})
                assert ok.status_code == 200


def resume(created: dict[str, Any], token: str) -> dict[str, Any]:
    return {
        "type": "session.resume",
        "session_id": created["session"]["id"],
        "resume_token": token,
        "last_received_server_event_seq": 0,
    }


async def refused_error(server: Server, event: dict[str, Any]) -> dict[str, Any]:
    """The error event of a refused ``session.resume``; the socket is closed 1008."""
    async with connect(server.url, max_queue=None) as ws:
        c = Client(ws)
        await c.send(event)
        error = await c.until("error")
        with pytest.raises(ConnectionClosed) as closed:
            await c.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        return error


async def refused_resume(server: Server, event: dict[str, Any]) -> str:
    """The error code of a refused ``session.resume``."""
    return str((await refused_error(server, event))["error"]["code"])


async def test_a_wrong_token_reads_as_an_unknown_id(workers: Layout) -> None:
    """A prober learns nothing from a refused resume: a live session's id with a wrong
    token gets, word for word but the id, what an id that no session has gets."""
    async with running_server(**workers) as server:
        async with connect(server.url, max_queue=None) as ws:
            c = Client(ws)
            await c.send({"type": "session.create", "session": {}})
            created = await c.until("session.created")
            await c.send({"type": "session.update", "session": {}})  # a used session waits
            await c.until("session.updated")
        live = created["session"]["id"]
        wrong = await refused_error(server, resume(created, "guess"))
        nobody = live[:-8] + "00000000"
        unknown = await refused_error(server, {**resume(created, "guess"), "session_id": nobody})
        assert wrong["error"]["code"] == "session_resume_expired"
        said, told = json.dumps(wrong["error"]), json.dumps(unknown["error"])
        assert said.replace(live, "ID") == told.replace(nobody, "ID")


async def test_resume_guessing_is_rate_limited_then_recovers(workers: Layout) -> None:
    limits = {"server.auth_failure_burst": 3, "server.auth_failure_window_s": 1.5}
    async with running_server(**limits, **workers) as server:
        async with connect(server.url, max_queue=None) as ws:
            c = Client(ws)
            await c.send({"type": "session.create", "event_id": "c1", "session": {}})
            created = await c.until("session.created")
            await c.send({"type": "session.update", "session": {}})  # a used session waits
            await c.until("session.updated")  # for its resume (one that heard nothing ends)
        for guess in ("guess-1", "guess-2", "guess-3"):  # the same refusal as an unknown id
            assert await refused_resume(server, resume(created, guess)) == "session_resume_expired"
        right = resume(created, created["resume_token"])
        assert await refused_resume(server, right) == "rate_limited"  # even the right token
        await trio.sleep(1.6)  # the budget refills
        async with connect(server.url, max_queue=None) as ws:
            c = Client(ws)
            await c.send(right)
            assert (await c.recv())["type"] == "session.resumed"
        # unknown ids count per peer as well
        unknown = {**right, "session_id": "sess_" + "0" * 24}
        for _ in range(3):
            assert await refused_resume(server, unknown) == "session_resume_expired"
        other = {**unknown, "session_id": "sess_" + "1" * 24}
        assert await refused_resume(server, other) == "rate_limited"
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(server.http + "/metrics")).text
        assert "duplex_resume_rate_limited_total 2" in metrics


async def test_a_public_bind_serves_open_when_the_operator_says_so() -> None:
    public = {"server.host": "0.0.0.0", "server.allow_unauthenticated": True}
    async with running_server(**public) as server, httpx.AsyncClient() as http:
        port = server.http.rsplit(":", 1)[1]
        answer = await http.get(f"http://127.0.0.1:{port}/health", headers={"Host": "x.example"})
        assert answer.status_code == 200  # no host list on a public bind: any name


def self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_tls_serves_https_and_wss(tmp_path: Path, workers: Layout) -> None:
    cert, key = self_signed(tmp_path)
    tls = {"server.tls_certfile": str(cert), "server.tls_keyfile": str(key)}
    trust = ssl.create_default_context(cafile=str(cert))
    async with running_server(**tls, **KEYED, **workers) as server:
        assert server.http.startswith("https://")
        async with httpx.AsyncClient(verify=trust) as http:
            assert (await http.get(server.http + "/health", headers=BEARER)).status_code == 200
            assert (await http.get(server.http + "/health")).status_code == 401
        wss = server.http.replace("https://", "wss://") + "/v1/realtime"
        await opens_a_session(wss, ssl=trust, additional_headers=BEARER)
        with pytest.raises(trio.BrokenResourceError):  # a client that does not trust it
            async with connect(wss, additional_headers=BEARER):
                pass  # pragma: no cover


async def test_a_plain_get_on_a_websocket_route_is_426(workers: Layout) -> None:
    async with running_server(**workers) as server, httpx.AsyncClient() as http:
        for path in ("/v1/duplex", "/v1/realtime"):
            answer = await http.get(server.http + path)
            assert answer.status_code == 426
            assert answer.headers["upgrade"] == "websocket"
            assert answer.headers["content-type"].startswith("application/json")
            error = answer.json()["error"]
            assert error["code"] == "upgrade_required" and error["type"] == "invalid_request_error"
            assert path in error["message"]
        # and the WebSocket on the same path still opens
        assert await opens_a_session(realtime(server))


async def test_access_refusals_are_logged_rate_limited_without_the_credential() -> None:
    wrong = "sk-duplex-" + "w" * 24
    with capture_logs() as logs:
        async with running_server(**KEYED) as server, httpx.AsyncClient() as http:
            for _ in range(3):
                answer = await http.get(
                    server.http + "/health", headers={"Authorization": f"Bearer {wrong}"}
                )
                assert answer.status_code == 401
            assert (
                await refused(
                    server.url, additional_headers=BEARER | {"Origin": "https://x.example"}
                )
            )[0] == 403
    lines = [line for line in logs if line["event"] == "access refused"]
    assert [(line["code"], line["kind"], line["status"]) for line in lines] == [
        ("invalid_api_key", "http", 401),  # the next two within 10 s are only counted
        ("origin_not_allowed", "websocket", 403),
    ]
    assert lines[0]["log_level"] == "warning" and lines[0]["path"] == "/health"
    assert lines[0]["peer"] == "127.0.0.1" and lines[0]["unlogged_since_last"] == 0
    text = json.dumps(logs, default=repr)
    assert wrong not in text and KEY not in text
