"""Hostile bytes at the HTTP and WebSocket layers, against a real ``duplex serve`` process.

Each case is sent on a raw socket, as an attacker would; the server must answer
or close that connection and keep serving everyone else. The process is shared
by the module (starting one costs a torch import), so the fuzz cases also prove
that hundreds of bad connections in a row leave it serving.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import struct
import time
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..helpers import Served, serve
from .rawws import masked_frame

MAX_FRAME_BYTES = 4096
"""The server's ``max_frame_bytes`` here: messages over twice this get 1009."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    env = {"DUPLEX_REALTIME_VAD": "energy", "DUPLEX_MAX_FRAME_BYTES": str(MAX_FRAME_BYTES)}
    with serve(tmp_path_factory.mktemp("hostile"), env=env, start_s=60) as server:
        yield server


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _read_all(sock: socket.socket, timeout: float = 5.0) -> tuple[bytes, bool]:
    """Everything until EOF; ``False`` when the server still held the socket at ``timeout``."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data, False
    except ConnectionResetError:
        pass
    return data, True


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with _connect(port) as sock:
            host = f"127.0.0.1:{port}"
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
            )
            data, _ = _read_all(sock)
    except OSError:
        return 0, b""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]) if head else 0, body


def _upgrade(port: int, *, extra_headers: str = "", trailing: bytes = b"") -> socket.socket:
    sock = _connect(port)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /v1/duplex HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n{extra_headers}\r\n"
        ).encode()
        + trailing
    )
    return sock


def _response_head(sock: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            break
        head += chunk
    return head


def _close_code(data: bytes) -> int | None:
    """The code of the first close frame in ``data`` (server frames are unmasked)."""
    i = 0
    while i + 2 <= len(data):
        opcode, length = data[i] & 0x0F, data[i + 1] & 0x7F
        i += 2
        if length == 126:
            length, i = struct.unpack(">H", data[i : i + 2])[0], i + 2
        elif length == 127:
            length, i = struct.unpack(">Q", data[i : i + 8])[0], i + 8
        if opcode == 0x8:
            return struct.unpack(">H", data[i : i + 2])[0] if length >= 2 else None
        i += length
    return None


def _assert_serving(served: Served) -> None:
    assert served.alive(), served.log()
    status, body = _get(served.port, "/health")
    assert status == 200, body
    assert json.loads(body)["status"] == "ok"


# ------------------------------------------------------------------ reproductions


@pytest.mark.parametrize("path", ["/health", "/metrics", "/no-such-path"])
@pytest.mark.parametrize("length", [5, 100_000])
def test_a_body_cut_short_ends_only_its_connection(served: Served, path: str, length: int) -> None:
    """hypercorn 0.18 alone exited after 1-7 of these (BusyResourceError out of the server)."""
    for _ in range(8):
        with _connect(served.port) as sock:
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
                f"Content-Length: {length}\r\n\r\n".encode()
            )
        time.sleep(0.02)
    _assert_serving(served)


def test_trailing_bytes_after_an_upgrade_request(served: Served) -> None:
    with _upgrade(served.port, trailing=b"GARBAGE\r\n\r\n") as sock:
        _read_all(sock)
    _assert_serving(served)


def test_permessage_deflate_is_never_negotiated(served: Served) -> None:
    """A compressed message inflated whole before any size check: no compression at all."""
    with _upgrade(
        served.port, extra_headers="Sec-WebSocket-Extensions: permessage-deflate\r\n"
    ) as s:
        head = _response_head(s)
        assert head.startswith(b"HTTP/1.1 101"), head
        assert b"sec-websocket-extensions" not in head.lower()
        # a frame that claims compression anyway (RSV1) is a protocol error
        co = zlib.compressobj(9, zlib.DEFLATED, -15)
        bomb = co.compress(b"a" * 1_000_000) + co.flush(zlib.Z_SYNC_FLUSH)
        s.sendall(masked_frame(0x1, bomb[:-4], rsv1=True))
        data, closed = _read_all(s)
    assert _close_code(data) == 1002
    assert closed
    _assert_serving(served)


def test_invalid_utf8_in_a_text_frame_closes_1007(served: Served) -> None:
    with _upgrade(served.port) as sock:
        assert _response_head(sock).startswith(b"HTTP/1.1 101")
        sock.sendall(masked_frame(0x1, b'{"type": "\xff\xfe"}'))
        data, closed = _read_all(sock)
    assert _close_code(data) == 1007
    assert closed


def test_an_oversize_message_is_closed_1009_and_the_connection_ends(served: Served) -> None:
    """The close used to leave the TCP connection open (90 s and more) and the app untold."""
    with _upgrade(served.port) as sock:
        assert _response_head(sock).startswith(b"HTTP/1.1 101")
        sock.sendall(masked_frame(0x1, b"a" * (2 * MAX_FRAME_BYTES + 1)))
        data, closed = _read_all(sock, timeout=10)
    assert _close_code(data) == 1009
    assert closed, "the server still held the connection 10 s after its close frame"
    _assert_serving(served)


def test_a_connection_error_is_counted_not_raised(served: Served) -> None:
    """Trailing bytes after an upgrade made hypercorn raise: now one counted connection error."""
    with _upgrade(served.port, trailing=b"X" * 64) as sock:
        _read_all(sock)
    status, body = _get(served.port, "/metrics")
    assert status == 200
    assert b"duplex_http_connection_errors_total{" in body
    assert "Traceback" not in served.log()


# ------------------------------------------------------------------------- fuzz

_OUR_HOST = "{our host}"
"""Replaced by the served host and port, so that some cases pass the Host check."""
_methods = st.sampled_from(["GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PRI", "G\x00T"])
_paths = st.sampled_from(
    ["/health", "/metrics", "/v1/models", "/v1/duplex", "/v1/realtime", "/x", "*", "/%ff%00"]
) | st.text(max_size=40).map(lambda t: "/" + t)
_versions = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9", ""])
_header = st.one_of(
    st.tuples(st.just("Content-Length"), st.integers(-5, 10**7).map(str)),
    st.tuples(
        st.just("Content-Length"), st.sampled_from(["", "x", "1, 2", "99999999999999999999"])
    ),
    st.tuples(st.just("Transfer-Encoding"), st.sampled_from(["chunked", "gzip", "chunked, x"])),
    st.tuples(st.just("Upgrade"), st.sampled_from(["websocket", "h2c", "WebSocket", ""])),
    st.tuples(st.just("Connection"), st.sampled_from(["Upgrade", "close", "keep-alive, Upgrade"])),
    st.tuples(st.just("Sec-WebSocket-Key"), st.sampled_from(["dGhlIHNhbXBsZSBub25jZQ==", "", "x"])),
    st.tuples(st.just("Sec-WebSocket-Version"), st.sampled_from(["13", "8", "", "x"])),
    st.tuples(
        st.just("Sec-WebSocket-Extensions"),
        st.sampled_from(["permessage-deflate", "permessage-deflate; client_max_window_bits=99"]),
    ),
    st.tuples(st.just("Host"), st.just(_OUR_HOST) | st.text(max_size=30)),
    st.tuples(st.text(max_size=20), st.text(max_size=60)),
)


@st.composite
def _requests(draw: st.DrawFn) -> tuple[bytes, str]:
    if draw(st.booleans()):
        head = f"{draw(_methods)} {draw(_paths)} {draw(_versions)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in draw(st.lists(_header, max_size=8)))
        raw = head.encode("utf-8", "surrogatepass") + b"\r\n" + draw(st.binary(max_size=300))
    else:
        prefix = draw(
            st.sampled_from([b"", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"GET / HTTP/1.1"])
        )
        raw = prefix + draw(st.binary(max_size=600))
    return raw, draw(st.sampled_from(["close", "half-close", "read"]))


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=_requests())
def test_fuzz_raw_http_never_stops_the_server(served: Served, case: tuple[bytes, str]) -> None:
    raw, ending = case
    raw = raw.replace(_OUR_HOST.encode(), f"127.0.0.1:{served.port}".encode())
    with _connect(served.port) as sock, contextlib.suppress(OSError):
        sock.sendall(raw)
        if ending == "half-close":
            sock.shutdown(socket.SHUT_WR)
        if ending != "close":
            _read_all(sock, timeout=0.3)
    assert served.alive(), served.log()[-3000:]


_frames = st.builds(
    lambda opcode, payload, rsv, fin: masked_frame(opcode, payload, rsv1=rsv, fin=fin),
    st.integers(0, 15),
    st.binary(max_size=200) | st.sampled_from([b"\xff", b'{"type":"session.create"}']),
    st.booleans(),
    st.booleans(),
)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frames=st.lists(_frames, min_size=1, max_size=5), tail=st.binary(max_size=40))
def test_fuzz_websocket_frames_never_stop_the_server(
    served: Served, frames: list[bytes], tail: bytes
) -> None:
    with _upgrade(served.port) as sock, contextlib.suppress(OSError):
        _response_head(sock)
        sock.sendall(b"".join(frames) + tail)
        sock.shutdown(socket.SHUT_WR)
        _read_all(sock, timeout=0.05)  # the session may well keep a half-closed socket open
    assert served.alive(), served.log()[-3000:]


def test_after_the_fuzz_the_server_serves_and_logged_no_traceback(served: Served) -> None:
    _assert_serving(served)
    assert "Traceback" not in served.log()


@pytest.mark.parametrize(
    ("request_line", "status", "code"),
    [
        ("DELETE /health", 405, "method_not_allowed"),
        ("PUT /v1/models", 405, "method_not_allowed"),
        ("GET /v1/realtime/client_secrets", 405, "method_not_allowed"),
        ("GET /no/such/route", 404, "not_found"),
        ("POST /metrics", 405, "method_not_allowed"),
    ],
)
def test_routing_refusals_are_typed_errors(
    served: Served, request_line: str, status: int, code: str
) -> None:
    """Starlette's own 404 and 405 come in the error shape of every other answer (they
    were plain text; found by bench/fuzz_endpoints.py)."""
    with _connect(served.port) as sock:
        sock.sendall(
            f"{request_line} HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
            "Connection: close\r\nContent-Length: 0\r\n\r\n".encode()
        )
        data, _ = _read_all(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    assert int(head.split(b" ")[1]) == status, data[:300]
    assert b"content-type: application/json" in head.lower()
    assert json.loads(body)["error"]["code"] == code
    # OpenAI's whole shape, as the speech and media routes answer (fuzz: `param` was missing)
    assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    if status == 405:
        assert b"\r\nallow: " in head.lower()


def test_a_deeply_nested_client_secret_body_is_a_400_not_a_500(served: Served) -> None:
    body = b"[" * 1500 + b"]" * 1500  # deeper than the recursion limit, under the size limit
    with _connect(served.port) as sock:
        sock.sendall(
            f"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        data, _ = _read_all(sock)
    head, _, answer = data.partition(b"\r\n\r\n")
    assert int(head.split(b" ")[1]) == 400, data[:300]
    assert json.loads(answer)["error"]["code"] == "invalid_json"


def test_the_server_logs_the_url_it_listens_on(served: Served) -> None:
    lines = [line for line in served.log().splitlines() if "listening" in line]
    assert len(lines) == 1 and f"http://127.0.0.1:{served.port}" in lines[0], lines
