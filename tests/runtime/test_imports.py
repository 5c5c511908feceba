"""The session runtime sits between the core and transport: it never imports transport."""

from __future__ import annotations

import duplex.runtime

from ..imports import imported, modules, within


def test_runtime_imports_no_transport() -> None:
    for module, path in modules(duplex.runtime):
        for line, name in imported(module, path):
            assert not within(name, "duplex.transport"), f"{module} (line {line}) imports {name}"


def test_exports_are_complete_and_unique() -> None:
    names = duplex.runtime.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(duplex.runtime, name), name
