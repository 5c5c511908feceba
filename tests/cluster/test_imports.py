"""The cluster is the top layer: it takes other packages through their ``__init__`` only,
and nothing in duplex imports it (a server never knows it is a cluster node)."""

from __future__ import annotations

import pkgutil

import duplex
import duplex.cluster

from ..imports import imported, modules, within

PACKAGES = [f"duplex.{info.name}" for info in pkgutil.iter_modules(duplex.__path__) if info.ispkg]
OTHERS = [package for package in PACKAGES if package != "duplex.cluster"]


def test_the_cluster_imports_no_private_module_of_another_package() -> None:
    checked = list(modules(duplex.cluster))
    assert len(checked) >= 6
    for module, path in checked:
        for line, name in imported(module, path):
            for package in OTHERS:
                if within(name, package):
                    inner = name[len(package) :].split(".")
                    assert not any(part.startswith("_") for part in inner), (
                        f"{module} (line {line}) imports {name}"
                    )


def test_nothing_else_imports_the_cluster() -> None:
    for package in OTHERS:
        for module, path in modules(__import__(package, fromlist=["_"])):
            for line, name in imported(module, path):
                assert not within(name, "duplex.cluster"), f"{module} (line {line}) imports {name}"
