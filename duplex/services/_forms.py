"""Multipart uploads read within a bound: the body first (at most ``max_bytes``), then parsed.

Starlette's form parser bounds the size of a text field but spools a file part of any
size to disk; an upload route reads the body itself, refusing it past its limit
before a byte is parsed, and hands the parser the bytes it kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, final

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request

from duplex.exceptions import ProtocolError
from duplex.refusals import echo

__all__ = ["FormTooLarge", "InvalidForm", "UploadForm", "read_upload_form"]


@final
class InvalidForm(ProtocolError):
    """Not a multipart form, or one the route cannot take (400)."""

    code = "invalid_form"


@final
class FormTooLarge(ProtocolError):
    """The body is over the route's limit (413)."""

    code = "body_too_large"
    status_hint = 413


@final
@dataclass(frozen=True, slots=True)
class UploadForm:
    """A multipart form's text fields and file parts (each once), as plain values."""

    fields: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)

    def text(self, name: str) -> str | None:
        return self.fields.get(name)


async def read_upload_form(
    request: Request, *, max_bytes: int, files: frozenset[str], max_fields: int = 16
) -> UploadForm:
    """The request's multipart form, read within ``max_bytes``.

    Args:
        files: the file fields the route takes; any other file part is refused.
        max_fields: the most parts.

    Raises:
        FormTooLarge: the body (or its ``Content-Length``) is over ``max_bytes``.
        InvalidForm: not multipart, a part given twice, an unknown file part, a file in a
            text field, or a form the parser cannot read (400).
    """
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        raise InvalidForm(
            f"The body must be multipart/form-data, not {echo(kind or 'none')}.",
            param="content-type",
        )
    try:
        declared = int(request.headers.get("content-length") or 0)
    except ValueError:
        declared = 0
    if declared > max_bytes:
        raise FormTooLarge(f"The body is {declared} bytes; the most is {max_bytes}.")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise FormTooLarge(f"The body is over {max_bytes} bytes.")
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": bytes(body), "more_body": False}

    kept = Request(request.scope, replay)
    form = UploadForm()
    try:
        async with kept.form(
            max_files=len(files), max_fields=max_fields, max_part_size=max_bytes
        ) as parsed:
            for key, value in parsed.multi_items():
                if key in form.fields or key in form.files:
                    raise InvalidForm(f"Form field {echo(key)} is given twice.", param=key[:100])
                if isinstance(value, UploadFile):
                    if key not in files:
                        raise InvalidForm(f"Form field {echo(key)} takes no file.", param=key[:100])
                    form.files[key] = await value.read()
                elif key in files:
                    raise InvalidForm(f"Form field {echo(key)} must be a file.", param=key[:100])
                else:
                    form.fields[key] = value
    except HTTPException as exc:  # the parser's refusals: too many parts, a malformed body
        raise InvalidForm(f"The form could not be read: {exc.detail}") from None
    except MultiPartException as exc:  # the same, where the scope has no app (relayed)
        raise InvalidForm(f"The form could not be read: {exc.message}") from None
    return form
