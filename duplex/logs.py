"""Structured logging: structlog with a JSON or console renderer.

Loggers are bound with context (``actor=<path>``, later ``session_id=...``) by the
code that owns it; this module only chooses how lines are rendered.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

from duplex.progress import active_bar

Renderer = Literal["json", "console"]


def configure_logging(renderer: Renderer = "console", level: str = "info") -> None:
    """Route structlog to stderr with the chosen renderer and minimum level."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    final = (
        structlog.processors.JSONRenderer()
        if renderer == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            final,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=False,
    )


class _CurrentStderr:
    """Whatever ``sys.stderr`` is when a line is written (it is swapped by test capture,
    daemons and embedding apps; a stream bound once would outlive its owner)."""

    def write(self, text: str) -> int:
        bar = active_bar()
        if bar is not None and bar.stream is sys.stderr:  # a startup bar: lines go above it
            return bar.write_above(text)
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def get_logger(**context: object) -> structlog.typing.FilteringBoundLogger:
    """A logger bound with ``context``."""
    return structlog.get_logger().bind(**context)
