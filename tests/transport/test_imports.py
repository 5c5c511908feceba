"""Transport sits on top: it takes the other duplex packages only through their ``__init__``.

Every module under ``duplex/transport`` is checked, found from the folder, and so
is every other package of duplex (``duplex.sessions``, ``duplex.runtime``,
``duplex.actors``, ``duplex.models``, ...): none of their ``_``-prefixed modules
is imported by transport.
"""

from __future__ import annotations

import pkgutil

import duplex
import duplex.transport

from ..imports import imported, modules, within

OTHERS = [
    f"duplex.{info.name}"
    for info in pkgutil.iter_modules(duplex.__path__)
    if info.ispkg and info.name != "transport"
]


def test_the_other_packages_are_found() -> None:
    assert {"duplex.sessions", "duplex.runtime", "duplex.actors", "duplex.models"} <= set(OTHERS)


def test_transport_imports_no_private_module_of_another_package() -> None:
    checked = list(modules(duplex.transport))
    assert len(checked) > 10
    for module, path in checked:
        for line, name in imported(module, path):
            for package in OTHERS:
                if within(name, package):
                    inner = name[len(package) :].split(".")
                    assert not any(part.startswith("_") for part in inner), (
                        f"{module} (line {line}) imports {name}"
                    )
