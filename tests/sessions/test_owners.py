"""One owner per piece of state (docs/architecture.md, "Who owns which state"): the checks
that a second writer has not crept back in."""

from __future__ import annotations

import re
from pathlib import Path

import duplex

ROOT = Path(duplex.__file__).parent
HISTORY_WRITES = re.compile(r"\bhistory\.(add_user|insert|remove|set_text|commit_assistant)\(")


def test_only_turn_taking_writes_the_history() -> None:
    writers = sorted(
        path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*.py")
        if HISTORY_WRITES.search(path.read_text())
    )
    assert writers == ["sessions/_turns.py"]


def test_one_pcm16_scale() -> None:
    """``duplex.pcm`` is the one int16 <-> float scale: no module divides by 32768 or
    multiplies by 32767 itself."""
    by_hand = re.compile(r"[/*]\s*3276[78]\.?0?\b")
    found = sorted(
        path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*.py")
        if path.name != "pcm.py" and by_hand.search(path.read_text())
    )
    assert found == []
