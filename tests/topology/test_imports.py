"""The topology sits on top of everything: it takes other packages only through their
``__init__``, and nothing below it imports it (transport never knows where it runs)."""

from __future__ import annotations

import pkgutil

import duplex
import duplex.topology

from ..imports import imported, modules, within

PACKAGES = [f"duplex.{info.name}" for info in pkgutil.iter_modules(duplex.__path__) if info.ispkg]
ABOVE = {"duplex.topology", "duplex.cluster"}  # the cluster runs topologies: it may import them
BELOW = [package for package in PACKAGES if package not in ABOVE]


def test_the_packages_are_found() -> None:
    assert {"duplex.transport", "duplex.runtime", "duplex.models", "duplex.topology"} <= set(
        PACKAGES
    )


def test_topology_imports_no_private_module_of_another_package() -> None:
    checked = list(modules(duplex.topology))
    assert len(checked) >= 7
    for module, path in checked:
        for line, name in imported(module, path):
            for package in BELOW:
                if within(name, package):
                    inner = name[len(package) :].split(".")
                    assert not any(part.startswith("_") for part in inner), (
                        f"{module} (line {line}) imports {name}"
                    )


def test_no_package_below_imports_the_topology() -> None:
    for package in BELOW:
        for module, path in modules(__import__(package, fromlist=["_"])):
            for line, name in imported(module, path):
                assert not within(name, "duplex.topology"), f"{module} (line {line}) imports {name}"
