"""Transport sits on top: it takes sessions and the runtime only through their ``__init__``.

Every module under ``duplex/transport`` is checked, found from the folder: none
imports a ``_``-prefixed module of ``duplex.sessions`` or ``duplex.runtime``.
"""

from __future__ import annotations

import duplex.transport

from ..imports import imported, modules, within

LOWER = ("duplex.sessions", "duplex.runtime")


def test_transport_imports_no_private_session_or_runtime_module() -> None:
    checked = list(modules(duplex.transport))
    assert len(checked) > 10
    for module, path in checked:
        for line, name in imported(module, path):
            for package in LOWER:
                if within(name, package):
                    inner = name[len(package) :].split(".")
                    assert not any(part.startswith("_") for part in inner), (
                        f"{module} (line {line}) imports {name}"
                    )
