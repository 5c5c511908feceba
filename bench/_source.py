"""What a result file records of the code that made it (no heavy imports: any bench may).

A device machine runs a copy of the working tree whose ``.git`` can be stale, and a run
can be made on uncommitted changes: ``tree_digest`` names the code itself, and
``python3 bench/_source.py`` prints it for a checkout, to find the commit a result
file came from.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def source_info() -> dict[str, Any]:
    """The commit ``.git`` names (None without one) and `tree_digest`."""
    try:
        ref = (ROOT / ".git" / "HEAD").read_text().strip()
        if ref.startswith("ref: "):
            ref = (ROOT / ".git" / ref[5:]).read_text().strip()
        commit: str | None = ref
    except OSError:
        commit = None
    return {"commit": commit, "tree_digest": tree_digest()}


def tree_digest() -> str:
    """sha256 (first 16 hex digits) of every ``.py`` file under ``duplex/`` and ``bench/``,
    by path and content."""
    digest = hashlib.sha256()
    for path in sorted([*ROOT.glob("duplex/**/*.py"), *ROOT.glob("bench/**/*.py")]):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    print(tree_digest())
