"""``duplex.client`` speaks the wire only: it imports no other duplex module but the two
numpy-only leaves (the PCM scale and the resampler), and no server package imports it (only
the CLI does, lazily, for ``duplex talk``)."""

from __future__ import annotations

import pkgutil

import duplex
import duplex.client

from ..imports import imported, modules, within

LEAVES = ("duplex.pcm", "duplex.resample")
SERVER_PACKAGES = [
    f"duplex.{info.name}"
    for info in pkgutil.iter_modules(duplex.__path__)
    if info.ispkg and info.name != "client"
]


def test_the_client_imports_nothing_of_the_server() -> None:
    checked = list(modules(duplex.client))
    assert len(checked) >= 3
    for module, path in checked:
        for line, name in imported(module, path):
            allowed = any(within(name, m) for m in ("duplex.client", *LEAVES))
            assert not within(name, "duplex") or allowed, f"{module} (line {line}) imports {name}"


def test_no_server_package_imports_the_client() -> None:
    assert "duplex.transport" in SERVER_PACKAGES
    for package in SERVER_PACKAGES:
        for module, path in modules(__import__(package, fromlist=["_"])):
            for line, name in imported(module, path):
                assert not within(name, "duplex.client"), f"{module} (line {line}) imports {name}"
