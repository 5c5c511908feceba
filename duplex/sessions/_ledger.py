"""Ledgers: what was generated, sent, played and committed; what input is pending.

Plain numbers only (vllm's scheduler habit): the machine decides with them,
nothing here sends or knows about sockets.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import final

from ._items import HistoryItem
from ._journal import JournalStatistics

__all__ = [
    "History",
    "HistoryItem",
    "InputLedger",
    "InputStatistics",
    "PlaybackLedger",
    "SessionStatistics",
]


@dataclass(slots=True)
class PlaybackLedger:
    """One response's audio accounting, in milliseconds.

    ``generated_ms`` counts current-epoch model output; ``sent_ms`` what went
    to the client (or its journal); ``played_ms`` the client's acks (never more
    than sent); ``committed_ms`` what the conversation history keeps.
    ``order`` places the response among history items. ``status`` is its item's
    (``in_progress`` until the response ends, then ``completed`` or ``incomplete``);
    ``deleted``: the client deleted the item, which never comes back.
    """

    response_id: str
    item_id: str
    order: float
    generated_ms: float = 0.0
    sent_ms: float = 0.0
    played_ms: float = 0.0
    committed_ms: float = 0.0
    done: bool = False
    status: str = "in_progress"
    deleted: bool = False
    text_only: bool = False
    """A text-only response: no audio; its item is text."""
    out_of_band: bool = False
    """``conversation: "none"``: the item never joins the history."""
    text_frames: int = 0
    """Frames that carried text (the output tokens ``max_output_tokens`` counts)."""
    _text: list[tuple[float, str]] = field(default_factory=list, repr=False)

    def record(self, audio_ms: float, text: str) -> float:
        """Account one sent frame; returns its start on the response's audio clock."""
        start = self.sent_ms
        self.generated_ms += audio_ms
        self.sent_ms += audio_ms
        if text:
            self._text.append((start, text))
            self.text_frames += 1
        return start

    @property
    def transcript(self) -> str:
        """Everything sent, in order: the concatenation of the transcript deltas."""
        return "".join(text for _, text in self._text)

    def committed_transcript(self) -> str:
        """Text whose audio starts before ``committed_ms`` (all of it once fully committed)."""
        if self.committed_ms >= self.sent_ms:
            return self.transcript
        return "".join(text for start, text in self._text if start < self.committed_ms)


class History:
    """Conversation items in ``order``; bounded, oldest dropped and counted."""

    def __init__(self, max_items: int) -> None:
        self._items: deque[HistoryItem] = deque()
        self._max = max_items
        self.dropped = 0

    @property
    def items(self) -> tuple[HistoryItem, ...]:
        """A read-only snapshot, oldest first."""
        return tuple(self._items)

    def has_user_after(self, order: float) -> bool:
        """Whether a user item newer than ``order`` is already in the history."""
        return any(i.role == "user" and i.order > order for i in self._items)

    def add_user(self, item_id: str, order: float, audio_ms: float) -> None:
        """Append a committed user turn."""
        self._put(HistoryItem(item_id, "user", order, audio_ms))

    def commit_assistant(self, ledger: PlaybackLedger, *, insert: bool = True) -> None:
        """Insert or update the assistant item of ``ledger`` at its place in order.

        ``insert=False`` only updates an item already there. A deleted item is left out.
        """
        if ledger.deleted or ledger.out_of_band:
            return
        item = HistoryItem(
            ledger.item_id,
            "assistant",
            ledger.order,
            ledger.committed_ms,
            ledger.committed_transcript(),
            "text" if ledger.text_only else "audio",
            status=ledger.status,
        )
        for index, existing in enumerate(self._items):
            if existing.item_id == item.item_id:
                self._items[index] = item
                return
        if insert:
            self._put(item)

    def insert(self, item: HistoryItem) -> None:
        """Place an item at its ``order`` (client-created items)."""
        self._put(item)

    def set_text(self, item_id: str, text: str) -> bool:
        """Give the item with that id its text (a user audio item's transcript); ``False``
        if there is none (deleted, or dropped from a full history)."""
        for index, existing in enumerate(self._items):
            if existing.item_id == item_id:
                self._items[index] = dataclasses.replace(existing, text=text)
                return True
        return False

    def remove(self, item_id: str) -> bool:
        """Delete the item with that id; ``False`` if there is none."""
        for index, existing in enumerate(self._items):
            if existing.item_id == item_id:
                del self._items[index]
                return True
        return False

    def _put(self, item: HistoryItem) -> None:
        items = list(self._items)
        at = len(items)
        while at > 0 and items[at - 1].order > item.order:
            at -= 1
        self._items.insert(at, item)
        while len(self._items) > self._max:
            self._items.popleft()
            self.dropped += 1


@final
@dataclass(frozen=True, slots=True)
class InputStatistics:
    """Input ledger snapshot."""

    pending_bytes: int
    pending_turns: int
    max_pending_bytes: int
    max_pending_turns: int
    peak_pending_bytes: int
    rejected_appends: int
    rejected_commits: int


class InputLedger:
    """Input the model has not consumed yet, in PCM16 bytes at the model rate.

    Over either limit the caller refuses the event with ``input_backpressure``;
    nothing is dropped here.
    """

    def __init__(self, *, max_bytes: int, max_turns: int) -> None:
        self._max_bytes = max_bytes
        self._max_turns = max_turns
        self.pending_bytes = 0
        self.pending_turns = 0
        self._peak = 0
        self.rejected_appends = 0
        self.rejected_commits = 0

    def try_append(self, nbytes: int) -> bool:
        """Account ``nbytes`` of input, or refuse (and count) if over the byte limit."""
        if self.pending_bytes + nbytes > self._max_bytes:
            self.rejected_appends += 1
            return False
        self.pending_bytes += nbytes
        self._peak = max(self._peak, self.pending_bytes)
        return True

    def consume(self, nbytes: int) -> None:
        """The model took ``nbytes`` of input."""
        self.pending_bytes = max(0, self.pending_bytes - nbytes)

    def try_commit_turn(self) -> bool:
        """Account one committed turn, or refuse (and count) if too many are unanswered."""
        if self.pending_turns >= self._max_turns:
            self.rejected_commits += 1
            return False
        self.pending_turns += 1
        return True

    def answered(self) -> None:
        """A response started: the model has answered every committed turn."""
        self.pending_turns = 0

    def clear(self) -> None:
        """The model dropped its queued input."""
        self.pending_bytes = 0
        self.pending_turns = 0

    def statistics(self) -> InputStatistics:
        """Pending amounts, limits and refusals."""
        return InputStatistics(
            pending_bytes=self.pending_bytes,
            pending_turns=self.pending_turns,
            max_pending_bytes=self._max_bytes,
            max_pending_turns=self._max_turns,
            peak_pending_bytes=self._peak,
            rejected_appends=self.rejected_appends,
            rejected_commits=self.rejected_commits,
        )


@final
@dataclass(frozen=True, slots=True)
class SessionStatistics:
    """Counters of one session; every drop is here."""

    events_journaled: int
    connection_events_sent: int
    errors: int
    stale_frames_dropped: int
    held_frames_dropped: int
    stale_client_events: int
    ignored_events: int
    responses_created: int
    responses_done: int
    barge_ins: int
    backchannels: int
    pauses: int
    resumes: int
    session_resumes: int
    takeovers: int
    resume_failures: int
    model_frames_ignored: int
    auto_turns_skipped: int
    responder_frames_dropped: int
    history_dropped: int
    input: InputStatistics
    journal: JournalStatistics
    agent_chunks_dropped: int = 0
    transcripts_dropped: int = 0
    replies_prepared: int = 0
    prepared_replies_used: int = 0
    prepared_replies_discarded: int = 0
    tool_calls_cut: int = 0
    """Agent tool calls whose response ended (or another call began) before their last
    piece: outputs of the response, not in the history."""
