"""The worker link, no processes: framing, credits, and the I/O edge over in-memory streams.

The link carries every frame between a connection worker and the session process
(``_link.py``): length-prefixed messages (the per-frame audio ones framed by hand, the
rest pickled), decoded in any chunking, with per-connection credits (``Window`` on the
sending side, ``Tally`` on the receiving side).
"""

from __future__ import annotations

import dataclasses
import itertools
import pickle
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex.exceptions import BadEvent
from duplex.sessions import AudioAppend, AudioDelta, ErrorEvent, SessionOptions, TranscriptDelta
from duplex.topology._link import (
    HEADER,
    MAX_MESSAGE_BYTES,
    WINDOW,
    CloseRemoteSocket,
    Connected,
    Consumed,
    Decoder,
    FromSocket,
    HttpReply,
    HttpRequest,
    Link,
    LinkBroken,
    Ready,
    Stop,
    Tally,
    ToSocket,
    Window,
    Written,
    encode,
)
from duplex.transport._app import HttpAnswer

# -- comparing what came out with what went in ---------------------------------


def shape(value: Any) -> Any:
    """A structure ``==`` can compare: dataclasses, arrays and exceptions by type and content."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value), tuple(shape(getattr(value, f.name)) for f in fields))
    if isinstance(value, BaseException):
        return (type(value), value.args, shape(vars(value)))
    if isinstance(value, dict):
        return (dict, tuple((shape(k), shape(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value), tuple(shape(v) for v in value))
    return (type(value), value)


def same(got: list[Any], sent: list[Any]) -> bool:
    return [shape(m) for m in got] == [shape(m) for m in sent]


# -- messages: the link's own, carrying real session events, and plain data ----

small = st.integers(min_value=0, max_value=2**31)
text = st.text(max_size=20)
pcm = st.lists(st.floats(min_value=-1, max_value=1, width=32), max_size=64).map(
    lambda xs: np.asarray(xs, dtype=np.float32)
)

server_event = st.one_of(
    st.builds(
        AudioDelta,
        response_id=text,
        item_id=text,
        epoch=small,
        pcm=st.binary(max_size=256),
        sample_rate=st.sampled_from([8000, 16000, 24000]),
        audio_start_ms=st.floats(min_value=0, max_value=1e6),
    ),
    st.builds(ErrorEvent, code=text, type=text, message=text, event_id=st.none() | text),
    st.builds(
        TranscriptDelta,
        response_id=text,
        item_id=text,
        epoch=small,
        delta=text,
        audio_start_ms=st.floats(min_value=0, max_value=1e6),
    ),
)
received = st.one_of(
    st.none(),
    st.builds(
        AudioAppend,
        pcm=pcm,
        sample_rate=st.none() | st.sampled_from([8000, 16000, 24000, 48000]),
        event_id=st.none() | text,
    ),
    st.builds(lambda m, e: BadEvent(m, event_id=e), text, st.none() | text),
)
link_message = st.one_of(
    st.just(Ready()),
    st.just(Stop()),
    st.builds(
        Connected,
        conn=small,
        autostart=st.booleans(),
        initial_options=st.none()
        | st.builds(
            SessionOptions,
            overlap_policy=st.none() | st.sampled_from(["model", "barge_in_on_speech", "ignore"]),
            short_ack_ms=st.none() | st.integers(1, 1000),
        ),
    ),
    st.builds(FromSocket, conn=small, received=received),
    st.builds(Written, conn=small, count=small),
    st.builds(Consumed, conn=small, count=small),
    st.builds(HttpRequest, request=small, route=st.sampled_from(["health", "models", "metrics"])),
    st.builds(
        HttpReply,
        request=small,
        reply=st.builds(
            HttpAnswer, status=st.sampled_from([200, 503]), media_type=text, body=st.binary()
        ),
    ),
    st.builds(ToSocket, conn=small, event=server_event, seq=st.none() | small),
    st.builds(CloseRemoteSocket, conn=small, code=st.sampled_from([1000, 1001, 1011]), reason=text),
)
plain = st.one_of(
    st.binary(max_size=300),
    st.dictionaries(st.text(max_size=8), st.integers() | st.binary(max_size=16), max_size=4),
    st.integers(),
)
messages = st.lists(st.one_of(link_message, plain), max_size=25)


# -- framing -------------------------------------------------------------------


def cut(data: bytes, points: list[int]) -> list[bytes]:
    """``data`` split at ``points`` (sorted, repeats allowed: empty chunks)."""
    edges = [0, *sorted(points), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sent=messages, data=st.data())
def test_any_chunking_decodes_exactly_the_messages_in_order(sent: list[Any], data: Any) -> None:
    frames = [encode(m) for m in sent]
    stream = b"".join(frames)
    ends = [sum(len(f) for f in frames[: i + 1]) for i in range(len(frames))]
    how = data.draw(st.sampled_from(["whole", "bytes", "cuts"]), label="chunking")
    if how == "whole":
        chunks = [stream]
    elif how == "bytes":
        chunks = [stream[i : i + 1] for i in range(len(stream))]
    else:
        points = data.draw(st.lists(st.integers(0, len(stream)), max_size=30), label="cuts")
        chunks = cut(stream, points)
    if data.draw(st.booleans(), label="empty chunks too"):
        chunks = [piece for chunk in chunks for piece in (b"", chunk)] + [b""]

    decoder = Decoder()
    got: list[Any] = []
    fed = 0
    for chunk in chunks:
        out = decoder.feed(chunk)
        fed += len(chunk)
        done = [e for e in ends if e <= fed]
        # each feed yields exactly the messages its bytes completed, and holds the rest
        assert len(got) + len(out) == len(done)
        got += out
        assert decoder.pending == fed - (done[-1] if done else 0)
        if fed not in (0, *ends):
            assert decoder.pending > 0  # inside a message
    assert same(got, sent)
    assert decoder.pending == 0


def test_arrays_round_trip_with_dtype_shape_and_flags_and_no_aliasing() -> None:
    grid = np.arange(24, dtype="<i2").reshape(4, 6)[:, ::2]  # 2-D and not contiguous
    frozen = np.linspace(-1, 1, 5, dtype=np.float32)
    frozen.flags.writeable = False
    pcm = np.linspace(-1, 1, 1920, dtype=np.float32)
    data = encode(grid) + encode(frozen) + encode(FromSocket(7, AudioAppend(pcm)))
    got_grid, got_frozen, got_event = Decoder().feed(data)
    assert got_grid.dtype == np.dtype("<i2") and got_grid.shape == (4, 3)
    np.testing.assert_array_equal(got_grid, grid)
    assert got_grid.flags.writeable  # a writable array arrives writable: the receiver's own
    got_grid[0, 0] = 99
    assert grid[0, 0] == 0
    assert got_frozen.dtype == np.float32 and not got_frozen.flags.writeable
    np.testing.assert_array_equal(got_frozen, frozen)
    got_pcm = got_event.received.pcm
    assert got_pcm.dtype == np.float32 and got_pcm.shape == (1920,)
    np.testing.assert_array_equal(got_pcm, pcm)


def test_the_per_frame_messages_skip_pickle_and_keep_their_arrays_read_only() -> None:
    samples = np.linspace(-1, 1, 1920, dtype=np.float32)
    samples.flags.writeable = False
    append = FromSocket(7, AudioAppend(samples, 16000, "évt-1"))
    delta = ToSocket(9, AudioDelta("resp_ü", "item_2", 3, b"\x01\x02" * 960, 24000, 80.5), None)
    for message in (append, delta):
        frame = encode(message)
        assert frame[HEADER.size] != pickle.PROTO[0]  # a tag of our own, not a pickle
        (got,) = Decoder().feed(frame)
        assert same([got], [message])
    (got,) = Decoder().feed(encode(append))
    assert not got.received.pcm.flags.writeable


def test_a_message_that_cannot_be_pickled_leaves_the_shared_encoder_usable() -> None:
    before = encode({"n": 1, "pcm": np.zeros(3, np.float32)})
    with pytest.raises(Exception):  # noqa: B017  # pickle's own error, whichever it is
        encode({"n": 2, "callback": lambda: None})
    assert encode({"n": 1, "pcm": np.zeros(3, np.float32)}) == before  # nothing left over
    (got,) = Decoder().feed(encode(Written(3, 32)))
    assert got == Written(3, 32)


def test_pending_counts_a_partial_header_and_a_partial_body() -> None:
    frame = encode({"a": b"x" * 100})
    decoder = Decoder()
    assert decoder.feed(frame[:2]) == [] and decoder.pending == 2
    assert decoder.feed(frame[2:50]) == [] and decoder.pending == 50
    assert decoder.feed(frame[50:] + frame[:3]) == [{"a": b"x" * 100}]
    assert decoder.pending == 3


def test_a_header_over_the_limit_is_a_broken_link_before_its_body_arrives() -> None:
    with pytest.raises(LinkBroken):
        Decoder().feed(HEADER.pack(MAX_MESSAGE_BYTES + 1))
    decoder = Decoder()  # split across feeds, after a good message
    assert decoder.feed(encode(1) + HEADER.pack(2**32 - 1)[:3]) == [1]
    with pytest.raises(LinkBroken):
        decoder.feed(HEADER.pack(2**32 - 1)[3:])


def test_a_header_at_the_limit_waits_for_its_body() -> None:
    decoder = Decoder()
    assert decoder.feed(HEADER.pack(MAX_MESSAGE_BYTES) + b"\x80") == []
    assert decoder.pending == HEADER.size + 1


@pytest.mark.parametrize(
    "body",
    [
        b"",  # an empty pickle
        b"not a pickle at all",
        pickle.dumps({"k": list(range(50))})[:-5],  # a pickle cut short inside its frame
        b"cduplex.topology._link\nNoSuchName\n.",  # a name the receiver does not have
    ],
    ids=["empty", "garbage", "truncated", "unknown-global"],
)
def test_a_complete_frame_that_is_not_a_pickle_is_a_broken_link(body: bytes) -> None:
    decoder = Decoder()
    assert decoder.feed(encode("before")) == ["before"]
    with pytest.raises(LinkBroken):
        decoder.feed(HEADER.pack(len(body)) + body + encode("after"))


# -- credits -------------------------------------------------------------------


async def test_window_gives_size_credits_then_waits_for_give() -> None:
    window = Window(3)
    results: list[bool] = []

    async def taker(times: int) -> None:
        for _ in range(times):
            results.append(await window.take())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(taker, 5)
        await trio.testing.wait_all_tasks_blocked()
        assert results == [True, True, True]  # the fourth take waits
        window.give(1)
        await trio.testing.wait_all_tasks_blocked()
        assert results == [True] * 4
        window.give(5)
        await trio.testing.wait_all_tasks_blocked()
        assert results == [True] * 5
    assert window.free == 4  # 3 + 1 + 5 given, 5 taken


async def test_window_give_wakes_only_as_many_takers_as_credits() -> None:
    window = Window(1)
    assert await window.take()
    done: list[int] = []

    async def taker(n: int) -> None:
        assert await window.take()
        done.append(n)

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(taker, n)
        await trio.testing.wait_all_tasks_blocked()
        assert done == []
        window.give(2)
        await trio.testing.wait_all_tasks_blocked()
        assert len(done) == 2 and window.free == 0  # the third still waits
        window.give(1)
    assert sorted(done) == [0, 1, 2]


async def test_window_close_wakes_a_waiting_taker_with_false() -> None:
    window = Window(1)
    assert await window.take()
    results: list[bool] = []

    async def taker() -> None:
        results.append(await window.take())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(taker)
        nursery.start_soon(taker)
        await trio.testing.wait_all_tasks_blocked()
        assert results == []
        window.close()
    assert results == [False, False]
    assert await window.take() is False
    window.give(10)  # credits after the close do not reopen it
    assert await window.take() is False


async def test_window_closed_with_credits_left_takes_nothing() -> None:
    window = Window()
    assert window.free == WINDOW
    window.close()
    assert await window.take() is False


@pytest.mark.parametrize(("size", "batch"), [(WINDOW, WINDOW // 2), (5, 2), (2, 1), (1, 1)])
def test_tally_returns_credits_in_batches_of_half_a_window(size: int, batch: int) -> None:
    tally = Tally(size)
    for _ in range(3):  # and again after each batch
        assert [tally.add() for _ in range(batch - 1)] == [0] * (batch - 1)
        assert tally.add() == batch
    assert tally.add() == (1 if batch == 1 else 0)


def test_tally_default_is_the_link_window() -> None:
    tally = Tally()
    returned = [tally.add() for _ in range(WINDOW)]
    assert returned.count(0) == WINDOW - 2 and returned[WINDOW // 2 - 1] == WINDOW // 2
    assert returned[-1] == WINDOW // 2


async def test_window_and_tally_move_a_flood_without_exceeding_the_window() -> None:
    """Sender takes, receiver tallies and gives back: all arrive, never more than WINDOW out."""
    window, tally = Window(), Tally()
    send, receive = trio.open_memory_channel[int](float("inf"))
    in_flight = peak = 0
    got: list[int] = []

    async def sender() -> None:
        nonlocal in_flight, peak
        for n in range(1000):
            assert await window.take()
            in_flight += 1
            peak = max(peak, in_flight)
            send.send_nowait(n)
        await send.aclose()

    async def receiver() -> None:
        nonlocal in_flight
        async for n in receive:
            in_flight -= 1
            got.append(n)
            if credits := tally.add():
                window.give(credits)
            if n % 7 == 0:
                await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        nursery.start_soon(receiver)
    assert got == list(range(1000))
    assert peak == WINDOW  # the window filled, and never overflowed


# -- the I/O edge ----------------------------------------------------------------


class Counting(trio.abc.Stream):
    """A stream that counts its ``send_all`` calls."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.sends = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sends += 1
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()  # type: ignore[attr-defined]

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def memory_pair() -> tuple[trio.abc.Stream, trio.abc.Stream]:
    return trio.testing.memory_stream_pair()


def socket_pair() -> tuple[trio.abc.Stream, trio.abc.Stream]:
    a, b = trio.socket.socketpair()
    return trio.SocketStream(a), trio.SocketStream(b)


Pair = Callable[[], tuple[trio.abc.Stream, trio.abc.Stream]]


@pytest.fixture(params=[memory_pair, socket_pair], ids=["memory", "socketpair"])
def pair(request: pytest.FixtureRequest) -> Pair:
    return request.param


async def end(nursery: trio.Nursery) -> None:
    """Once everything has run, stop the sender (its ``send_loop`` waits for posts forever)."""
    await trio.testing.wait_all_tasks_blocked()
    nursery.cancel_scope.cancel()


async def collect(link: Link, into: list[Any]) -> None:
    async for message in link.messages():
        into.append(message)


async def through_link(
    a: trio.abc.Stream,
    b: trio.abc.Stream,
    sent: list[Any],
    *,
    receive_size: int,
    pause: Callable[[int], bool],
) -> tuple[list[Any], Link]:
    """Post ``sent`` on a link over ``a``, letting the sender run after post n where
    ``pause(n)``; close ``a``; what arrived over ``b``, and the receiving link."""
    sender, receiver = Link(a), Link(b, receive_size=receive_size)
    got: list[Any] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.send_loop)
        nursery.start_soon(collect, receiver, got)
        for n, message in enumerate(sent):
            sender.post(message)
            if pause(n):
                await trio.lowlevel.checkpoint()
        await trio.testing.wait_all_tasks_blocked()
        await a.aclose()
        await end(nursery)
    return got, receiver


async def test_posted_messages_arrive_in_order(pair: Pair) -> None:
    a, b = pair()
    sent = [ToSocket(n, ErrorEvent("c", "t", "m" * n), n) for n in range(200)]
    # tiny reads: messages span them; the sender runs between some posts, not others
    got, receiver = await through_link(a, b, sent, receive_size=7, pause=lambda n: n % 3 == 0)
    assert got == sent
    assert receiver.closed  # its messages() ended on the close, not on the cancel


async def test_posts_before_the_sender_runs_go_out_in_one_write(pair: Pair) -> None:
    a, b = pair()
    counting = Counting(a)
    sender, receiver = Link(counting), Link(b)
    sent = [{"n": n, "pad": bytes(n)} for n in range(500)]
    for message in sent:
        sender.post(message)
    got: list[Any] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect, receiver, got)
        nursery.start_soon(sender.send_loop)
        with trio.fail_after(10):  # a safety net only
            while len(got) < len(sent):
                await trio.testing.wait_all_tasks_blocked()
        assert counting.sends == 1
        sender.post("one more")  # and a later post is a later write
        await trio.testing.wait_all_tasks_blocked()
        assert counting.sends == 2
        await a.aclose()
        await end(nursery)
    assert got == [*sent, "one more"]
    assert receiver.closed


async def test_closing_the_sending_stream_ends_messages_cleanly(pair: Pair) -> None:
    a, b = pair()
    receiver = Link(b)
    await a.send_all(encode("only") + encode({"two": 2}))
    await a.aclose()
    got: list[Any] = []
    await collect(receiver, got)  # returns: no exception
    assert got == ["only", {"two": 2}]
    assert receiver.closed


@pytest.mark.parametrize("keep", [1, HEADER.size, HEADER.size + 3])
async def test_closing_inside_a_message_is_a_broken_link(pair: Pair, keep: int) -> None:
    a, b = pair()
    receiver = Link(b)
    frame = encode({"cut": b"x" * 40})
    await a.send_all(encode("whole") + frame[:keep])
    await a.aclose()
    got: list[Any] = []
    with pytest.raises(LinkBroken):
        await collect(receiver, got)
    assert got == ["whole"]  # what came before the cut was delivered


async def test_post_after_the_peer_left_is_dropped(pair: Pair) -> None:
    """The peer ends its side: ``messages`` ends, and later posts are never written."""
    a, b = pair()
    ours, theirs = Link(a), Link(b)
    got_there: list[Any] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ours.send_loop)
        nursery.start_soon(collect, theirs, got_there)
        ours.post("before")
        await trio.testing.wait_all_tasks_blocked()
        assert got_there == ["before"]
        await b.send_eof()  # type: ignore[attr-defined]  # they stop sending to us
        await collect(ours, [])  # so our messages end ...
        assert ours.closed
        ours.post("after")  # ... and what we post now is dropped
        await trio.testing.wait_all_tasks_blocked()
        await a.aclose()  # their messages end with what arrived
        await end(nursery)
    assert got_there == ["before"]
    assert theirs.closed


async def test_send_loop_ends_quietly_when_the_peer_is_gone(pair: Pair) -> None:
    a, b = pair()
    ours = Link(a)
    await b.aclose()
    with trio.fail_after(10):  # a safety net only
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ours.send_loop)
            for _ in range(50):  # until a write fails: a socket may take the first one
                ours.post(b"x" * 65536)
                await trio.testing.wait_all_tasks_blocked()
                if ours.closed:
                    break
    assert ours.closed  # the loop returned without raising
    ours.post("dropped")  # a no-op now, and no error


async def test_messages_ends_when_our_own_stream_is_closed(pair: Pair) -> None:
    a, b = pair()
    ours = Link(a)
    got: list[Any] = []

    async def close_soon(close: Callable[[], Awaitable[None]]) -> None:
        await trio.testing.wait_all_tasks_blocked()
        await close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(close_soon, a.aclose)
        await collect(ours, got)
    assert got == [] and ours.closed
    await b.aclose()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sent=messages, receive_size=st.integers(1, 64), yields=st.lists(st.booleans()))
def test_link_over_memory_streams_delivers_any_messages_in_order(
    sent: list[Any], receive_size: int, yields: list[bool]
) -> None:
    async def main() -> list[Any]:
        a, b = trio.testing.memory_stream_pair()
        got, receiver = await through_link(
            a, b, sent, receive_size=receive_size, pause=lambda n: n < len(yields) and yields[n]
        )
        assert receiver.closed
        return got

    assert same(trio.run(main), sent)
