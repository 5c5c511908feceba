"""The ingress against real duplex servers, with a table given by the test (no Ray)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import openai
import pytest
import trio
from openai import AsyncOpenAI
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

from duplex.cluster import Ingress, NodeReport, NodeState, serve_ingress

from ..transport.test_e2e_duplex import open_session
from ..transport.test_e2e_workers import echo
from ..transport.wsclient import Client, Server, running_server, tone


class Table:
    """A node table the test writes."""

    def __init__(self) -> None:
        self.reports: list[NodeReport] = []

    async def nodes(self) -> list[NodeReport]:
        return list(self.reports)


@asynccontextmanager
async def ingress_at(table: Table) -> AsyncIterator[tuple[Ingress, str]]:
    ingress = Ingress(table, refresh_s=0.05)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_ingress, ingress, "127.0.0.1", 0)
        try:
            yield ingress, url
        finally:
            nursery.cancel_scope.cancel()
            await ingress.aclose()


def node(
    name: str, server: Server, *, live: int = 0, capacity: int = 8, seq: int = 1
) -> NodeReport:
    return NodeReport(name, server.http, NodeState.SERVING, live, capacity, 0.0, seq)


@asynccontextmanager
async def one_node(
    *more: NodeReport,
) -> AsyncIterator[tuple[Table, Server, Ingress, str]]:
    """A server named ``a1``, in a table (with ``more`` reports) an ingress reads."""
    table = Table()
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(running_server(**{"server.node_name": "a1"}))
        table.reports = [node("a1", server), *more]
        ingress, url = await stack.enter_async_context(ingress_at(table))
        await ingress.refreshed.wait()
        yield table, server, ingress, url


async def test_a_session_through_the_ingress_echoes_and_carries_its_node() -> None:
    async with AsyncExitStack() as stack:
        _table, _server, _ingress, url = await stack.enter_async_context(one_node())
        ws = await stack.enter_async_context(connect(url.replace("http", "ws") + "/v1/duplex"))
        c = Client(ws)
        created = await open_session(c)
        assert created["session"]["id"].startswith("duplex-na1-")
        await echo(c, tone(4))
        async with httpx.AsyncClient() as http:
            health = (await http.get(url + "/health")).json()
        assert health["sessions"] == {"live": 0, "capacity": 8}  # as the table says
        assert [n["node"] for n in health["nodes"]] == ["a1"]
        async with httpx.AsyncClient() as http:
            text = (await http.get(url + "/metrics")).text
        for line in (
            'duplex_cluster_placed_total{node="a1"} 1',
            'duplex_cluster_node_capacity_sessions{node="a1"} 8',
            'duplex_cluster_node_refused_total{node="a1"} 0',
            "duplex_cluster_sessions_capacity 8",
            'duplex_cluster_nodes{state="serving"} 1',
        ):
            assert f"\n{line}" in text, line
        # it faces clients as a server does: its connection cap is there too
        assert re.search(r"^duplex_http_connections_limit \d+$", text, re.M)


async def test_http_is_routed_by_the_id_it_names_and_refused_when_none_can_take_it() -> None:
    async with AsyncExitStack() as stack:
        table, server, ingress, url = await stack.enter_async_context(one_node())
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=10))
        models = await http.get(url + "/v1/models")  # names nothing: a node with room
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "loopback"
        # a video id named for a1 reaches a1 unwrapped: a1 answers for its own id
        reply = await http.get(url + "/v1/videos/video_na1-0123abcd")
        assert reply.status_code == 404 and "video_0123abcd" in reply.text
        # one naming a node the cluster does not have: 404 here, no node asked
        reply = await http.get(url + "/v1/videos/video_nzz-0123abcd")
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"
        # every node full: 503 with Retry-After, and room that comes back is used again
        table.reports = [node("a1", server, live=8, capacity=8, seq=2)]
        await wait_refreshed(ingress, "a1", 0)
        reply = await http.get(url + "/v1/models")
        assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
        table.reports = [node("a1", server, live=7, capacity=8, seq=3)]
        await wait_refreshed(ingress, "a1", 1)
        assert (await http.get(url + "/v1/models")).status_code == 200


SPEECH = "/v1/audio/speech"


async def test_http_bodies_stream_through_both_ways() -> None:
    """The ingress holds no body whole: a binary answer (speech audio) reaches the client as
    the node sends it, whole and with its length; an upload streams on to the node, whose own
    limit refuses one too large (413) while it arrives: the client, which sends its whole
    body before it reads, gets that answer, and the next request is served."""
    async with AsyncExitStack() as stack:
        _table, _server, _ingress, url = await stack.enter_async_context(one_node())
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
        request = {"input": "One. Two.", "response_format": "wav"}
        relayed = await http.post(url + SPEECH, json=request)
        assert relayed.status_code == 200 and relayed.headers["content-type"] == "audio/wav"
        wav = relayed.content  # whole: its RIFF size and the length passed on agree with it
        assert wav[:4] == b"RIFF" and int.from_bytes(wav[4:8], "little") + 8 == len(wav) > 1000
        assert relayed.headers["content-length"] == str(len(wav))

        streamed = {"input": "One. Two. Three.", "stream": True, "response_format": "pcm"}
        async with http.stream("POST", url + SPEECH, json=streamed) as answer:
            assert answer.status_code == 200 and "content-length" not in answer.headers
            parts = [part async for part in answer.aiter_raw()]
        assert len(parts) >= 2 and sum(map(len, parts)) % 2 == 0  # a sentence at a time

        # OpenAI's client, unchanged, through the ingress: streamed audio, and a refusal
        sdk = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        async with sdk.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input="One. Two.", response_format="pcm"
        ) as spoken:
            pcm = b"".join([part async for part in spoken.iter_bytes()])
        assert len(pcm) > 1000 and len(pcm) % 2 == 0
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.audio.speech.create(model="tts-1", voice="nobody", input="x")  # type: ignore[arg-type]
        assert refused.value.body["param"] == "voice"  # type: ignore[index]
        await sdk.close()

        async def upload() -> AsyncIterator[bytes]:
            for _ in range(64):  # 4 MiB, twice the speech route's limit
                yield b" " * 65536

        too_big = await http.post(
            url + SPEECH, content=upload(), headers={"content-type": "application/json"}
        )
        assert too_big.status_code == 413
        assert too_big.json()["error"]["code"] == "body_too_large"
        assert (await http.post(url + SPEECH, json=request)).status_code == 200


async def test_a_client_that_leaves_mid_upload_costs_nothing() -> None:
    """A body cut off by its client (half sent, then the socket closed) ends that request
    on the node too; the ingress counts no connection error and serves on."""
    async with AsyncExitStack() as stack:
        _table, _server, _ingress, url = await stack.enter_async_context(one_node())
        host, port = url.removeprefix("http://").split(":")
        for _ in range(3):
            stream = await trio.open_tcp_stream(host, int(port))
            head = (
                f"POST {SPEECH} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                "content-length: 100000\r\n\r\n"
            )
            await stream.send_all(head.encode() + b'{"input": "' + b"a" * 5000)
            await trio.sleep(0.2)  # the ingress has opened its request to the node
            await stream.aclose()
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.get(url + "/health")).status_code == 200
            text = (await http.get(url + "/metrics")).text
            speech = {"input": "Still here.", "response_format": "wav"}
            assert (await http.post(url + SPEECH, json=speech)).status_code == 200
        assert not re.search(r"^duplex_http_connection_errors_total\{.*\} [1-9]", text, re.M)


async def wait_refreshed(ingress: Ingress, name: str, room: int) -> None:
    with trio.fail_after(5):
        while ingress.placement.room(name) != room:
            await trio.sleep(0.01)


async def test_a_resume_naming_no_serving_node_expires_like_one_server() -> None:
    gone = NodeReport("b2", "http://127.0.0.1:9", NodeState.GONE, 0, 0)
    async with AsyncExitStack() as stack:
        _table, _server, _ingress, url = await stack.enter_async_context(one_node(gone))
        for session_id in ("duplex-nb2-" + "0" * 32, "duplex-" + "0" * 32):
            ws = await stack.enter_async_context(connect(url.replace("http", "ws") + "/v1/duplex"))
            c = Client(ws)
            await c.send({"type": "session.resume", "session_id": session_id, "resume_token": "x",
                          "last_received_server_event_seq": 0})  # fmt: skip
            error = await c.recv()
            assert error["error"]["code"] == "session_resume_expired"
            with trio.fail_after(5):
                try:
                    await ws.recv()
                except ConnectionClosed as closed:
                    assert closed.rcvd is not None and closed.rcvd.code == 1008
        # a resume of a session the node does not know: the node's own answer, relayed
        ws = await stack.enter_async_context(connect(url.replace("http", "ws") + "/v1/duplex"))
        c = Client(ws)
        await c.send({"type": "session.resume", "session_id": "duplex-na1-" + "0" * 32,
                      "resume_token": "x", "last_received_server_event_seq": 0})  # fmt: skip
        assert (await c.recv())["error"]["code"] == "session_resume_expired"
