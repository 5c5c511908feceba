"""The one error answer (`duplex.refusals.Refusal`): its shape, and that nothing else builds it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import duplex
from duplex.exceptions import BadEvent, InternalError, RateLimited, ResourceExhausted
from duplex.refusals import MAX_ECHO_CHARS, Refusal, echo

ENVELOPE = re.compile(r"\{\s*[\"']error[\"']\s*:")
"""A dict whose first key is ``error``: OpenAI's error envelope (a wire error *event* starts
with ``"type": "error"``, and a video job's ``"error"`` field is not its first)."""


def test_no_module_but_refusals_builds_the_error_envelope() -> None:
    """Every HTTP and handshake refusal is a `Refusal`. The session wire protocols
    (``duplex/wire``) encode the sessions' own ``error`` events, which carry an
    ``event_id`` and go out on an open socket: those are events, not refusals."""
    root = Path(duplex.__file__).parent
    builders = []
    for path in sorted(root.rglob("*.py")):
        if path.parent.name == "wire":
            continue
        code = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
        )
        code = re.sub(r'"""[\s\S]*?"""', "", code)  # docstrings describe the shape
        if ENVELOPE.search(code):
            builders.append(path.relative_to(root).as_posix())
    assert builders == ["refusals.py"]


def test_the_body_has_the_four_keys_and_the_type_follows_the_status() -> None:
    assert Refusal(400, "m", "bad").body() == {
        "error": {"message": "m", "type": "invalid_request_error", "param": None, "code": "bad"}
    }
    assert Refusal(429, "m", "rate_limited").error_type == "rate_limit_error"
    assert Refusal(503, "m", "x").error_type == "server_error"
    assert Refusal(404, "m", "x", error_type="custom").error_type == "custom"
    assert json.loads(Refusal(413, "ü", "x", "p").body_bytes())["error"]["param"] == "p"


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (BadEvent("no", param="f"), 400, "invalid_request_error"),
        (RateLimited("slow down"), 429, "rate_limit_error"),
        (ResourceExhausted("full"), 429, "rate_limit_error"),
        (InternalError("oops"), 500, "server_error"),
    ],
)
def test_a_protocol_error_carries_its_status(exc: BadEvent, status: int, kind: str) -> None:
    refusal = Refusal.of(exc)
    assert (refusal.status, refusal.error_type, refusal.code) == (status, kind, exc.code)
    assert refusal.param == exc.param and refusal.message == exc.message
    assert Refusal.of(exc, 409).status == 409


def test_headers_the_status_needs() -> None:
    assert Refusal(429, "m", "x", retry_after_s=0.2).http_headers() == [
        ("content-type", "application/json"),
        ("retry-after", "1"),
    ]
    assert ("retry-after", "3") in Refusal(503, "m", "x", retry_after_s=2.1).http_headers()
    upgrade = Refusal(426, "m", "x", headers=(("Upgrade", "websocket"),)).http_headers()
    assert upgrade[-1] == ("upgrade", "websocket")


def test_an_echoed_value_is_cut_short() -> None:
    assert echo("nova") == "'nova'"
    long = echo("x" * 10_000)
    assert len(long) < MAX_ECHO_CHARS + 40 and "10002 characters" in long
