"""End to end over real sockets: hypercorn + actors + loopback engine, websockets client."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
import trio
from websockets.exceptions import ConnectionClosed

from duplex.runtime._actor import Inspect
from duplex.sessions import SessionMachine, SessionState

from .wsclient import FRAME, Client, Server, client, running_server, silence, tone

MODEL = {"session.overlap_policy": "model"}
Layout = dict[str, object]


LAYOUTS: dict[str, Layout] = {
    "one-process": {},
    "two-workers": {"server.connection_workers": 2},
    "engine-process": {"server.engine_process": "on"},
}


@pytest.fixture(params=list(LAYOUTS))
def workers(request: pytest.FixtureRequest) -> Layout:
    """Every test runs on each layout: sockets and the engine in this process, sockets in two
    connection workers, or the engine in its own process."""
    return LAYOUTS[request.param]


def resume(created: dict, cursor: int) -> dict:
    """``session.resume`` for the session ``created`` describes, after ``cursor``."""
    return {
        "type": "session.resume",
        "session_id": created["session"]["id"],
        "resume_token": created["resume_token"],
        "last_received_server_event_seq": cursor,
    }


async def wait_detached(server: Server, session_id: str) -> SessionMachine:
    """The session's machine once it has seen its socket go (this process's sessions)."""
    ref = server.system.lookup(session_id)
    assert ref is not None
    with trio.fail_after(10):
        while True:
            machine: SessionMachine = await ref.ask(Inspect(), timeout=10)
            if machine.state is SessionState.DETACHED:
                return machine
            await trio.sleep(0.01)


async def open_session(c: Client, **session: object) -> dict:
    await c.send({"type": "session.create", "event_id": "create-1", "session": session})
    created = await c.recv()
    assert created["type"] == "session.created"
    return created


async def use_session(c: Client) -> None:
    """One client event, so the session waits for a resume when its socket drops (one that
    heard nothing from its client ends with the socket)."""
    await c.send({"type": "session.update", "event_id": "use-1", "session": {}})
    await c.until("session.updated")


async def test_stream_echo_response_lifecycle(workers: Layout) -> None:
    async with running_server(**MODEL, **workers) as server, client(server) as c:
        created = await open_session(c)
        caps = created["session"]["capabilities"]
        assert caps["chunk_period_ms"] == 80 and caps["supports_session_resume"] is True
        spoken = tone(10)
        # sent ahead of real time: the engine queues it, so no tick underruns under load
        await c.stream(spoken + silence(8), realtime=False)
        done = await c.until("response.done")
        assert done["response"]["status"] == "completed"
        kinds = [e["type"] for e in c.events]
        assert kinds.index("response.created") < kinds.index("response.audio.delta")
        assert kinds.count("response.created") == 1 and kinds.count("response.done") == 1
        audio = b"".join(base64.b64decode(e["delta"]) for e in c.of("response.audio.delta"))
        # the loopback echoes exactly what was said (the speaking frames)
        assert audio == spoken
        text = "".join(e["delta"] for e in c.of("response.audio_transcript.delta"))
        assert text and done["response"]["output"][0]["transcript"] == text
        seqs = [e["server_event_seq"] for e in c.events if e["server_event_seq"] is not None]
        assert seqs == list(range(1, len(seqs) + 1))


BAD_FRAMES = [
    ("not json", "invalid_json"),
    (json.dumps({"type": "no.such.event", "event_id": "e1"}), "unknown_event"),
    (json.dumps({"type": "input_audio_buffer.append", "event_id": "e1"}), "bad_event"),
    (
        json.dumps({"type": "input_audio_buffer.append", "audio": "%%%", "event_id": "e1"}),
        "bad_audio",
    ),
    (
        json.dumps(
            {"type": "input_audio_buffer.append", "audio": "AAAA", "sample_rate": 11025,
             "event_id": "e1"}
        ),
        "unsupported_audio_format",
    ),
    (b"\x00\x01binary", "binary_frame_unsupported"),
    ("x" * 70_000, "event_too_large"),
    (json.dumps({"type": "response.cancel", "event_id": "e1"}), "response_not_active"),
]  # fmt: skip
"""Each bad frame and the error code it gets."""


async def test_bad_input_gets_one_typed_error_and_the_session_stays_usable(
    workers: Layout,
) -> None:
    """Every bad frame in turn on one session (one server a layout: a server each took 2-4 s
    of the suite): each gets exactly one typed error, and the audio sent before it is not
    lost (it commits)."""
    limit = {"server.max_frame_bytes": 65536}
    async with running_server(**MODEL, **limit, **workers) as server, client(server) as c:
        await open_session(c)
        for n, (frame, code) in enumerate(BAD_FRAMES, 1):
            await c.stream(tone(2), realtime=False)
            await c.send(frame)
            error = await c.until("error")
            assert error["error"]["code"] == code, (code, error)
            if code not in ("invalid_json", "binary_frame_unsupported", "event_too_large"):
                assert error["error"]["event_id"] == "e1"
            # still usable, and the earlier input was not lost: it is committed
            await c.send({"type": "input_audio_buffer.commit", "event_id": f"c{n}"})
            committed = await c.until("input_audio_buffer.committed")
            assert committed["type"] == "input_audio_buffer.committed"
            # answered before the next (past 4 unanswered turns a commit is refused)
            await c.until("response.done", timeout=10)
            assert len(c.of("error")) == n, (code, c.of("error"))


async def test_disconnect_mid_response_then_resume_replays_in_order(workers: Layout) -> None:
    async with running_server(**MODEL, **workers) as server:
        async with client(server) as c:
            created = await open_session(c)
            await c.stream(tone(12), realtime=False)
            await c.until("response.audio.delta")
            cursor = max(e["server_event_seq"] or 0 for e in c.events)
        # dropped mid-response; the session keeps going while we are away
        machine = await wait_detached(server, created["session"]["id"])
        away = machine.statistics().journal.last_seq
        with trio.fail_after(10):
            while machine.statistics().journal.last_seq == away:
                await trio.sleep(0.01)
        async with client(server) as c2:
            await c2.send(resume(created, cursor))
            resumed = await c2.recv()
            assert resumed["type"] == "session.resumed"
            assert resumed["replay_count"] > away - cursor  # with what came while away
            assert resumed["resume_token"] != created["resume_token"]  # rotated
            await c2.stream(silence(6), realtime=False)
            done = await c2.until("response.done")
            replayed = [e["server_event_seq"] for e in c2.events[1:] if e["server_event_seq"]]
            assert replayed[0] == cursor + 1
            assert replayed == list(range(cursor + 1, cursor + 1 + len(replayed)))
            assert done["response"]["status"] == "completed"
            # nothing was lost: all the echoed audio arrived across both sockets
            audio = [e for e in c.events + c2.events if e["type"] == "response.audio.delta"]
            assert sum(len(base64.b64decode(e["delta"])) for e in audio) == 12 * 2 * FRAME


async def test_takeover_replaces_the_old_socket(workers: Layout) -> None:
    async with running_server(**MODEL, **workers) as server, client(server) as old:
        created = await open_session(old)
        async with client(server) as new:
            await new.send(resume(created, 0))
            assert (await new.recv())["type"] == "session.resumed"
            replaced = await old.until("session.replaced")
            assert replaced["type"] == "session.replaced"
            with pytest.raises(ConnectionClosed) as closed:
                await old.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001
            # the old token is spent: resuming with it fails
        async with client(server) as third:
            await third.send(resume(created, 0))
            error = await third.until("error")
            assert error["error"]["code"] == "session_resume_expired"


async def test_admission_limit_closes_with_1013_and_capacity_returns(workers: Layout) -> None:
    async with running_server(**{"server.max_sessions": 1}, **workers) as server:
        async with client(server) as first:
            await open_session(first)
            async with client(server) as second:
                await second.send({"type": "session.create", "event_id": "x"})
                error = await second.recv()
                assert error["error"]["code"] == "resource_exhausted"
                assert error["error"]["type"] == "rate_limit_error"
                with pytest.raises(ConnectionClosed) as closed:
                    await second.recv()
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            await first.send({"type": "session.close"})
            await first.until("session.closed")
        with trio.fail_after(5):
            while True:  # capacity returns once the slot is actually released
                async with httpx.AsyncClient() as http:
                    health = (await http.get(server.http + "/health")).json()
                if health["sessions"]["live"] == 0:
                    break
                await trio.sleep(0.05)
        async with client(server) as third:
            await open_session(third)


async def test_disconnect_grace_expires_the_session(workers: Layout) -> None:
    grace = 0.3
    async with running_server(**{"session.disconnect_grace_s": grace}, **workers) as server:
        async with client(server) as c:
            created = await open_session(c)
            await use_session(c)
            session_id = created["session"]["id"]
            assert server.system.lookup(session_id) is not None
            left = trio.current_time()  # the session's grace starts after this
        with trio.fail_after(10):  # wait for the expiry itself, not a guess at its time
            while server.system.lookup(session_id) is not None:
                await trio.sleep(0.01)
        assert trio.current_time() - left >= grace  # and not before the grace ran out
        async with client(server) as c2:
            await c2.send(resume(created, 0))
            error = await c2.recv()
            assert error["error"]["code"] == "session_resume_expired"
            with pytest.raises(ConnectionClosed):
                await c2.recv()
        assert server.system.lookup(created["session"]["id"]) is None


async def test_client_barge_in_cancels_the_response(workers: Layout) -> None:
    async with running_server(**MODEL, **workers) as server, client(server) as c:
        await open_session(c)
        await c.stream(tone(15), realtime=False)
        first = await c.until("response.audio.delta")
        await c.send({"type": "turn.signal", "event": "barge_in", "event_id": "b1"})
        done = await c.until("response.done")
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "barge_in"
        epoch = first["epoch"]
        await c.stream(silence(5))
        with trio.move_on_after(0.5):
            while True:  # fenced: nothing of the cancelled response's epoch comes after it
                e = await c.recv()
                assert e["type"] != "response.audio.delta" or e["epoch"] > epoch


async def test_video_frames_reach_the_model(workers: Layout) -> None:
    async with running_server(**MODEL, **workers) as server, client(server) as c:
        await open_session(c)
        jpeg = base64.b64encode(b"\xff\xd8\xff\xe0fakejpeg").decode()
        for i in range(3):
            await c.send(
                {"type": "input_video.append", "frame": jpeg, "pts_ms": 40 * i,
                 "frame_id": f"f{i}"}
            )  # fmt: skip
        await c.stream(silence(3))
        consumed = await c.until("input_video.consumed")
        ids = list(consumed["frame_ids"])
        while ids != ["f0", "f1", "f2"][: len(ids)] or len(ids) < 3:
            ids += (await c.until("input_video.consumed"))["frame_ids"]
        assert ids == ["f0", "f1", "f2"]


async def test_http_routes(workers: Layout) -> None:
    async with running_server(**workers) as server, httpx.AsyncClient() as http:
        health = await http.get(server.http + "/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        models = (await http.get(server.http + "/v1/models")).json()
        assert models["data"][0]["id"] == "loopback"
        metrics = await http.get(server.http + "/metrics")
        assert metrics.headers["content-type"].startswith("text/plain")
        assert "duplex_sessions_live 0" in metrics.text
        assert 'duplex_engine_capacity_slots{model="loopback"} 256' in metrics.text


async def test_shutdown_closes_open_sockets_with_1001(workers: Layout) -> None:
    async with running_server(**workers) as server, client(server) as c:
        await open_session(c)
        server.system.request_shutdown()
        with trio.fail_after(2), pytest.raises(ConnectionClosed) as closed:
            while True:
                await c.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001


async def test_a_socket_that_opens_no_session_in_time_is_closed(workers: Layout) -> None:
    async with running_server(**{"server.first_event_timeout_s": 0.5}, **workers) as server:
        async with client(server) as idle:
            err = await idle.recv(timeout=5.0)
            assert (err["type"], err["error"]["code"]) == ("error", "first_event_timeout")
            with pytest.raises(ConnectionClosed) as closed:
                await idle.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        async with client(server) as prompt:  # a session opened in time is never timed out
            await prompt.send({"type": "session.create", "session": {}})
            assert (await prompt.recv())["type"] == "session.created"
            await trio.sleep(1.0)  # the thing under test: twice the timeout, still open
            await prompt.send({"type": "session.close"})
            await prompt.until("session.closed")
