"""How a config key is declared, once: its help and its flag sit on the dataclass field.

Everything else a user sees is derived from the sections' fields: the TOML key
(``[section] key``), the environment name (``DUPLEX_<SECTION>__<KEY>``), the
``duplex serve`` flag, the old flat name (``[server] <alias>``, ``DUPLEX_<ALIAS>``,
from before the keys had sections) and the table in docs/operations.md.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, final, get_args, get_origin, get_type_hints

__all__ = ["ENV_PREFIX", "Declared", "Setting", "declared", "setting"]

ENV_PREFIX = "DUPLEX_"
_META = "duplex.config"
"""The key of a field's metadata that holds its `Setting`."""


Count = int | Literal["auto"]
"""A number of processes, or ``auto``: chosen at startup from the machine (the ``count``
kind: a flag, env or TOML value is a whole number or the word ``auto``)."""


@final
@dataclass(frozen=True, slots=True)
class Setting:
    """What one field declares besides its type and default.

    Args:
        help: what the key does and its rule, in Markdown (the docs table shows it as is;
            ``--help`` without the Markdown).
        flag: its ``duplex serve`` flag (``--model-device``), if it has one. A ``tuple``
            key's flag is repeatable and names one item (``--api-key``); a ``bool`` key
            that defaults to true also gets ``--no-<flag>``.
        metavar: what ``--help`` calls the flag's value.
        alias: the key's name in the flat ``[server]`` table it had before sections, when
            it differs from its own (``agent.asr_workers`` was ``agent_asr_workers``).
    """

    help: str
    flag: str | None = None
    metavar: str | None = None
    alias: str | None = None


def setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    metavar: str | None = None,
    alias: str | None = None,
    repr: bool = True,
) -> Any:
    """A dataclass field that declares its key (see `Setting`); ``repr=False`` keeps a
    secret out of the config's repr."""
    meta = Setting(help, flag, metavar, alias)
    return dataclasses.field(default=default, repr=repr, metadata={_META: meta})


@final
@dataclass(frozen=True, slots=True)
class Declared:
    """One key of a section, with everything derived from its declaration."""

    section: str
    key: str
    hint: Any
    default: Any
    setting: Setting

    @property
    def name(self) -> str:
        """``section.key``: the canonical name."""
        return f"{self.section}.{self.key}"

    @property
    def env(self) -> str:
        """The canonical environment name: ``DUPLEX_<SECTION>__<KEY>``."""
        return f"{ENV_PREFIX}{self.section.upper()}__{self.key.upper()}"

    @property
    def flat(self) -> str:
        """Its name in the flat ``[server]`` table (and ``DUPLEX_<FLAT>``), old and kept."""
        return self.setting.alias or self.key

    @property
    def flat_env(self) -> str:
        return f"{ENV_PREFIX}{self.flat.upper()}"

    @property
    def kind(self) -> Literal["bool", "int", "float", "str", "list", "choice", "count"]:
        if self.hint == Count:
            return "count"
        if get_origin(self.hint) is Literal:
            return "choice"
        if get_origin(self.hint) is tuple:
            return "list"
        if self.hint in (bool, int, float, str):
            return self.hint.__name__  # type: ignore[no-any-return]
        raise TypeError(f"{self.name}: unsupported config type {self.hint!r}")

    @property
    def choices(self) -> tuple[str, ...]:
        return get_args(self.hint) if self.kind == "choice" else ()


def declared(sections: Sequence[tuple[str, type[Any]]]) -> tuple[Declared, ...]:
    """Every declared key of ``sections`` (name, dataclass), in declaration order.

    Raises:
        TypeError: a field declares no `Setting`, has a type the loader cannot read, or
            two keys share a flat name (the old ``[server]`` table would be ambiguous).
    """
    rows = []
    for section, cls in sections:
        hints = get_type_hints(cls)
        for field in dataclasses.fields(cls):
            meta = field.metadata.get(_META)
            if not isinstance(meta, Setting):
                raise TypeError(f"{section}.{field.name}: declared without setting()")
            hint = hints[field.name]
            if get_origin(hint) in (typing.Union, types.UnionType) and hint != Count:
                raise TypeError(f"{section}.{field.name}: optional values are not configurable")
            row = Declared(section, field.name, hint, field.default, meta)
            row.kind  # noqa: B018  a type the loader cannot read fails here, at import
            rows.append(row)
    flats = [row.flat for row in rows]
    twice = sorted({flat for flat in flats if flats.count(flat) > 1})
    if twice:
        raise TypeError(f"two config keys share the flat name(s) {twice}")
    return tuple(rows)
