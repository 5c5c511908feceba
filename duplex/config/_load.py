"""Building the config from its layers: defaults, then a TOML file, then ``DUPLEX_*``
environment, then command-line flags.

Every value is checked at startup; a bad one stops the server with a message that names
the key as the user wrote it, where it came from and the rule it broke. The old flat
names (``[server] image_model``, ``DUPLEX_IMAGE_MODEL``, ``server.image_model``) are
read as their section's key: the alias table is derived from the declarations.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, final, get_args, get_origin, get_type_hints

from duplex.exceptions import ConfigError
from duplex.sessions import SessionConfig

from ._declare import ENV_PREFIX, Count, Declared, declared
from ._sections import (
    AccessConfig,
    AgentConfig,
    Config,
    EngineConfig,
    MediaConfig,
    PolicyConfig,
    ServerConfig,
    SpeechConfig,
)

__all__ = ["ALIASES", "DECLARED", "SECTIONS", "api_keys_of", "load_config"]

SECTIONS: Final[dict[str, type[Any]]] = {
    "server": ServerConfig,
    "access": AccessConfig,
    "engine": EngineConfig,
    "agent": AgentConfig,
    "speech": SpeechConfig,
    "media": MediaConfig,
    "policy": PolicyConfig,
    "session": SessionConfig,
}
"""Every section of `Config`, in its order (``session`` is the sessions' own config)."""

DECLARED: Final = declared([(name, cls) for name, cls in SECTIONS.items() if name != "session"])
"""Every declared key: flags, environment names, aliases and the docs table come from it."""

ALIASES: Final[dict[str, Declared]] = {row.flat: row for row in DECLARED}
"""The flat ``[server]`` names (``image_model``, ``agent_asr_workers``, ``port``) to the key
each now is (``media.image_model``, ``agent.asr_workers``, ``server.port``)."""


@final
@dataclass(frozen=True, slots=True)
class _Given:
    value: Any
    source: str
    written: str
    """The key as the source wrote it (``server.tts_max_queue``, ``speech.max_queue``)."""
    layer: str
    """``file``, ``env`` or ``flags``: one key given twice in one layer is refused."""


_Layers = dict[str, dict[str, _Given]]


def load_config(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the config from its layers; ``overrides`` keys are ``section.key`` (the flags;
    ``server.<flat name>`` too).

    Raises:
        ConfigError: unknown key, a key given twice in one layer, wrong type, or a value that
            breaks a rule.
    """
    layers: _Layers = {name: {} for name in SECTIONS}
    if path is not None:
        _merge_file(layers, Path(path))
    _merge_env(layers, os.environ if env is None else env)
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        _put(layers, section, key, value, "command line", "flags")
    built: dict[str, Any] = {}
    for section, cls in SECTIONS.items():
        hints = get_type_hints(cls)
        given = layers[section]
        kwargs = {
            key: _coerce(found.written, hints[key], found.value, found.source)
            for key, found in given.items()
        }
        try:
            built[section] = cls(**kwargs)
        except ConfigError as exc:
            sources = {key: found.source for key, found in given.items()}
            if section == "session":  # the sessions' own messages start with the key
                raise ConfigError(f"{section}.{exc} (sources: {sources or 'defaults'})") from None
            raise _named(exc, f"{section}.{exc.key}", layers, sources) from None
    try:
        return Config(**built)
    except ConfigError as exc:  # a rule across sections: every source may matter
        sources = {
            f"{section}.{key}": found.source
            for section, given in layers.items()
            for key, found in given.items()
        }
        raise _named(exc, str(exc.key), layers, sources) from None


def _named(exc: ConfigError, name: str, layers: _Layers, sources: dict[str, str]) -> ConfigError:
    """``exc`` (raised by `refuse`) with its key named as the user wrote it, and ``sources``."""
    section, _, key = name.partition(".")
    rule = str(exc).removeprefix(f"{exc.key}: ")
    found = layers[section].get(key)
    shown = found.written if found is not None else name
    if shown != name:
        rule += f" ({shown} is {name})"
    return ConfigError(f"{shown}: {rule} (sources: {sources or 'defaults'})", key=name)


def _put(layers: _Layers, section: str, key: str, value: Any, source: str, layer: str) -> None:
    written = f"{section}.{key}"
    cls = SECTIONS.get(section)
    if cls is None:
        raise ConfigError(f"unknown section [{section}] ({source}); known: {', '.join(SECTIONS)}")
    names = {f.name for f in dataclasses.fields(cls)}
    if section == "server" and key not in names:
        row = ALIASES.get(key)
        if row is None:
            raise ConfigError(
                f"unknown key {written} ({source}); known keys: {', '.join(sorted(ALIASES))}"
            )
        section, key = row.section, row.key
    elif key not in names:
        raise ConfigError(
            f"unknown key {written} ({source}); known keys: {', '.join(sorted(names))}"
        )
    before = layers[section].get(key)
    if before is not None and before.layer == layer and before.written != written:
        # (``DUPLEX_PORT`` and ``DUPLEX_SERVER__PORT`` are one spelling: the last wins, as ever)
        raise ConfigError(
            f"{written}: given twice, as {written} ({source}) and as {before.written} "
            f"({before.source}); both name {section}.{key}"
        )
    layers[section][key] = _Given(value, source, written, layer)


def _merge_file(layers: _Layers, path: Path) -> None:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: top-level key {section!r} must be a [table]")
        for key, value in table.items():
            _put(layers, section, key, value, str(path), "file")


def _merge_env(layers: _Layers, env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        section, sep, key = rest.partition("__")
        if not sep:
            section, key = "server", rest
        _put(layers, section, key, value, f"env {name}", "env")


def _coerce(key: str, hint: Any, value: Any, source: str) -> Any:
    """Check ``value`` against the field's type; env strings are parsed."""
    origin = get_origin(hint)
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices:
            raise ConfigError(f"{key}: must be one of {list(choices)}, got {value!r} ({source})")
        return value
    if hint == Count:  # a whole number or the word auto
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        try:
            return _coerce(key, int, value, source)
        except ConfigError:
            raise ConfigError(
                f"{key}: must be a whole number or auto, got {value!r} ({source})"
            ) from None
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{key}: optional values are not configurable here")  # pragma: no cover
    if hint is bool:
        if isinstance(value, str):
            lowered = value.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: must be a boolean, got {value!r} ({source})")
    if hint in (int, float):
        if isinstance(value, str):
            try:
                value = hint(value.strip())
            except ValueError:
                raise ConfigError(f"{key}: must be a number, got {value!r} ({source})") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: must be a number, got {value!r} ({source})")
        if hint is int and isinstance(value, float):
            if not value.is_integer():
                raise ConfigError(f"{key}: must be an integer, got {value!r} ({source})")
            value = int(value)
        return hint(value)
    if hint is str or (isinstance(hint, type) and issubclass(hint, str)):  # str enums too
        if not isinstance(value, str):
            raise ConfigError(f"{key}: must be a string, got {value!r} ({source})")
        return value
    if origin is tuple and get_args(hint) == (str, ...):
        if isinstance(value, str):  # env: comma-separated
            return tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{key}: must be a list of strings ({source})")
    raise ConfigError(f"{key}: unsupported config type {hint!r}")  # pragma: no cover


def api_keys_of(access: AccessConfig) -> tuple[str, ...]:
    """Every API key: ``api_keys`` and the lines of ``api_key_file`` (read at startup).

    Raises:
        ConfigError: the file cannot be read, or holds no key or a malformed one; a
            TLS file is missing.
    """
    keys = list(access.api_keys)
    if access.api_key_file:
        path = Path(access.api_key_file).expanduser()
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"access.api_key_file: cannot read {path}: {exc.strerror}") from None
        found = [
            line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")
        ]
        if not found:
            raise ConfigError(f"access.api_key_file: {path} holds no key")
        if any(len(key) < 16 or "," in key or " " in key for key in found):
            raise ConfigError(
                f"access.api_key_file: {path}: each key must be at least 16 characters, "
                "one a line, without commas or spaces (the key itself is not shown)"
            )
        keys += found
    for key, name in (("tls_certfile", access.tls_certfile), ("tls_keyfile", access.tls_keyfile)):
        if name and not Path(name).expanduser().is_file():
            raise ConfigError(f"access.{key}: {name} is not a file")
    return tuple(dict.fromkeys(keys))
