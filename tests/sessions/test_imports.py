"""The session core is sans-I/O: no trio, torch, sockets, threads, asyncio or clocks."""

import ast
import pathlib

import duplex.sessions

FORBIDDEN = {"trio", "torch", "socket", "threading", "asyncio", "time", "select", "random"}
# The sans-I/O core. The session actor modules in the same package wrap it and may use trio.
CORE = [
    "_admission",
    "_checks",
    "_config",
    "_conversation",
    "_effects",
    "_events",
    "_input",
    "_items",
    "_journal",
    "_ledger",
    "_resample",
    "_responder",
    "_resume",
    "_server_events",
    "_state",
    "_turns",
    "_user_turns",
    "_vad",
]


def test_session_core_imports_no_io_or_clock():
    root = pathlib.Path(duplex.sessions.__file__).parent
    for path in (root / f"{name}.py" for name in CORE):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert (
                    not node.module.startswith("duplex.")
                    or node.module in ("duplex.exceptions", "duplex.pcm")
                    or node.module == "duplex"
                ), path.name


def test_exports_are_complete_and_unique():
    names = duplex.sessions.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(duplex.sessions, name), name
