"""The session core is sans-I/O: no trio, torch, sockets, threads, asyncio or clocks.

Every module of ``duplex.sessions`` is checked, found from the folder; the
runtime that wraps the core (``duplex.runtime``) is a sibling package.
"""

from __future__ import annotations

from pathlib import Path

import duplex.exceptions
import duplex.pcm
import duplex.resample
import duplex.sessions

from ..imports import imported, modules, within

FORBIDDEN = (
    "trio",
    "torch",
    "socket",
    "threading",
    "asyncio",
    "time",
    "select",
    "random",
    "duplex.models",
    "duplex.actors",
    "duplex.transport",
    "duplex.runtime",
)
# Within duplex, the core reaches only itself and three leaf modules (which are checked too).
DUPLEX_ALLOWED = ("duplex.sessions", "duplex.exceptions", "duplex.pcm", "duplex.resample")


def test_session_core_imports_no_io_clock_or_upper_layer() -> None:
    checked = [
        *modules(duplex.sessions),
        *((m.__name__, Path(m.__file__)) for m in (duplex.exceptions, duplex.pcm, duplex.resample)),
    ]
    assert len(checked) > 10
    for module, path in checked:
        for line, name in imported(module, path):
            where = f"{module} (line {line}) imports {name}"
            assert not any(within(name, f) for f in FORBIDDEN), where
            if within(name, "duplex"):
                assert any(within(name, a) for a in DUPLEX_ALLOWED), where


def test_exports_are_complete_and_unique() -> None:
    names = duplex.sessions.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(duplex.sessions, name), name
