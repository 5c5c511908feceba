"""The one error answer: OpenAI's error envelope, with the status it goes out with.

Every HTTP refusal and every refused WebSocket handshake is a `Refusal`: the
HTTP status, OpenAI's ``type`` / ``code`` / ``param`` / ``message``, the close
code a WebSocket gets when its handshake cannot be answered over HTTP, and the
headers the status needs (``Retry-After`` for 429 and 503, ``WWW-Authenticate``
for 401, ``Upgrade`` for 426, ``Allow`` for 405). `Refusal.body` is the only
place the envelope ``{"error": {message, type, param, code}}`` is built (a test
greps the package for another). A refused client event is a ``ProtocolError``
whose class carries its status (``status_hint``, as h11's ``error_status_hint``);
`Refusal.of` turns one into its answer.

A leaf module: plain data, no I/O; the transport and the services turn it into
a response.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final, final

from duplex.exceptions import ProtocolError

__all__ = ["JSON_CONTENT_TYPE", "MAX_ECHO_CHARS", "Refusal", "echo"]

JSON_CONTENT_TYPE: Final = "application/json"

MAX_ECHO_CHARS: Final = 100
"""The most characters of a client's own value an error message quotes back."""

_TYPE_OF_STATUS: Final = {429: "rate_limit_error", 500: "server_error", 503: "server_error"}


def echo(value: object) -> str:
    """A client's value as an error message quotes it: ``repr``, cut short past
    `MAX_ECHO_CHARS` (a 10,000-character field is not sent back whole)."""
    text = repr(value)
    if len(text) <= MAX_ECHO_CHARS:
        return text
    return f"{text[:MAX_ECHO_CHARS]}... ({len(text)} characters)"


@final
@dataclass(frozen=True, slots=True)
class Refusal:
    """One refused request, as plain data (it crosses a worker's link).

    Args:
        status: the HTTP status.
        message: what went wrong and, where it helps, what to do.
        code: OpenAI's machine-readable ``code``.
        param: the request field to blame, if one is.
        error_type: OpenAI's error family; by default from the status (``rate_limit_error``
            for 429, ``server_error`` for 5xx, else ``invalid_request_error``).
        close_code: what a WebSocket handshake gets where the server cannot answer it
            over HTTP (1008 policy violation; 1013 try again later).
        retry_after_s: sent as ``Retry-After`` (whole seconds, at least 1).
        headers: any other header the status needs (``WWW-Authenticate``, ``Upgrade``).
    """

    status: int
    message: str
    code: str
    param: str | None = None
    error_type: str = ""
    close_code: int = 1008
    retry_after_s: float | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.error_type:
            kind = _TYPE_OF_STATUS.get(self.status)
            if kind is None:
                kind = "server_error" if self.status >= 500 else "invalid_request_error"
            object.__setattr__(self, "error_type", kind)

    @classmethod
    def of(cls, exc: ProtocolError, status: int | None = None, **extra: Any) -> Refusal:
        """The answer to a refused request: ``exc``'s code, type, param and message, with
        ``status`` or the exception's own ``status_hint``."""
        return cls(
            status if status is not None else exc.status_hint,
            exc.message,
            exc.code,
            exc.param,
            exc.error_type,
            **extra,
        )

    def body(self) -> dict[str, dict[str, str | None]]:
        """OpenAI's error envelope, with all four keys."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body_bytes(self) -> bytes:
        return json.dumps(self.body(), ensure_ascii=False, separators=(",", ":")).encode()

    def http_headers(self) -> list[tuple[str, str]]:
        """Every header of the answer, the content type first."""
        headers = [("content-type", JSON_CONTENT_TYPE)]
        if self.retry_after_s is not None:
            headers.append(("retry-after", str(max(1, math.ceil(self.retry_after_s)))))
        headers += [(name.lower(), value) for name, value in self.headers]
        return headers
