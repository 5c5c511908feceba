"""The layers of duplex, in one table: what each package may import, and what it may not.

As trio's single exports test: one table, one walker (``tests/imports.py``), every
package found from the folder, so a new package or module is checked the day it
is added. A package may import the leaf modules and the packages of lower rank,
only through their ``__init__`` (never a ``_`` module of another package); the
pure layers import no I/O library. Every package's ``__all__`` is complete and
unique.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import duplex

from .imports import imported, modules, within

LEAVES = (
    "duplex.__version__",
    "duplex.exceptions",
    "duplex.pcm",
    "duplex.resample",
    "duplex.metrics",
    "duplex.progress",
    "duplex.logs",
    "duplex.refusals",
)
"""Modules any layer may use: they import no other part of duplex (`logs` only `progress`,
`refusals` only `exceptions`)."""

RANK: dict[str, int] = {
    "duplex.actors": 1,
    "duplex.kernels": 1,
    "duplex.sessions": 2,
    "duplex.codecs": 3,
    "duplex.models": 3,
    "duplex.config": 3,
    "duplex.runtime": 4,
    "duplex.wire": 4,
    "duplex.transport": 5,
    "duplex.services": 6,
    "duplex.topology": 7,
    "duplex.cluster": 8,
    "duplex.cli": 9,
}
"""Each package's layer: it imports only packages of a lower rank (and the leaves).
The import direction of docs/architecture.md: sessions <- wire <- transport <- services <-
topology <- cluster."""

CLIENT = "duplex.client"
"""The Python client speaks the wire only: it imports the PCM scale and the resampler, and
only the CLI imports it (lazily, for ``duplex talk``)."""

PURE = {
    "duplex.sessions": (
        "trio", "torch", "socket", "threading", "asyncio", "time", "select", "random",
        "starlette", "hypercorn",
    ),
    "duplex.wire": ("trio", "starlette", "hypercorn", "wsproto", "socket", "threading", "asyncio"),
    "duplex.codecs": ("trio", "starlette", "hypercorn", "wsproto", "socket", "asyncio"),
    "duplex.kernels": ("trio", "starlette", "hypercorn"),
}  # fmt: skip
"""Packages that are sans-I/O: the libraries they must never import."""

PACKAGES = sorted(
    f"duplex.{info.name}" for info in pkgutil.iter_modules(duplex.__path__) if info.name[0] != "_"
)


def _modules(package: str) -> list[tuple[str, Path]]:
    module = importlib.import_module(package)
    if hasattr(module, "__path__"):
        return list(modules(module))
    return [(package, Path(module.__file__))]  # type: ignore[arg-type]


def _owner(name: str) -> str | None:
    """The package or module of the table (or the client) that ``name`` lies under."""
    for package in (*RANK, CLIENT):
        if within(name, package):
            return package
    return None


def test_every_module_of_duplex_has_a_place_in_the_table() -> None:
    placed = {*RANK, CLIENT, *LEAVES}
    assert [p for p in PACKAGES if p not in placed] == []
    assert {"duplex.wire", "duplex.codecs", "duplex.services", "duplex.transport"} <= set(PACKAGES)


@pytest.mark.parametrize("package", [p for p in PACKAGES if p in RANK or p == CLIENT])
def test_a_package_imports_only_lower_layers_through_their_init(package: str) -> None:
    checked = _modules(package)
    assert checked
    for module, path in checked:
        for line, name in imported(module, path):
            if not within(name, "duplex") or within(name, package):
                continue
            where = f"{module} (line {line}) imports {name}"
            if any(within(name, leaf) for leaf in LEAVES) or name == "duplex":
                continue
            owner = _owner(name)
            assert owner is not None, where
            if package == CLIENT:
                raise AssertionError(f"{where}: the client imports only the leaves")
            if owner == CLIENT:
                assert package == "duplex.cli", f"{where}: only the CLI imports the client"
                continue
            assert RANK[owner] < RANK[package], f"{where}: {owner} is not below {package}"
            inner = name[len(owner) :].split(".")
            assert not any(part.startswith("_") for part in inner), f"{where}: a private module"


@pytest.mark.parametrize("package", sorted(PURE))
def test_the_pure_layers_import_no_io(package: str) -> None:
    for module, path in _modules(package):
        for line, name in imported(module, path):
            banned = [lib for lib in PURE[package] if within(name, lib)]
            assert not banned, f"{module} (line {line}) imports {name}"


@pytest.mark.parametrize("package", PACKAGES)
def test_exports_are_complete_and_unique(package: str) -> None:
    module = importlib.import_module(package)
    exported = getattr(module, "__all__", None)
    if exported is None:
        return
    assert len(exported) == len(set(exported)), package
    for name in exported:
        assert hasattr(module, name), f"{package}.{name}"
