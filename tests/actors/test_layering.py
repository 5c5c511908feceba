"""duplex.actors is the bottom layer: it imports no other duplex package."""

from __future__ import annotations

import ast
from pathlib import Path

import duplex.actors

ALLOWED = {"duplex.exceptions", "duplex.logs", "duplex.metrics"}


def test_actors_import_only_the_shared_modules() -> None:
    root = Path(duplex.actors.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("duplex"):
                    assert name in ALLOWED, f"{path.name} imports {name}"


def test_exports_are_complete_and_unique() -> None:
    exported = duplex.actors.__all__
    assert len(exported) == len(set(exported))
    for name in exported:
        assert getattr(duplex.actors, name) is not None
