"""Docs that stay true: docs/operations.md against the CLI and the config schema, and no
committed file that names one machine's paths.

Each check reads the source of truth (the ``duplex serve`` parser, the config's declarations,
the ``SessionConfig`` dataclass, ``git ls-files``), so a flag or key added without its line in
the docs fails here, and so does a line for one that no longer exists.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from duplex.cli import _parser
from duplex.config import DECLARED, SessionConfig, with_table

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = ROOT / "docs" / "operations.md"
OTHER_FLAGS = {"--version", "--help"}
"""Flags of ``duplex`` itself that the docs may name besides ``duplex serve``'s."""


def serve_flags() -> set[str]:
    serve = _parser().parse_args(["serve"]).command_parser
    flags = {flag for action in serve._actions for flag in action.option_strings}
    return {flag for flag in flags if flag.startswith("--")} - {"--help"}


def text() -> str:
    return OPERATIONS.read_text(encoding="utf-8")


def section(heading: str) -> str:
    """The lines under ``heading`` up to the next heading of any level."""
    lines = text().splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return "\n".join(lines[start:end])


def rows(markdown: str) -> list[list[str]]:
    """The body rows of the Markdown tables in ``markdown``, as lists of cells."""
    table = [line for line in markdown.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table]
    return [row for row in cells if not set(row[0]) <= {"-", " "} and row[0] not in ("key", "flag")]


def code(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def toml_value(value: Any) -> str:
    """How the docs write a default: TOML's spelling."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[]" if not value else repr(list(value))
    return repr(value)


def first_table_after(marker: str) -> list[list[str]]:
    lines = text()[text().index(marker) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("| "))
    return rows("\n".join(lines[start:end]))


def test_the_config_table_is_generated_from_the_declarations() -> None:
    """Regenerate it (``python -m duplex.config --write-doc``) and compare."""
    assert with_table(text(), DECLARED) == text()


def test_every_serve_flag_is_in_the_config_table() -> None:
    table = rows(section("### Every key"))
    documented = {flag.split()[0] for row in table for flag in code(row[5])}
    assert documented | {"--config"} == serve_flags()


def test_every_flag_the_docs_name_exists() -> None:
    """Outside the commands of other programs (``python bench/... --targets``, ``python -m
    duplex.config --write-doc``)."""
    prose = re.sub(r"`python (bench/|tools/|-m duplex\.config)[^`]*`", "", text(), flags=re.S)
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", prose))
    assert named - serve_flags() - OTHER_FLAGS == set()


@pytest.mark.parametrize(
    ("heading", "schema", "env_prefix"),
    [
        ("### `[session]`", SessionConfig, "DUPLEX_SESSION__"),
    ],
)
def test_the_config_tables_are_the_schema(heading: str, schema: type, env_prefix: str) -> None:
    fields = {field.name: field for field in dataclasses.fields(schema)}
    documented: list[str] = []
    for row in rows(section(heading)):
        keys, default, env = code(row[0]), row[2], row[3]
        documented += keys
        for key in keys:
            assert key in fields, f"{heading} documents {key!r}, which is no config key"
            field = fields[key]
            value = field.default
            if value is dataclasses.MISSING:
                value = field.default_factory()  # type: ignore[misc]
            if value is None:  # TOML has no null: such a key is set per session only
                assert "not configurable" in row[4], row
                continue
            assert f"{env_prefix}{key.upper()}" in env, row
            assert code(default)[0] == toml_value(value), (key, default)
    assert sorted(documented) == sorted(fields), f"{heading}: keys missing from the docs"


FORBIDDEN = re.compile(r"/work/|/root/|/home/[a-z_][a-z0-9_-]*/")
"""Absolute paths of one machine: a committed file gives repository-relative paths."""


def test_no_committed_file_names_a_machine_path() -> None:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    offenders = []
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or name == "tests/test_docs.py":
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary: fixtures, weights
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                offenders.append(f"{name}:{number}: {line.strip()[:120]}")
    assert offenders == []


def test_no_doc_cites_a_file_outside_the_repository() -> None:
    cited = re.compile(r"\.\./shared/|\bshared/[\w./-]+\.md|FACTS\.md|ARCHITECTURE\.md")
    names = [ROOT / "README.md", ROOT / "pyproject.toml", *sorted((ROOT / "docs").rglob("*.md"))]
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in names
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if cited.search(line)
    ]
    assert offenders == []
