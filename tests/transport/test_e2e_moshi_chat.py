"""``/api/chat`` and ``/v1/audio/duplex`` end to end, over a real socket on the loopback.

The peer is Kyutai's own Ogg/Opus (``sphn``): it encodes what the server decodes and
decodes what the server sends.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

from .chatclient import ChatClient, chat, chat_url, loud_frames_hz, tone_f32
from .wsclient import FRAME, Server, running_server

LOOPBACK = {"server.model": "loopback"}


async def _talk(server: Server, hz: float, results: dict[float, ChatClient]) -> None:
    async with chat(server) as c:
        await c.send_pcm(tone_f32(2, hz))  # before the handshake: decoded, discarded
        await c.until(0)  # the handshake
        assert c.kinds.count(0) == 1
        for frame in range(25):  # 2 s at the microphone's pace
            await c.send_pcm(tone_f32(1, hz, start=frame))
            await trio.sleep(0.08)
        with trio.move_on_after(1.0):
            while True:
                await c.recv()
        results[hz] = c


async def test_concurrent_conversations_each_hear_only_their_own_audio() -> None:
    results: dict[float, ChatClient] = {}
    tones = (300.0, 700.0, 1500.0)
    async with running_server(**LOOPBACK) as server, trio.open_nursery() as nursery:
        for hz in tones:
            nursery.start_soon(_talk, server, hz, results)
    for hz, c in results.items():
        assert not c.errors
        assert set(c.kinds) <= {0, 1, 2}  # only kinds the web client decodes
        audio = c.audio()
        assert len(audio) >= 20 * FRAME  # a continuous stream: echo and silence
        heard = loud_frames_hz(audio)
        assert len(heard) >= 10
        assert all(abs(f - hz) < 40 for f in heard), heard  # its own tone, no other
        assert any(t.startswith("[") for t in c.text)  # the loopback's text marks


async def test_silence_from_the_model_still_streams_audio() -> None:
    async with running_server(**LOOPBACK) as server, chat(server) as c:
        await c.until(0)
        before = c.samples
        with trio.move_on_after(1.2):  # the client says nothing; the echo is silent
            while True:
                await c.recv()
        got = c.samples - before
        assert 8 * FRAME <= got <= 16 * FRAME  # about real time, less the clock's slack
        assert not np.any(np.abs(c.audio()) > 0.01)


async def test_sphn_decodes_every_frame_exactly() -> None:
    async with running_server(**LOOPBACK) as server, chat(server) as c:
        await c.until(0)
        for frame in range(10):
            await c.send_pcm(tone_f32(1, 440.0, start=frame))
        while c.samples < 12 * FRAME:
            await c.recv()
        assert all(len(p) % 960 == 0 for p in c.pcm)  # whole 40 ms packets, none held back


async def test_the_peer_leaving_frees_the_slot_at_once() -> None:
    async with running_server(**LOOPBACK, **{"server.max_sessions": 1}) as server:
        for _ in range(3):  # one slot, three conversations in a row
            async with chat(server) as c:
                await c.until(0)
                await c.send_pcm(tone_f32(1, 440.0))


async def test_capacity_full_closes_1013_then_recovers() -> None:
    async with running_server(**LOOPBACK, **{"server.max_sessions": 1}) as server:
        async with chat(server) as first:
            await first.until(0)
            async with chat(server) as second:
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await second.recv()
                assert second.errors and second.errors[0].startswith("resource_exhausted")
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
                assert closed.value.rcvd.reason == "resource_exhausted"
        async with chat(server) as third:
            await third.until(0)


async def _until_metric(server: Server, sample: str) -> None:
    """Until ``/metrics`` has the line ``sample`` (a metric and its value)."""
    async with httpx.AsyncClient() as http:
        with trio.fail_after(10):
            while f"\n{sample}\n" not in (await http.get(server.http + "/metrics")).text:
                await trio.sleep(0.02)


async def _until_waiting(server: Server, count: int) -> None:
    """Until the server's wait queue holds ``count`` sockets: a socket opened after this one
    is seen after it (a worker relays opens concurrently, so a later open could pass it)."""
    await _until_metric(server, f"duplex_chat_queue_waiting {count}")


async def _closed_with(c: ChatClient) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await c.recv()
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


@pytest.mark.parametrize("workers", [0, 1])
async def test_a_full_server_holds_a_waiter_until_a_slot_frees_and_refuses_past_its_queue(
    workers: int,
) -> None:
    overrides = {
        "server.connection_workers": workers,  # 1: the socket lives in a worker process
        "server.max_sessions": 1,
        "server.chat_wait_queue": 1,
        # a waiter owes no event: it is not closed (2 s: the admitted client's first event
        # must arrive within it, a round trip through the worker on a loaded machine)
        "server.first_event_timeout_s": 2.0,
    }
    async with running_server(**LOOPBACK, **overrides) as server:
        async with chat(server) as first:
            await first.until(0)
            await first.send_pcm(tone_f32(1, 440.0))  # its first event, at once
            async with chat(server) as second:
                await second.send_pcm(tone_f32(2, 300.0))  # as moshi.client: it streams at once
                await _until_waiting(server, 1)
                queued = trio.current_time()
                async with chat(server) as third:  # the queue holds one: 1013 at once
                    assert await _closed_with(third) == (1013, "resource_exhausted")
                    assert third.kinds == [5] and "waiting" in third.errors[0]
                for frame in range(1, 36):  # first talks for about 3 s, past the timeout
                    await first.send_pcm(tone_f32(1, 440.0, start=frame))
                    await first.recv()
                assert trio.current_time() - queued > 2.0  # the waiter outlasted the timeout
                await first.ws.aclose()  # the slot frees: second gets its handshake
                await second.until(0)
                assert second.kinds == [0]  # nothing before it: no stray kind for the web UI
                for frame in range(8):
                    await second.send_pcm(tone_f32(1, 900.0, start=frame))
                while second.samples < 10 * FRAME:
                    await second.recv()
                assert 900.0 in [round(hz, -2) for hz in loud_frames_hz(second.audio())]
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(server.http + "/metrics")).text
        for name, value in (("admitted_total", 1), ("refused_total", 1), ("waiting", 0)):
            assert f"\nduplex_chat_queue_{name} {value}\n" in metrics, metrics


async def test_a_waiter_that_leaves_frees_its_place_in_the_queue() -> None:
    overrides = {"server.max_sessions": 1, "server.chat_wait_queue": 1}
    async with running_server(**LOOPBACK, **overrides) as server, chat(server) as first:
        await first.until(0)
        async with chat(server) as second:
            await _until_waiting(server, 1)
            async with chat(server) as third:
                assert await _closed_with(third) == (1013, "resource_exhausted")
            await second.ws.aclose()
        await _until_metric(server, "duplex_chat_queue_left_total 1")  # gone: the place is free
        async with chat(server) as fourth:
            await fourth.send_pcm(tone_f32(1, 300.0))
            await first.ws.aclose()
            await fourth.until(0)


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (b"\x01OggS" + b"\x00" * 40, 1007),  # a broken page
        (b"\x09hello", 1003),  # a kind no client sends
        (b"", 1008),  # no kind
        ("a text frame", 1003),
    ],
)
async def test_bad_input_is_one_error_frame_then_a_close(message: bytes | str, code: int) -> None:
    async with running_server(**LOOPBACK) as server, chat(server) as c:
        await c.until(0)
        await c.ws.send(b"\x03\x00")  # the web client's control byte: ignored
        await c.ws.send(message)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await c.recv()
        assert len(c.errors) == 1
        assert closed.value.rcvd is not None and closed.value.rcvd.code == code
        async with chat(server) as again:  # the server is fine
            await again.until(0)


@pytest.mark.parametrize("workers", [0, 1])
async def test_a_conversation_closed_for_bad_input_frees_its_slot_at_once(workers: int) -> None:
    """The server closing the socket ends the conversation as the peer leaving does (found
    by bench/fuzz_endpoints.py: the session stayed live, holding its engine slot, until
    its idle timeout, so bad frames could fill every slot)."""
    layout = {"server.max_sessions": 1, "server.connection_workers": workers}
    async with running_server(**LOOPBACK, **layout) as server:
        for bad in (b"\x09hello", b"\x01OggS" + b"\x00" * 40, b""):  # one slot, in a row
            async with chat(server) as c:
                await c.until(0)
                await c.ws.send(bad)
                with pytest.raises(ConnectionClosed):
                    while True:
                        await c.recv()
        async with chat(server) as again:
            await again.until(0)


async def test_a_prompt_on_a_model_without_prompts_is_refused_cleanly() -> None:
    async with running_server(**LOOPBACK) as server, chat(server, "text_prompt=hi") as c:
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await c.recv()
        assert c.kinds == [5] and "unsupported_parameter" in c.errors[0]
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_a_malformed_sampling_parameter_is_refused() -> None:
    async with running_server(**LOOPBACK) as server:
        async with chat(server, "text_temperature=hot&text_topk=25") as c:
            with pytest.raises(ConnectionClosed) as closed:
                await c.recv()
                await c.recv()
            assert "text_temperature" in c.errors[0]
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        query = "text_temperature=0.7&text_topk=25&audio_temperature=0.8&audio_topk=250"
        async with chat(server, query + "&pad_mult=0&worker_auth_id=x") as c:
            await c.until(0)  # the web client's defaults are accepted


async def test_tiny_personaplex_handshakes_after_its_prompt(tmp_path: Path) -> None:
    from duplex.models.moshi._checkpoint import build_tiny_checkpoint

    folder = tmp_path / "plex"
    build_tiny_checkpoint(folder, seed=0, preset="tiny-personaplex")
    overrides = {
        "server.model": f"tiny-personaplex:{folder}",
        "server.model_cache_dir": str(tmp_path),
    }
    async with running_server(**overrides) as server:
        async with chat(server, "text_prompt=You%20are%20a%20small%20robot.") as c:
            await c.send_pcm(tone_f32(3, 440.0))  # during the replay: discarded
            await c.until(0, timeout=60.0)
            for frame in range(6):
                await c.send_pcm(tone_f32(1, 440.0, start=frame))
            while c.samples < 4 * FRAME:
                await c.recv(timeout=30.0)
        async with chat(server, "voice_prompt=nobody.pt") as c:
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await c.recv(timeout=30.0)
            assert c.kinds == [5] and "voice" in c.errors[0].lower()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_tiny_moshi_concurrent_chats(tmp_path: Path) -> None:
    overrides = {"server.model": "tiny", "server.model_cache_dir": str(tmp_path)}
    done: list[int] = []
    async with running_server(**overrides) as server:

        async def one(hz: float) -> None:
            # the web client's parameters, different per chat: applied, never refused
            query = (
                f"text_temperature={hz / 2000}&text_topk={int(hz) // 100}&audio_temperature=0.8"
                f"&audio_topk=250&pad_mult=0&text_seed={int(hz)}&audio_seed=7"
                "&repetition_penalty_context=64&repetition_penalty=1.1"
            )
            async with chat(server, query) as c:
                await c.until(0, timeout=60.0)
                for frame in range(8):
                    await c.send_pcm(tone_f32(1, hz, start=frame))
                while c.samples < 6 * FRAME:
                    await c.recv(timeout=30.0)
                assert not c.errors and set(c.kinds) <= {0, 1, 2}
                done.append(c.samples)

        async with trio.open_nursery() as nursery:
            for hz in (300.0, 900.0, 2000.0):
                nursery.start_soon(one, hz)
    assert len(done) == 3


# ------------------------------------------------------------ /v1/audio/duplex


async def test_raw_pcm_open_audio_text_close_done() -> None:
    async with running_server(**LOOPBACK) as server:
        url = chat_url(server, "/v1/audio/duplex")
        async with connect(url, max_queue=None) as ws:
            await ws.send(json.dumps({"type": "open"}))
            assert json.loads(await ws.recv()) == {"type": "ready"}
            sent = tone_f32(10, 440.0)
            await ws.send(sent.astype("<f4").tobytes())  # 800 ms at once
            await ws.send(json.dumps({"type": "close"}))
            audio, texts = [], []
            with trio.fail_after(10):
                while True:
                    message = await ws.recv()
                    if isinstance(message, bytes):
                        audio.append(np.frombuffer(message, dtype="<f4"))
                        continue
                    event = json.loads(message)
                    if event["type"] == "done":
                        break
                    assert event["type"] == "text"
                    texts.append(event["text"])
            got = np.concatenate(audio)
            assert np.sum(np.abs(got) > 0.05) > 6 * FRAME  # the echo came before done
            assert texts
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1000


async def test_raw_pcm_bad_frames_are_refused_and_the_session_goes_on() -> None:
    async with (
        running_server(**LOOPBACK) as server,
        connect(chat_url(server, "/v1/audio/duplex"), max_queue=None) as ws,
    ):
        await ws.send(tone_f32(1, 440.0).tobytes())  # opens a session without a prompt
        assert json.loads(await ws.recv()) == {"type": "ready"}
        await ws.send(b"\x00\x00\x80")  # not whole float32 samples
        await ws.send(json.dumps({"type": "nonsense"}))
        codes = []
        with trio.fail_after(5):
            while len(codes) < 2:
                message = await ws.recv()
                if isinstance(message, str) and (event := json.loads(message))["type"] == "error":
                    codes.append(event["error"]["code"])  # (text events may come between)
        assert codes == ["bad_audio", "unknown_event"]
        await ws.send(json.dumps({"type": "close"}))
        with trio.fail_after(5):
            while not (isinstance(m := await ws.recv(), str) and "done" in m):
                pass


async def test_chat_through_connection_workers() -> None:
    """The projection runs in the worker; its events cross the link like any other."""
    layout = {**LOOPBACK, "server.connection_workers": 2}
    async with running_server(**layout) as server:
        async with chat(server) as c:
            await c.until(0, timeout=30.0)
            for frame in range(10):
                await c.send_pcm(tone_f32(1, 440.0, start=frame))
                await trio.sleep(0.08)
            while not c.text or c.samples < 12 * FRAME:
                await c.recv()
            assert not c.errors and set(c.kinds) <= {0, 1, 2}
        async with chat(server, "text_prompt=hi") as c:
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await c.recv()
            assert c.kinds == [5]
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
