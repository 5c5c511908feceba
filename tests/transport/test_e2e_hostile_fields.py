"""The issue's hostile values over real sockets: a typed error each, the socket open.

Before the fix, ``played_ms`` = 10**309 closed the socket (1006; 1011 on
``/v1/realtime?duplex=1``), ``false_interruption_timeout_s`` = 10**309 was accepted and
closed it at the first pause (1011), and so did ``prefix_padding_ms`` = 10**309 at the
first speech; ``item.role`` ``{}`` closed it at once. Here each gets ``bad_event``
naming the field, and a valid event on the same socket is answered after it.
"""

from __future__ import annotations

import base64
import json

import pytest
from websockets.trio.client import connect

from .test_e2e_duplex import MODEL, Layout, open_session
from .wsclient import ENERGY_VAD, FRAME, Client, client, running_server, silence, tone

BIG = "1" + "0" * 309


@pytest.fixture(params=[0, 2], ids=["one-process", "two-workers"])
def workers(request: pytest.FixtureRequest) -> Layout:
    """Sockets in this process, or in two connection workers (which parse the frames)."""
    return {"server.connection_workers": request.param}


async def _refused(c: Client, text: str, param: str) -> None:
    await c.send(text)
    error = await c.until("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("bad_event", param)
    assert error["error"]["event_id"] == "bad"


async def test_duplex_hostile_numbers_leave_the_socket_and_session_usable(
    workers: Layout,
) -> None:
    async with running_server(**MODEL, **workers) as server, client(server) as c:
        # the first event, before any session exists
        timeout = f'{{"false_interruption_timeout_s":{BIG}}}'
        create = f'{{"type":"session.create","event_id":"bad","session":{timeout}}}'
        await _refused(c, create, "session.false_interruption_timeout_s")
        await open_session(c)  # the same socket opens its session after it
        await c.stream(tone(4) + silence(2), realtime=False)
        created = await c.until("response.created")
        response_id = created["response"]["id"]
        await _refused(
            c,
            create.replace("session.create", "session.update"),
            "session.false_interruption_timeout_s",
        )
        ack = {"type": "playback.ack", "event_id": "bad", "response_id": response_id}
        await _refused(c, json.dumps(ack | {"played_ms": 0}).replace("0}", f"{BIG}}}"), "played_ms")
        # the socket is open and the session answers the valid forms
        await c.send(json.dumps(ack | {"event_id": "ok", "played_ms": 80}))
        acked = await c.until("playback.acknowledged")
        assert acked["response_id"] == response_id
        await c.send({"type": "session.update", "session": {"false_interruption_timeout_s": 1.5}})
        updated = await c.until("session.updated")
        assert updated["session"]["false_interruption_timeout_s"] == 1.5
        assert len(c.of("error")) == 3


async def test_realtime_hostile_values_leave_the_socket_and_session_usable(
    workers: Layout,
) -> None:
    async with running_server(**ENERGY_VAD, **workers) as server:
        url = server.url.replace("/v1/duplex", "/v1/realtime?duplex=1")
        async with connect(url, max_queue=None) as ws:
            c = Client(ws)
            await c.until("session.created")
            vad = f'{{"type":"server_vad","prefix_padding_ms":{BIG}}}'
            session = f'{{"audio":{{"input":{{"turn_detection":{vad}}}}}}}'
            await _refused(
                c,
                f'{{"type":"session.update","event_id":"bad","session":{session}}}',
                "session.audio.input.turn_detection.prefix_padding_ms",
            )
            text = '[{"type":"input_text","text":"hi"}]'
            for role in ("{}", "[]"):
                item = f'{{"type":"message","role":{role},"content":{text}}}'
                await _refused(
                    c,
                    f'{{"type":"conversation.item.create","event_id":"bad","item":{item}}}',
                    "item.role",
                )
            await _refused(
                c,
                f'{{"type":"playback.ack","event_id":"bad","response_id":"resp_1","played_ms":{BIG}}}',
                "played_ms",
            )
            # the socket is open: the valid update is taken, and speech is heard with it
            await c.send(
                session.replace(BIG, "200").join(('{"type":"session.update","session":', "}"))
            )
            await c.until("session.updated")
            pcm = silence(3) + tone(6) + silence(10)
            for start in range(0, len(pcm), 2 * FRAME):  # Realtime appends carry no rate
                audio = base64.b64encode(pcm[start : start + 2 * FRAME]).decode()
                await c.send({"type": "input_audio_buffer.append", "audio": audio})
            started = await c.until("input_audio_buffer.speech_started")
            assert 0 <= started["audio_start_ms"] <= 240 - 200 + 80
            assert len(c.of("error")) == 4
