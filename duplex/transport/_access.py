"""Who may use the server: API keys, client secrets, Origin, Host, failure limits (sans-I/O).

Pure policy, as h11 is pure protocol: no trio, no Starlette, no clock of its own.
The ASGI edge (``_app.py``) hands it a request's method, path, headers and peer,
with ``now``; it answers with a typed decision, ``Allowed`` or ``Refusal``, and
the edge only applies it. In order, a request must pass:

1. **Host** (DNS rebinding): on a loopback bind, only ``localhost``, ``127.0.0.1``
   and ``[::1]`` on the bound port, plus ``allowed_hosts``; elsewhere only
   ``allowed_hosts`` when set. 421.
2. **Origin** (cross-site pages): a browser's ``Origin`` must be the page's own
   (its host:port is the request's ``Host``) or in ``allowed_origins``. No
   ``Origin`` means a non-browser client, which is allowed. 403.
3. **Failure limit**: a peer whose wrong credentials used up its budget is
   refused until the budget refills, right key or not. 429.
4. **Credentials**, when keys are configured (not for the browser client's page and
   files, which a browser loads without a key; its WebSocket then offers one):
   ``Authorization: Bearer <key>``, or on a WebSocket the
   ``openai-insecure-api-key.<key>`` subprotocol that browsers send. A key is
   an API key, or (WebSockets only) a single-use client secret minted by
   ``POST /v1/realtime/client_secrets``. 401.

Keys are kept as SHA-256 digests and compared with ``hmac.compare_digest``, so
neither a timing nor a memory dump gives a key away, and worker processes are
handed digests, never keys. Denials carry a generic message: never which key,
header or rule was close.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, final
from urllib.parse import urlsplit

from duplex.refusals import Refusal

SUBPROTOCOL_KEY_PREFIX = "openai-insecure-api-key."
"""A browser cannot set headers on a WebSocket: it offers its key as a subprotocol."""
REALTIME_SUBPROTOCOL = "realtime"
"""What OpenAI's browser clients offer beside the key, and the one we echo."""
CLIENT_SECRET_PREFIX = "ek_"
CLIENT_SECRET_MIN_TTL_S = 10
CLIENT_SECRET_MAX_TTL_S = 7200
"""Bounds of a client secret's lifetime, OpenAI's (``duplex.config`` repeats them: config
imports nothing of the transport)."""
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def digest(key: str) -> str:
    """The hex SHA-256 of a key: what we keep and compare instead of the key."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


# -- decisions -----------------------------------------------------------------


class Principal(Enum):
    """What let a request in."""

    OPEN = "open"
    """No keys are configured: the server is open (loopback by default)."""
    API_KEY = "api_key"
    CLIENT_SECRET = "client_secret"


@final
@dataclass(frozen=True, slots=True)
class Allowed:
    principal: Principal
    secret: str | None = None
    """A client secret the edge must still redeem (the store may live in another process)."""


Decision = Allowed | Refusal
"""A refusal carries the HTTP status, a generic public message and, for a WebSocket
handshake that cannot be answered over HTTP, its close code (``duplex.refusals``)."""

UNAUTHORIZED = Refusal(
    401,
    "Missing or invalid credentials.",
    "invalid_api_key",
    headers=(("WWW-Authenticate", "Bearer"),),
)
FORBIDDEN_ORIGIN = Refusal(403, "This origin may not use this server.", "origin_not_allowed")
MISDIRECTED_HOST = Refusal(421, "This host name is not served here.", "host_not_allowed")
RATE_LIMITED = Refusal(429, "Too many failed attempts; try again later.", "rate_limited")
TOO_MANY_CONNECTIONS = Refusal(
    429,
    "Too many open connections from this address; close one and try again.",
    "too_many_connections",
)


# -- header parsing ------------------------------------------------------------


KEY_SCHEMES = ("bearer", "api-key")
"""``Authorization`` schemes that carry an API key: ``Bearer`` (OpenAI's SDKs, curl) and
``Api-Key`` (what openpi-client sends)."""


def bearer(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` (or ``Api-Key <key>``) header, else
    ``None``."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() not in KEY_SCHEMES or not token or " " in token:
        return None
    return token


def subprotocols(header: str | None) -> list[str]:
    """The offered subprotocols of a ``Sec-WebSocket-Protocol`` header, in order."""
    if not header:
        return []
    return [p.strip() for p in header.split(",") if p.strip()]


def subprotocol_key(offered: Iterable[str]) -> str | None:
    """The key a browser offers as ``openai-insecure-api-key.<key>``, if any."""
    for protocol in offered:
        if protocol.startswith(SUBPROTOCOL_KEY_PREFIX) and len(protocol) > len(
            SUBPROTOCOL_KEY_PREFIX
        ):
            return protocol[len(SUBPROTOCOL_KEY_PREFIX) :]
    return None


def select_subprotocol(offered: Iterable[str]) -> str | None:
    """The subprotocol to accept with: ``realtime`` when offered; never the key-bearing one."""
    return REALTIME_SUBPROTOCOL if REALTIME_SUBPROTOCOL in offered else None


def split_host(value: str) -> tuple[str, int | None] | None:
    """``name[:port]`` of a ``Host`` header, lowercased (IPv6 in brackets); ``None`` if bad."""
    value = value.strip().lower()
    if not value or any(c in value for c in "/@?# \t"):
        return None
    if value.startswith("["):
        name, bracket, rest = value.partition("]")
        if not bracket:
            return None
        name += "]"
        if not rest:
            return name, None
        if not rest.startswith(":"):
            return None
        port_text = rest[1:]
    else:
        name, colon, port_text = value.partition(":")
        if not colon:
            return (name, None) if name else None
        if not name:
            return None
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        return None
    return name, int(port_text)


_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def origin_host(origin: str) -> tuple[str, int] | None:
    """An ``Origin``'s host and port (default port by scheme); ``None`` for ``null`` or junk."""
    try:
        parts = urlsplit(origin.strip().lower())
        port = parts.port
    except ValueError:
        return None
    default = _DEFAULT_PORTS.get(parts.scheme)
    if default is None or not parts.hostname or parts.path not in ("", "/"):
        return None
    name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return name, port if port is not None else default


def client_secret_request(body: bytes, default_ttl_s: int) -> tuple[int, dict[str, Any]] | Refusal:
    """The lifetime and session of a ``POST /v1/realtime/client_secrets`` body, OpenAI's shape:
    ``{"expires_after": {"anchor": "created_at", "seconds": N}, "session": {...}}``, both
    optional (``N``: 10..7200). The session is echoed back, not applied to the socket."""
    if not body.strip():
        return default_ttl_s, {"type": "realtime"}
    try:  # NaN and Infinity are not JSON (the session is echoed back); deep nesting recurses
        request = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _bad_request("The body is not valid JSON.")
    if not isinstance(request, dict):
        return _bad_request("The body must be a JSON object.")
    ttl_s = default_ttl_s
    expires = request.get("expires_after")
    if expires is not None:
        seconds = expires.get("seconds") if isinstance(expires, dict) else None
        anchor = expires.get("anchor", "created_at") if isinstance(expires, dict) else None
        if anchor != "created_at" or isinstance(seconds, bool) or not isinstance(seconds, int):
            return _bad_request(
                "expires_after must be {anchor: created_at, seconds: integer}.",
                "expires_after",
            )
        if not CLIENT_SECRET_MIN_TTL_S <= seconds <= CLIENT_SECRET_MAX_TTL_S:
            return _bad_request(
                f"expires_after.seconds must be {CLIENT_SECRET_MIN_TTL_S}.."
                f"{CLIENT_SECRET_MAX_TTL_S}.",
                "expires_after.seconds",
            )
        ttl_s = seconds
    session = request.get("session", {"type": "realtime"})
    if not isinstance(session, dict):
        return _bad_request("session must be an object.", "session")
    return ttl_s, session


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    """A JSON number as a float, refused where it overflows (``1e999``: infinity)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} overflows a float")
    return value


def _bad_request(message: str, param: str | None = None) -> Refusal:
    return Refusal(400, message, "invalid_value" if param else "invalid_json", param)


# -- the pieces ----------------------------------------------------------------


@final
class ApiKeys:
    """The configured API keys, as digests."""

    def __init__(self, digests: Iterable[str]) -> None:
        self.digests = tuple(digests)

    @classmethod
    def of(cls, keys: Iterable[str]) -> ApiKeys:
        return cls(digest(k) for k in keys)

    def __bool__(self) -> bool:
        return bool(self.digests)

    def check(self, presented: str) -> bool:
        """``presented`` is one of the keys; every digest is compared, in constant time."""
        candidate = digest(presented)
        found = False
        for known in self.digests:
            found |= hmac.compare_digest(candidate, known)
        return found


@final
@dataclass(frozen=True, slots=True)
class Minted:
    value: str
    expires_at: float


@final
@dataclass(frozen=True, slots=True)
class SecretStoreStatistics:
    live: int
    max_live: int


class SecretStoreFull(Exception):
    """Every slot of the client-secret store holds an unexpired secret."""


@final
class ClientSecrets:
    """Short-lived, single-use client secrets for browsers, bounded in number.

    A secret is redeemed once (the WebSocket handshake that uses it) and is gone,
    used or not, at its expiry. ``now`` is wall time (``expires_at`` is a Unix
    time the client is told). When ``max_live`` unexpired secrets exist, minting
    is refused rather than dropping a secret someone holds.
    """

    def __init__(self, *, max_live: int = 10_000) -> None:
        if max_live < 1:
            raise ValueError("max_live must be >= 1")
        self.max_live = max_live
        self._expiry: OrderedDict[str, float] = OrderedDict()  # digest -> expires_at, by mint

    def mint(self, now: float, ttl_s: float) -> Minted:
        """A new secret valid for ``ttl_s`` from ``now``.

        Raises:
            SecretStoreFull: ``max_live`` secrets are still valid.
        """
        self._expire(now)
        if len(self._expiry) >= self.max_live:
            raise SecretStoreFull
        value = CLIENT_SECRET_PREFIX + secrets.token_urlsafe(24)
        expires_at = now + ttl_s
        self._expiry[digest(value)] = expires_at
        return Minted(value, expires_at)

    def redeem(self, value: str, now: float) -> bool:
        """Use ``value`` up: ``True`` once if it is known and unexpired, then never again."""
        self._expire(now)
        expires_at = self._expiry.pop(digest(value), None)
        return expires_at is not None and now < expires_at

    def _expire(self, now: float) -> None:
        expired = [d for d, at in self._expiry.items() if at <= now]
        for d in expired:
            del self._expiry[d]

    def statistics(self) -> SecretStoreStatistics:
        return SecretStoreStatistics(len(self._expiry), self.max_live)


@final
@dataclass(frozen=True, slots=True)
class LimiterStatistics:
    tracked: int
    max_keys: int
    refused: int


@final
class FailureLimiter:
    """Failures per key (a peer address, a session id) in a token bucket, bounded in keys.

    Each key may fail ``burst`` times at once; its budget refills at ``burst`` per
    ``window_s``, so one failure is forgiven every ``window_s / burst`` seconds and
    a key that stops failing is whole again after ``window_s``. A key is refused
    while its budget is under one failure. Only the ``max_keys`` most recently
    failing keys are tracked (least recent dropped first), so memory is bounded;
    a full bucket is not stored at all.
    """

    def __init__(self, *, burst: int, window_s: float, max_keys: int = 65_536) -> None:
        if burst < 1 or window_s <= 0 or max_keys < 1:
            raise ValueError("burst and max_keys must be >= 1 and window_s > 0")
        self.burst = burst
        self.window_s = window_s
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key: (tokens, at)
        self._refused = 0

    def _tokens(self, key: str, now: float) -> float:
        entry = self._buckets.get(key)
        if entry is None:
            return float(self.burst)
        tokens, at = entry
        return min(float(self.burst), tokens + max(now - at, 0.0) * self.burst / self.window_s)

    def blocked(self, key: str, now: float) -> bool:
        """``key`` has no failure left to spend; counted when it is."""
        refused = self._tokens(key, now) < 1.0
        self._refused += refused
        return refused

    def fail(self, key: str, now: float) -> None:
        """One failure of ``key``."""
        tokens = max(self._tokens(key, now) - 1.0, 0.0)
        self._buckets[key] = (tokens, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)

    def statistics(self) -> LimiterStatistics:
        return LimiterStatistics(len(self._buckets), self.max_keys, self._refused)


# -- the policy ----------------------------------------------------------------


Kind = Literal["http", "websocket"]


@final
@dataclass(frozen=True, slots=True)
class AccessSettings:
    """What the policy needs of the config; plain data, so it crosses to worker processes."""

    key_digests: tuple[str, ...] = ()
    loopback: bool = True
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    failure_burst: int = 10
    failure_window_s: float = 60.0
    max_connections_per_peer: int = 0
    body_timeout_s: float = 30.0
    """An HTTP request body must arrive within this, then at ``MIN_BODY_RATE`` (0: never)."""


@final
class PeerConnections:
    """Open WebSockets and HTTP requests in flight per peer address, against a cap (0: none).

    Each one can hold a session and its model slot, so one address cannot take
    the whole server; a refused peer gets in again as soon as one of its own closes.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: dict[str | None, int] = {}

    def enter(self, peer: str | None) -> bool:
        """Count one more connection of ``peer``; ``False`` (nothing counted) at the cap."""
        count = self.open.get(peer, 0)
        if self.limit and count >= self.limit:
            return False
        self.open[peer] = count + 1
        return True

    def leave(self, peer: str | None) -> None:
        count = self.open.pop(peer, 0) - 1
        if count > 0:
            self.open[peer] = count


@final
class AccessPolicy:
    """Decides each request: Host, then Origin, then the failure limit, then credentials."""

    def __init__(self, settings: AccessSettings) -> None:
        self.settings = settings
        self.keys = ApiKeys(settings.key_digests)
        self.origins = frozenset(_normal_origin(o) for o in settings.allowed_origins)
        self.any_origin = "*" in settings.allowed_origins
        self.hosts = frozenset(h.lower().strip() for h in settings.allowed_hosts)
        self.any_host = "*" in self.hosts
        self.failures = FailureLimiter(
            burst=settings.failure_burst, window_s=settings.failure_window_s
        )

    @property
    def auth_required(self) -> bool:
        return bool(self.keys)

    def host_allowed(self, host: str | None, bound_port: int | None) -> bool:
        """The ``Host`` header names this server (see the module docstring)."""
        if self.any_host or (not self.settings.loopback and not self.hosts):
            return True
        parsed = split_host(host) if host is not None else None
        if parsed is None:
            return False
        name, port = parsed
        if name in self.hosts or f"{name}:{port}" in self.hosts:
            return True
        if not self.settings.loopback or name not in LOOPBACK_NAMES:
            return False
        if bound_port is None:
            return True
        return port == bound_port or (port is None and bound_port in (80, 443))

    def origin_allowed(
        self, origin: str | None, host: str | None, secure: bool | None = None
    ) -> bool:
        """No ``Origin`` (not a browser), the page's own origin, or a listed one.
        ``secure``: the request came over TLS; the page's own origin then has the same
        scheme (``https`` over TLS, ``http`` without), not only the same host and port
        (``None``: not compared)."""
        if origin is None or self.any_origin:
            return True
        if _normal_origin(origin) in self.origins:
            return True
        theirs = origin_host(origin)
        ours = split_host(host) if host is not None else None
        if theirs is None or ours is None:
            return False
        if secure is not None:
            scheme = urlsplit(origin.strip().lower()).scheme
            if scheme != ("https" if secure else "http"):
                return False
        name, port = ours
        return theirs[0] == name and (
            theirs[1] == port or (port is None and theirs[1] in (80, 443))
        )

    def decide(
        self,
        kind: Kind,
        headers: Mapping[str, str],
        *,
        peer: str | None,
        bound_port: int | None,
        now: float,
        public: bool = False,
        secure: bool | None = None,
    ) -> Decision:
        """One request's fate. ``headers`` are lowercase names; ``now`` is the limiter's clock;
        ``public``: a request that needs no credentials (the browser client's page), which
        the Host and Origin checks still guard.

        A wrong credential counts as one failure of ``peer``; a client secret is
        only recognised here (``Allowed.secret``): the edge redeems it.
        """
        host = headers.get("host")
        if not self.host_allowed(host, bound_port):
            return MISDIRECTED_HOST
        if not self.origin_allowed(headers.get("origin"), host, secure):
            return FORBIDDEN_ORIGIN
        if not self.auth_required or public:
            return Allowed(Principal.OPEN)
        peer_key = f"peer:{peer}"
        if self.failures.blocked(peer_key, now):
            return RATE_LIMITED
        presented = bearer(headers.get("authorization"))
        if presented is None and kind == "websocket":
            presented = subprotocol_key(subprotocols(headers.get("sec-websocket-protocol")))
        if presented is None:
            return UNAUTHORIZED
        if self.keys.check(presented):
            return Allowed(Principal.API_KEY)
        if kind == "websocket" and presented.startswith(CLIENT_SECRET_PREFIX):
            return Allowed(Principal.CLIENT_SECRET, secret=presented)
        self.failures.fail(peer_key, now)
        return UNAUTHORIZED

    def secret_refused(self, peer: str | None, now: float) -> Refusal:
        """A client secret failed to redeem: one failure of ``peer``."""
        self.failures.fail(f"peer:{peer}", now)
        return UNAUTHORIZED


def _normal_origin(origin: str) -> str:
    host = origin_host(origin)
    if host is None:
        return origin.strip().lower()
    scheme = urlsplit(origin.strip().lower()).scheme
    return f"{scheme}://{host[0]}:{host[1]}"


@final
class ResumeGuard:
    """Failed ``session.resume`` attempts, limited per peer address and per session id.

    Guessing a resume token (or a session id) is refused once either budget is
    spent, and allowed again as it refills (``FailureLimiter``).
    """

    def __init__(self, *, burst: int, window_s: float, max_keys: int = 65_536) -> None:
        self.limiter = FailureLimiter(burst=burst, window_s=window_s, max_keys=max_keys)

    def blocked(self, peer: str | None, session_id: str, now: float) -> bool:
        peer_blocked = peer is not None and self.limiter.blocked(f"peer:{peer}", now)
        return peer_blocked or self.limiter.blocked(f"session:{session_id}", now)

    def fail(self, peer: str | None, session_id: str, now: float) -> None:
        if peer is not None:
            self.limiter.fail(f"peer:{peer}", now)
        self.limiter.fail(f"session:{session_id}", now)
