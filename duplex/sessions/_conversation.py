"""Conversation items: the history as the source of truth for ``conversation.item.*``.

`Conversation` reads the turn-taking's `History` (one history per session, written only
by `TurnTaking`: the items change through its methods) with
what the Realtime item events need: client-created items placed after a given
item, retrieval, deletion, and the audio of user items (kept beside the history,
model rate, only while the item is in it) for the turn responder. Refusals are
raised before anything changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np

from duplex.exceptions import BadEvent, ItemNotFound

from ._events import ItemAdded, ItemCreate, Pcm
from ._items import HistoryItem
from ._resample import StreamingResampler
from ._responder import ResponderSource

if TYPE_CHECKING:
    from ._ledger import History

__all__ = ["ROOT", "Conversation", "HistoryOwner"]

ROOT = "root"
"""``previous_item_id`` that places an item first."""


class HistoryOwner(Protocol):
    """The history's owner (`TurnTaking`), as the conversation uses it."""

    @property
    def history(self) -> History: ...

    def next_order(self) -> int: ...

    def add_user_item(self, item_id: str, audio_ms: float) -> None: ...

    def insert_item(self, item: HistoryItem) -> None: ...

    def remove_item(self, item_id: str) -> bool: ...


class Conversation:
    """Item operations over one session's history.

    Args:
        owner: the history's owner (turn taking): the conversation reads the history and
            changes it only through the owner.
        new_id: makes ``item_<hex>`` ids.
        model_rate: the model sample rate (item audio is resampled to it).
    """

    def __init__(
        self,
        owner: HistoryOwner,
        *,
        new_id: Callable[[str], str],
        model_rate: int,
    ) -> None:
        self._owner = owner
        self._next_order = owner.next_order
        self._new_id = new_id
        self._rate = model_rate
        self._audio: dict[str, tuple[Pcm, float]] = {}

    @property
    def history(self) -> History:
        """The session's history, to read (its owner writes it)."""
        return self._owner.history

    def last_item_id(self) -> str | None:
        """The newest item's id, if any."""
        items = self.history.items
        return items[-1].item_id if items else None

    def previous_of(self, item_id: str) -> str | None:
        """The id of the item before ``item_id`` (``None``: it is first)."""
        previous = None
        for item in self.history.items:
            if item.item_id == item_id:
                return previous
            previous = item.item_id
        return previous

    def add_user_audio(
        self, item_id: str, audio_ms: float, pcm: Pcm | None, start_ms: float
    ) -> None:
        """A committed user turn (``pcm`` kept for the responder when given)."""
        self._owner.add_user_item(item_id, audio_ms)
        if pcm is not None:
            self._audio[item_id] = (pcm, start_ms)
        self._prune()

    def create(self, event: ItemCreate, input_rate: int) -> ItemAdded:
        """``conversation.item.create``: place the item; returns the event announcing it.

        Raises:
            BadEvent: the id is taken (``item.id``).
            ItemNotFound: ``previous_item_id`` names no item.
        """
        ids = [item.item_id for item in self.history.items]
        item_id = event.item_id or self._new_id("item")
        if item_id in ids or item_id == ROOT:
            raise BadEvent(f"item {item_id!r} already exists", param="item.id")
        order = self._order_after(event.previous_item_id, ids)
        pcm: Pcm | None = None
        if event.pcm is not None:
            rate = event.sample_rate or input_rate
            pcm = StreamingResampler(rate, self._rate).process(event.pcm)
            item = HistoryItem(item_id, "user", order, pcm.size * 1000.0 / self._rate)
        elif event.kind != "message":
            item = HistoryItem(
                item_id,
                event.role,
                order,
                0.0,
                event.text or "",
                event.kind,
                call_id=event.call_id or "",
                name=event.name or "",
            )
        else:
            item = HistoryItem(item_id, event.role, order, 0.0, event.text or "", "text")
        self._owner.insert_item(item)
        if pcm is not None:
            self._audio[item_id] = (pcm, 0.0)
        self._prune()
        return ItemAdded(item, self.previous_of(item_id))

    def get(self, item_id: str) -> HistoryItem:
        """The item with that id.

        Raises:
            ItemNotFound: no such item (``param`` is ``item_id``).
        """
        for item in self.history.items:
            if item.item_id == item_id:
                return item
        raise ItemNotFound(f"no conversation item {item_id!r}", param="item_id")

    def delete(self, item_id: str) -> None:
        """Remove the item and its audio.

        Raises:
            ItemNotFound: no such item.
        """
        self.get(item_id)
        self._owner.remove_item(item_id)
        self._audio.pop(item_id, None)

    def latest_user_source(self) -> ResponderSource | None:
        """What the turn responder answers: the newest user or tool item, if any."""
        return self.latest_source()

    def latest_source(self, only: tuple[str, ...] | None = None) -> ResponderSource | None:
        """The newest user item (audio or text) or tool result (a ``function_call_output``:
        the responder continues from it), among the items named in ``only`` if given.

        Raises:
            ItemNotFound: ``only`` names an item that is not in the conversation.
        """
        items = self.history.items
        if only is not None:
            by_id = {item.item_id: item for item in items}
            missing = [item_id for item_id in only if item_id not in by_id]
            if missing:
                raise ItemNotFound(
                    f"response.input names no item {missing[0]!r}", param="response.input"
                )
            items = tuple(by_id[item_id] for item_id in only)
        for item in reversed(items):
            if item.role not in ("user", "tool"):
                continue
            if item.content != "audio":
                return ResponderSource(item.item_id, None, 0.0, item.text)
            pcm, start_ms = self._audio.get(item.item_id, (np.zeros(0, np.float32), 0.0))
            return ResponderSource(item.item_id, pcm, start_ms)
        return None

    def _order_after(self, previous_id: str | None, ids: list[str]) -> float:
        items = self.history.items
        if previous_id is None:
            return self._next_order()
        if previous_id == ROOT:
            return items[0].order - 1.0 if items else self._next_order()
        if previous_id not in ids:
            raise ItemNotFound(
                f"previous_item_id {previous_id!r} names no item", param="previous_item_id"
            )
        at = ids.index(previous_id)
        if at == len(items) - 1:
            return self._next_order()
        return (items[at].order + items[at + 1].order) / 2.0

    def _prune(self) -> None:
        live = {item.item_id for item in self.history.items}
        for item_id in [i for i in self._audio if i not in live]:
            del self._audio[item_id]
