"""What a client must remember to resume a session, and the played position it acks (sans-I/O).

No sockets and no clock here: the connection (``_connection.py``) feeds each
server event to ``SessionCursor.receive`` and asks it for the ``session.resume``
to send after a drop; ``Playout`` is a speaker's timeline for a client that
plays (or pretends to play) the audio it gets, so its ``playback.ack`` carries
what was really played, not what arrived.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

SAMPLE_RATE = 24_000
"""The Realtime PCM16 rate (``audio/pcm``): what the client sends and gets."""


@final
@dataclass(frozen=True, slots=True)
class ServerEvent:
    """One server event: its ``type`` and the whole JSON object."""

    type: str
    data: dict[str, Any]
    seq: int | None

    @classmethod
    def parse(cls, text: str) -> ServerEvent:
        """Raises ``ValueError`` on a frame that is no JSON object with a string ``type``."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            raise ValueError("a server event is a JSON object with a string type")
        seq = data.get("server_event_seq")
        return cls(data["type"], data, seq if isinstance(seq, int) else None)


def realtime_url(base: str, *, resume: bool = False) -> str:
    """``base`` (``ws://host:port``, or a full ``/v1/realtime`` URL) with ``duplex=1`` (and
    ``resume=1``) set; other query parameters kept."""
    parts = urlsplit(base)
    path = parts.path if parts.path.rstrip("/") else "/v1/realtime"
    query = dict(parse_qsl(parts.query))
    query["duplex"] = "1"
    if resume:
        query["resume"] = "1"
    else:
        query.pop("resume", None)
    return urlunsplit((parts.scheme, parts.netloc, path, urlencode(query), ""))


class ResumeRefused(Exception):
    """The server would not resume the session (expired, replaced token, rate limited)."""


CONNECTION_SCOPED = frozenset(
    {
        "session.created",
        "conversation.created",
        "session.resumed",
        "session.replaced",
        "session.resync_required",
        "error",
    }
)
"""Events with no seq that belong to no journaled group: never replayed."""


@final
class SessionCursor:
    """The session id, the current resume token and the last journaled event seen.

    Replayed events keep their ``server_event_seq``: one at or below the cursor
    is a duplicate and is not delivered twice. One session event may be several
    wire events of which only the last carries the seq (``response.done`` and
    its companions); a drop inside such a group replays the whole group, so
    the members already delivered (``pending``) are skipped when they come again.
    """

    def __init__(self) -> None:
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.last_seq = 0
        self.acked_seq = 0
        self.resumes = 0
        self.duplicates = 0
        self.resync_required = False
        self._pending: list[str] = []  # unsequenced members of the group in progress
        self._skip: list[str] = []  # those of them a resume's replay sends again

    def receive(self, event: ServerEvent) -> bool:
        """Note ``event``; ``False`` for a replayed duplicate the caller should drop."""
        if event.type == "session.created":
            self.session_id = event.data["session"]["id"]
            self.resume_token = event.data.get("resume_token")
        elif event.type == "session.resumed":
            self.resume_token = event.data["resume_token"]
            self.resumes += 1
            self._skip = list(self._pending)
        elif event.type == "session.resync_required":
            self.resync_required = True
            self._skip = []
        if event.seq is not None:
            if event.seq <= self.last_seq:
                self.duplicates += 1
                return False
            self.last_seq = event.seq
            self._pending.clear()
            self._skip.clear()
        elif event.type not in CONNECTION_SCOPED:
            if self._skip and self._skip[0] == event.type:
                self._skip.pop(0)
                self.duplicates += 1
                return False
            self._skip.clear()
            self._pending.append(event.type)
        return True

    @property
    def resumable(self) -> bool:
        return self.session_id is not None and self.resume_token is not None

    def resume_event(self) -> dict[str, Any]:
        """The first message of a new socket that takes the session back."""
        if not self.resumable:
            raise ResumeRefused("no session to resume: none was created yet")
        return {
            "type": "session.resume",
            "session_id": self.session_id,
            "resume_token": self.resume_token,
            "last_received_server_event_seq": self.last_seq,
        }

    def event_ack(self, every: int) -> dict[str, Any] | None:
        """A ``session.event_ack`` when ``every`` seqs arrived since the last one, else ``None``
        (the server's journal then drops what the client holds)."""
        if every <= 0 or self.last_seq - self.acked_seq < every:
            return None
        self.acked_seq = self.last_seq
        return {"type": "session.event_ack", "server_event_seq": self.last_seq}


@dataclass(slots=True)
class _Queued:
    response_id: str
    start_s: float
    end_s: float
    played_before_ms: float


@final
@dataclass(slots=True)
class Playout:
    """A speaker's timeline: audio plays as soon as it arrives, after what is queued.

    ``add`` schedules a response's chunk at ``now``; ``played_ms(response, now)``
    is how much of that response has left the speaker by ``now`` (what a
    ``playback.ack`` reports). ``stop`` drops what has not played (barge-in).
    """

    busy_until_s: float = 0.0
    queued: list[_Queued] = field(default_factory=list)
    played_total_ms: dict[str, float] = field(default_factory=dict)

    def add(self, response_id: str, samples: int, now: float) -> float:
        """Queue ``samples`` of ``response_id``; returns when they start playing."""
        start = max(now, self.busy_until_s)
        end = start + samples / SAMPLE_RATE
        before = sum(q.end_s - q.start_s for q in self.queued if q.response_id == response_id)
        done = self.played_total_ms.get(response_id, 0.0)
        self.queued.append(_Queued(response_id, start, end, done + 1000 * before))
        self.busy_until_s = end
        return start

    def played_ms(self, response_id: str, now: float) -> float:
        """Milliseconds of ``response_id`` played by ``now``."""
        self._settle(now)
        played = self.played_total_ms.get(response_id, 0.0)
        for q in self.queued:
            if q.response_id == response_id and q.start_s < now:
                played = max(played, q.played_before_ms + 1000 * (min(now, q.end_s) - q.start_s))
        return played

    def stop(self, now: float) -> None:
        """Drop everything not yet played."""
        self._settle(now)
        for q in self.queued:
            if q.start_s < now:
                heard = q.played_before_ms + 1000 * (now - q.start_s)
                self.played_total_ms[q.response_id] = heard
        self.queued.clear()
        self.busy_until_s = now

    def _settle(self, now: float) -> None:
        while self.queued and self.queued[0].end_s <= now:
            q = self.queued.pop(0)
            self.played_total_ms[q.response_id] = q.played_before_ms + 1000 * (q.end_s - q.start_s)

    def idle(self, now: float) -> bool:
        return self.busy_until_s <= now
