"""The link between a session process and a connection worker, or a shard and its server.

One stream socket (a ``socketpair`` made at spawn, or a session shard's Unix
socket that workers connect to), carrying typed messages,
each behind its length. The two that every frame sends are framed by hand; the
rest are pickles. Both ends are our own processes from one install (checked by
``CODE_FINGERPRINT``), so pickle is safe here; it never touches client bytes,
which the worker has already parsed into session events.

The framing is sans-I/O (``encode`` and ``Decoder``); ``Link`` is the I/O
edge: ``post`` never blocks and one sender task writes everything posted since
its last write in one ``send_all``, so a tick's worth of frames costs one
syscall. Flow control is per connection, by credits (``Window``/``Tally``):
the link itself never stops a fast connection for a slow one.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, final

import numpy as np
import trio

from duplex.sessions import AudioAppend, AudioDelta, ServerEvent, SessionOptions, rebuilt
from duplex.transport import HttpAnswer, Received

HEADER = struct.Struct("<I")
MAX_MESSAGE_BYTES = 1 << 30
"""A message over this is a broken link, not a big frame: client frames are capped far lower."""

WINDOW = 64
"""Frames in flight per connection and direction: the worker reads at most this many frames
the session process has not yet taken, and the session process writes at most this many the
worker has not yet written to the socket. Past it, each side waits, so a slow client or a
slow session backs up to its own socket only."""


class LinkBroken(Exception):
    """The bytes on the link are not a sequence of framed messages."""


def _code_fingerprint() -> str:
    """A digest of the source of every type that crosses a link."""
    root = Path(__file__).resolve().parent.parent
    sources = [
        *root.glob("sessions/*.py"),
        *root.glob("runtime/*.py"),
        *root.glob("transport/*.py"),
        *root.glob("wire/*.py"),
        *root.glob("topology/*.py"),
        *root.glob("models/*.py"),
        *root.glob("config/*.py"),  # the config crosses whole (a pickle), and in WorkerSettings
        root / "exceptions.py",
    ]
    digest = hashlib.sha256()
    for path in sorted(sources):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


CODE_FINGERPRINT = _code_fingerprint()
"""Taken when this process imported the link. A worker is spawned from the files on disk,
which a deploy may have changed since the server process started: pickles of changed
classes would not load on the other side, so a worker whose fingerprint differs from the
server's refuses to start (``EXIT_STALE_CODE``)."""

EXIT_STALE_CODE = 3


# -- messages, worker to session process ---------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Ready:
    """The worker is serving on the shared listener."""


@final
@dataclass(frozen=True, slots=True)
class Connected:
    """A WebSocket was accepted; the session process runs its connection actor."""

    conn: int
    autostart: bool
    initial_options: SessionOptions | None
    waited_s: float = 0.0
    """How long the worker already held the socket for its first event (choosing a shard):
    taken off the first-event timeout."""
    peer: str | None = None
    """The client's IP address (failed resumes are limited per peer)."""
    endpoint: str | None = None
    """The route's path (``/v1/duplex``, ``/v1/realtime``), for logs."""


@final
@dataclass(frozen=True, slots=True)
class FromSocket:
    """One decoded frame (an event or its typed error), or ``None``: the peer left, with
    ``peer_close``: the close code and reason it sent (``None``: none came, or unknown)."""

    conn: int
    received: Received
    peer_close: tuple[int | None, str] | None = None


@final
@dataclass(frozen=True, slots=True)
class Written:
    """``count`` more frames were written to the socket: credits for ``ToSocket``."""

    conn: int
    count: int


@final
@dataclass(frozen=True, slots=True)
class HttpRequest:
    request: int
    route: str
    body: bytes = b""


# -- messages, session process to worker ---------------------------------------


@final
@dataclass(frozen=True, slots=True)
class ToSocket:
    conn: int
    event: ServerEvent
    seq: int | None


@final
@dataclass(frozen=True, slots=True)
class CloseRemoteSocket:
    """Close connection ``conn``'s socket, which the other end of the link holds."""

    conn: int
    code: int
    reason: str


@final
@dataclass(frozen=True, slots=True)
class Consumed:
    """``count`` more frames were taken by the connection actor: credits for ``FromSocket``."""

    conn: int
    count: int


@final
@dataclass(frozen=True, slots=True)
class HttpReply:
    request: int
    reply: HttpAnswer


@final
@dataclass(frozen=True, slots=True)
class Load:
    """A session shard's admission now: workers send new sessions where most is free."""

    live: int
    capacity: int


@final
@dataclass(frozen=True, slots=True)
class Stop:
    """Shut down: stop accepting, let open sockets finish, exit."""


# -- messages of a relayed request (``_relay.py``), either way -------------------


@final
@dataclass(frozen=True, slots=True)
class AsgiOpen:
    """Worker to server: run the route of ``scope`` (an HTTP request or a WebSocket) there."""

    stream: int
    scope: dict[str, Any]


@final
@dataclass(frozen=True, slots=True)
class AsgiPull:
    """Server to worker: the route awaits its next ASGI ``receive()`` message."""

    stream: int


@final
@dataclass(frozen=True, slots=True)
class AsgiIn:
    """Worker to server: what ``receive()`` gave (a body part, a WebSocket message, a
    disconnect)."""

    stream: int
    message: dict[str, Any]


@final
@dataclass(frozen=True, slots=True)
class AsgiOut:
    """Server to worker: one ASGI ``send()`` message of the route, for the client."""

    stream: int
    message: dict[str, Any]


@final
@dataclass(frozen=True, slots=True)
class AsgiWritten:
    """Worker to server: ``count`` more ``AsgiOut`` were handed to the client: credits."""

    stream: int
    count: int


@final
@dataclass(frozen=True, slots=True)
class AsgiEnd:
    """This side is done with ``stream``: the route returned (server), or the client can no
    longer be written to (worker)."""

    stream: int


# -- messages between the server process and a session shard ------------------
# (the shard posts ``Ready`` once its socket listens; the server posts ``Stop``)


@final
@dataclass(frozen=True, slots=True)
class ShardQuery:
    """The server asks a shard for ``what``: ``health`` or ``metrics``; for a sleep of the
    engine processes ``sleep`` / ``wake`` (admission closed / opened; the answer: the
    sessions live), ``live`` (the sessions live) or ``evict`` (every session ended; how
    many)."""

    request: int
    what: str


@final
@dataclass(frozen=True, slots=True)
class ShardAnswer:
    """A shard's answer: its health dict, or its metric families."""

    request: int
    value: Any


# -- framing (sans-I/O) --------------------------------------------------------


# The two messages of every frame skip pickle: a tag byte (pickle bodies start with
# its PROTO opcode, 0x80, so the tags cannot collide), a struct, strings, raw PCM.
_TAG_PICKLE = 0x80
_TAG_APPEND = 1  # FromSocket(conn, AudioAppend)
_TAG_DELTA = 2  # ToSocket(conn, AudioDelta, seq)
_APPEND = struct.Struct("<BIiI")  # tag, conn, sample_rate (-1: None), event_id bytes (+1, 0: None)
_DELTA = struct.Struct("<BIqqIdHH")  # tag, conn, seq (-1: None), epoch, rate, start, ids


def _encode_append(conn: int, event: AudioAppend) -> bytes:
    event_id = b"" if event.event_id is None else event.event_id.encode()
    rate = -1 if event.sample_rate is None else event.sample_rate
    head = _APPEND.pack(_TAG_APPEND, conn, rate, 0 if event.event_id is None else len(event_id) + 1)
    return head + event_id + event.pcm.tobytes()


def _decode_append(body: bytes) -> FromSocket:
    _, conn, rate, id_size = _APPEND.unpack_from(body)
    start = _APPEND.size + max(0, id_size - 1)
    event_id = body[_APPEND.size : start].decode() if id_size else None
    pcm = np.frombuffer(body, np.float32, offset=start)  # read-only, as the worker built it
    return FromSocket(conn, rebuilt(AudioAppend, (pcm, None if rate < 0 else rate, event_id)))


def _encode_delta(conn: int, event: AudioDelta, seq: int | None) -> bytes:
    response_id, item_id = event.response_id.encode(), event.item_id.encode()
    head = _DELTA.pack(
        _TAG_DELTA, conn, -1 if seq is None else seq, event.epoch, event.sample_rate,
        event.audio_start_ms, len(response_id), len(item_id),
    )  # fmt: skip
    return head + response_id + item_id + event.pcm


def _decode_delta(body: bytes) -> ToSocket:
    _, conn, seq, epoch, rate, start_ms, id_size, item_size = _DELTA.unpack_from(body)
    at = _DELTA.size
    response_id = body[at : at + id_size].decode()
    item_id = body[at + id_size : at + id_size + item_size].decode()
    pcm = body[at + id_size + item_size :]
    event = rebuilt(AudioDelta, (response_id, item_id, epoch, pcm, rate, start_ms))
    return ToSocket(conn, event, None if seq < 0 else seq)


class Encoder:
    """Messages to frames: the per-frame audio messages by hand, the rest by one reused pickler.

    Pickle costs 10-20 us a frame each way (numpy's reduce, and the ``fields()``
    walk of a dataclass's generated ``__getstate__``); the hand-written forms of
    the two messages every frame sends take about 1. Other messages are rare,
    and pickle keeps them honest to their types.
    """

    def __init__(self) -> None:
        self._out = io.BytesIO()
        self._pickler = pickle.Pickler(self._out, protocol=pickle.HIGHEST_PROTOCOL)

    def encode(self, message: object) -> bytes:
        """One framed message: its length, then its body."""
        if isinstance(message, FromSocket) and isinstance(message.received, AudioAppend):
            body = _encode_append(message.conn, message.received)
        elif isinstance(message, ToSocket) and isinstance(message.event, AudioDelta):
            body = _encode_delta(message.conn, message.event, message.seq)
        else:
            out = self._out
            out.seek(0)
            out.truncate()
            self._pickler.clear_memo()
            self._pickler.dump(message)
            body = out.getvalue()
        return HEADER.pack(len(body)) + body


encode = Encoder().encode
"""The process's encoder: synchronous, so every link of the process can share it."""


def decode(body: bytes) -> Any:
    """One message from its body (``encode`` less the length)."""
    if not body:
        raise LinkBroken("an empty message")
    tag = body[0]
    try:
        if tag == _TAG_PICKLE:
            return pickle.loads(body)
        if tag == _TAG_APPEND:
            return _decode_append(body)
        if tag == _TAG_DELTA:
            return _decode_delta(body)
    except Exception as exc:
        raise LinkBroken(f"an undecodable message: {exc!r}") from exc
    raise LinkBroken(f"an unknown message tag: {tag:#x}")


class Decoder:
    """Bytes in, in any chunking; whole messages out, in order (each body through ``decode``)."""

    def __init__(self, decode: Callable[[bytes], Any] = decode) -> None:
        self._buffer = bytearray()
        self._decode = decode

    def feed(self, data: bytes) -> list[Any]:
        buffer = self._buffer
        buffer += data
        messages: list[Any] = []
        start, end = 0, len(buffer)
        while end - start >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, start)
            if size > MAX_MESSAGE_BYTES:
                raise LinkBroken(f"a message of {size} bytes")
            stop = start + HEADER.size + size
            if stop > end:
                break
            messages.append(self._decode(bytes(buffer[start + HEADER.size : stop])))
            start = stop
        del buffer[:start]
        return messages

    @property
    def pending(self) -> int:
        """Bytes of a message not yet complete."""
        return len(self._buffer)


# -- flow control --------------------------------------------------------------


class Window:
    """Credits of the sending side: ``take`` one per frame, waits at zero until ``give``."""

    def __init__(self, size: int = WINDOW) -> None:
        self.free = size
        self.closed = False
        self._lot = trio.lowlevel.ParkingLot()

    async def take(self) -> bool:
        """One credit; ``False`` once the connection is closed."""
        while self.free == 0 and not self.closed:
            await self._lot.park()
        if self.closed:
            return False
        self.free -= 1
        return True

    def give(self, count: int) -> None:
        self.free += count
        self._lot.unpark_all()

    def close(self) -> None:
        self.closed = True
        self._lot.unpark_all()


class Tally:
    """Credits of the receiving side: returns them in batches of half a window."""

    def __init__(self, size: int = WINDOW) -> None:
        self.batch = max(1, size // 2)
        self.count = 0

    def add(self) -> int:
        """Count one frame done; the credits to return now (0: not yet)."""
        self.count += 1
        if self.count < self.batch:
            return 0
        count, self.count = self.count, 0
        return count


# -- the I/O edge --------------------------------------------------------------


class Link:
    """One end of a link over a trio stream."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        receive_size: int = 1 << 18,
        decode: Callable[[bytes], Any] = decode,
    ) -> None:
        """``decode``: a message body to its message (the engine link has its own)."""
        self.stream = stream
        self.receive_size = receive_size
        self._decode = decode
        self._out: list[bytes] = []
        self._posted = trio.Event()
        self.closed = False

    def post(self, message: object) -> None:
        """Queue ``message`` for the sender; never blocks. Dropped once the link is closed."""
        if self.closed:
            return
        self._out.append(encode(message))
        self._posted.set()

    def post_framed(self, data: bytes) -> None:
        """Queue a message already framed (its length included); never blocks."""
        if self.closed:
            return
        self._out.append(data)
        self._posted.set()

    async def send_loop(self) -> None:
        """Write what is posted, in order, until the peer is gone."""
        try:
            while True:
                await self._posted.wait()
                self._posted = trio.Event()
                data, self._out = b"".join(self._out), []
                await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed = True

    async def while_sending(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """``await fn(*args)`` with this link's sender running beside it, until ``fn`` returns."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.send_loop)
            await fn(*args)
            nursery.cancel_scope.cancel()

    async def messages(self) -> AsyncIterator[Any]:
        """Messages as they arrive, until the peer closes its end."""
        decoder = Decoder(self._decode)
        while True:
            try:
                data = await self.stream.receive_some(self.receive_size)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self.closed = True
                if decoder.pending:
                    raise LinkBroken(f"the link ended inside a message ({decoder.pending} bytes)")
                return
            for message in decoder.feed(data):
                yield message
