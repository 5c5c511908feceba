"""What a client must remember to resume a session, and the played position it acks (sans-I/O).

No sockets and no clock here: the connection (``_connection.py``) feeds each
server event to ``SessionCursor.receive`` and asks it for the ``session.resume``
to send after a drop; ``JitterBuffer`` sits between the socket and a speaker (a
sound device, or a file written at the pace of one), so a ``playback.ack``
carries what was really played, not what arrived.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any, final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

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


@final
class JitterBuffer:
    """The speaker's queue, between the socket and the sound device (sans-I/O).

    Audio deltas are ``add``-ed as they arrive; the device ``pull``-s fixed blocks at its own
    pace. A response starts once ``preroll`` samples of it are buffered (or at once when it
    has ``end``-ed), so network jitter does not cut its first words; running dry before its
    end is an underrun (counted), after which it waits for ``preroll`` again. ``stop`` drops
    what was not handed to the device (a barge-in). ``played`` is what a ``playback.ack``
    reports: samples of a response handed to the device minus those the device still holds.

    Args:
        preroll: samples buffered before a response starts (120 ms at 24 kHz, as the page).
        history: samples of recent device blocks remembered for ``played`` (bounds the
            device latency it can account for).
    """

    def __init__(
        self, *, preroll: int = SAMPLE_RATE * 120 // 1000, history: int = SAMPLE_RATE
    ) -> None:
        if preroll < 0 or history <= 0:
            raise ValueError("preroll must be >= 0 and history > 0")
        self.preroll = preroll
        self.history = history
        self._queue: deque[tuple[str, np.ndarray]] = deque()
        self._ended: set[str] = set()
        self._playing: str | None = None
        self._recent: deque[list[Any]] = deque()  # [response_id | None, samples], newest last
        self._recent_total = 0
        self.handed: dict[str, int] = {}
        """Samples of each response handed to the device."""
        self.underruns = 0
        self.dropped = 0
        """Samples dropped unplayed by ``stop``."""

    def add(self, response_id: str, pcm: np.ndarray) -> None:
        """Queue a chunk of ``response_id`` (int16 at 24 kHz)."""
        if len(pcm):
            self._queue.append((response_id, np.asarray(pcm, np.int16)))

    def end(self, response_id: str) -> None:
        """``response_id`` will get no more audio: what it has may start at once."""
        self._ended.add(response_id)

    def depth(self) -> int:
        """Samples waiting for the device."""
        return sum(len(pcm) for _, pcm in self._queue)

    def stop(self) -> None:
        """Drop everything not yet handed to the device."""
        self.dropped += self.depth()
        self._queue.clear()
        self._playing = None

    def pull(self, n: int) -> np.ndarray:
        """The device's next ``n`` samples: queued audio, silence where there is none."""
        out = np.zeros(n, np.int16)
        filled = 0
        while filled < n:
            head = self._startable()
            if head is None:
                break
            rid, pcm = self._queue[0]
            take = min(n - filled, len(pcm))
            out[filled : filled + take] = pcm[:take]
            self._queue[0] = (rid, pcm[take:])
            if take == len(pcm):
                self._queue.popleft()
            self.handed[rid] = self.handed.get(rid, 0) + take
            self._remember(rid, take)
            filled += take
        if filled < n:
            if self._playing is not None and self._playing not in self._ended:
                self.underruns += 1  # ran dry mid-response: wait for the preroll again
            self._playing = None
            self._remember(None, n - filled)
        return out

    def played(self, response_id: str, pending: int) -> int:
        """Samples of ``response_id`` heard when the device still holds the last ``pending``
        samples it was handed."""
        unheard, left = 0, min(pending, self._recent_total)
        for rid, count in reversed(self._recent):
            if left <= 0:
                break
            if rid == response_id:
                unheard += min(count, left)
            left -= count
        return self.handed.get(response_id, 0) - unheard

    def _startable(self) -> str | None:
        """The head response, if it may play now."""
        if not self._queue:
            return None
        rid = self._queue[0][0]
        if self._playing != rid:
            buffered = 0
            for other, pcm in self._queue:
                if other != rid:
                    break
                buffered += len(pcm)
            if buffered < self.preroll and rid not in self._ended:
                return None
            self._playing = rid
        return rid

    def _remember(self, response_id: str | None, samples: int) -> None:
        if self._recent and self._recent[-1][0] == response_id:
            self._recent[-1][1] += samples
        else:
            self._recent.append([response_id, samples])
        self._recent_total += samples
        while self._recent_total - self._recent[0][1] >= self.history:
            self._recent_total -= self._recent.popleft()[1]
