"""What each module of a package imports, read from its source with `ast` (layering tests).

Modules are found from the package's folder, so a new module is checked the day
it is added; relative imports are resolved to absolute names, so ``from ..x
import y`` cannot climb out of a package unseen.
"""

from __future__ import annotations

import ast
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType


def modules(package: ModuleType) -> Iterator[tuple[str, Path]]:
    """``(dotted name, path)`` of the package's ``__init__`` and every module under it."""
    yield package.__name__, Path(package.__file__)  # type: ignore[arg-type]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        spec = info.module_finder.find_spec(info.name, None)  # type: ignore[call-arg]
        assert spec is not None and spec.origin is not None, info.name
        yield info.name, Path(spec.origin)


def imported(name: str, path: Path) -> Iterator[tuple[int, str]]:
    """``(line, absolute name)`` of everything module ``name`` (at ``path``) imports.

    ``from a.b import c`` yields ``a.b.c`` (``c`` may be a module or an attribute;
    either way it lies under ``a.b``); imports inside functions count too.
    """
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                assert node.level - 1 < len(parts), f"{path}:{node.lineno} climbs out of duplex"
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                yield node.lineno, module if alias.name == "*" else f"{module}.{alias.name}"


def within(name: str, prefix: str) -> bool:
    """``name`` is ``prefix`` or lies under it."""
    return name == prefix or name.startswith(prefix + ".")
