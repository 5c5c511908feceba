"""The package surface: complete unique exports, final classes, and import direction."""

from __future__ import annotations

import ast
import inspect
from enum import Enum
from pathlib import Path
from typing import Protocol

import duplex.models as models

PACKAGE = Path(models.__file__).parent
SANS_TRIO = (
    "_interface.py",
    "_scheduler.py",
    "_engine.py",
    "_loopback.py",
    "_registry.py",
    "_silero.py",
    "_policy.py",
    "_batcher.py",
    "_policy_reference.py",
)
# The trio loops: the engines' tick driver (the model's and the shared VAD's), the tick
# grid and fan-out (`_ticker.py`), the request engines' batching loop (`_requests.py`,
# around the trio-free `RequestBatcher`) and the windows between ticks they share with the
# tick driver (`_slack.py`). Each driver wraps a synchronous, trio-free core (`Engine`,
# with any runner, the silero VAD's among them; a `BatchRunner`) that is tested without trio.
TRIO_DRIVERS = {"_driver.py", "_ticker.py", "_requests.py", "_slack.py"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_all_is_unique_and_resolves() -> None:
    assert len(models.__all__) == len(set(models.__all__))
    for name in models.__all__:
        assert name in vars(models), name


def test_public_classes_are_final() -> None:
    for name in models.__all__:
        obj = vars(models)[name]
        if not inspect.isclass(obj) or Protocol in obj.__mro__ or issubclass(obj, Enum):
            continue  # values, aliases, protocols and enums may not be final
        assert obj.__dict__.get("__final__", False), name


def test_only_the_drivers_import_trio() -> None:
    for path in PACKAGE.glob("*.py"):
        uses_trio = any(n == "trio" or n.startswith("trio.") for n in _imports(path))
        assert uses_trio == (path.name in TRIO_DRIVERS), path.name
    assert {p.name for p in PACKAGE.glob("*.py")} >= set(SANS_TRIO)
