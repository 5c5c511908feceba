"""Conversation items as the history keeps them: plain frozen values, no audio.

The history (``_ledger.History``) is the source of truth for ``conversation.item.*``;
the audio of user items lives beside it (``_conversation``), so items stay cheap
to copy and compare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

__all__ = ["ITEM_CONTENT_TYPES", "ITEM_ROLES", "HistoryItem"]

ITEM_ROLES: tuple[str, ...] = ("user", "assistant", "system", "tool")
ITEM_CONTENT_TYPES: tuple[str, ...] = ("audio", "text", "function_call", "function_call_output")


@final
@dataclass(frozen=True, slots=True)
class HistoryItem:
    """One conversation item as the model's context should see it.

    ``content`` says whether the item is audio (``audio_ms`` long, ``text`` its
    transcript, if any) or text (``text``), or a tool round trip: a ``function_call``
    (role ``assistant``; ``name``, ``call_id``, ``text`` its arguments) or a
    ``function_call_output`` (role ``tool``; ``call_id``, ``text`` its output).
    ``order`` places it in the conversation.
    """

    item_id: str
    role: str  # "user" | "assistant" | "system"
    order: float
    audio_ms: float
    text: str = ""
    content: str = "audio"
    status: str = "completed"
    call_id: str = ""
    name: str = ""
