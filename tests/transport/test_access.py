"""The access policy without sockets: keys, secrets, Origin, Host, limits, under a fake clock."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.refusals import Refusal
from duplex.transport._access import (
    FORBIDDEN_ORIGIN,
    MISDIRECTED_HOST,
    RATE_LIMITED,
    UNAUTHORIZED,
    AccessPolicy,
    AccessSettings,
    Allowed,
    ApiKeys,
    ClientSecrets,
    FailureLimiter,
    PeerConnections,
    Principal,
    ResumeGuard,
    SecretStoreFull,
    bearer,
    client_secret_request,
    digest,
    origin_host,
    select_subprotocol,
    split_host,
    subprotocol_key,
    subprotocols,
)

KEY = "sk-test-" + "a" * 24
HOST = {"host": "127.0.0.1:8000"}


def policy(**settings: object) -> AccessPolicy:
    return AccessPolicy(AccessSettings(**settings))  # type: ignore[arg-type]


def keyed(**settings: object) -> AccessPolicy:
    return policy(key_digests=(digest(KEY),), failure_burst=3, failure_window_s=3.0, **settings)


def decide(p: AccessPolicy, headers: dict[str, str], *, kind: str = "http", now: float = 0.0):
    return p.decide(kind, {**HOST, **headers}, peer="10.0.0.1", bound_port=8000, now=now)  # type: ignore[arg-type]


# -- parsing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Api-Key abc", "abc"),  # openpi-client's scheme
        ("api-key abc", "abc"),
        ("Api-Key", None),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer a b", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer(header: str | None, token: str | None) -> None:
    assert bearer(header) == token


@given(st.text())
def test_bearer_never_raises_and_returns_a_bare_token(header: str) -> None:
    token = bearer(header)
    assert token is None or (token and " " not in token and token in header)


def test_subprotocols_as_openai_browsers_send_them() -> None:
    offered = subprotocols(f"realtime, openai-insecure-api-key.{KEY}, openai-beta.realtime-v1")
    assert subprotocol_key(offered) == KEY
    assert select_subprotocol(offered) == "realtime"  # never the key-bearing one
    assert select_subprotocol(["openai-insecure-api-key.x"]) is None
    assert subprotocol_key(["openai-insecure-api-key."]) is None


@given(st.text())
def test_subprotocol_parsing_never_raises(header: str) -> None:
    offered = subprotocols(header)
    key = subprotocol_key(offered)
    assert key is None or key in header
    assert select_subprotocol(offered) in (None, "realtime")


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("LocalHost:8000", ("localhost", 8000)),
        ("127.0.0.1", ("127.0.0.1", None)),
        ("[::1]:9", ("[::1]", 9)),
        ("[::1]", ("[::1]", None)),
        ("a:b", None),
        (":80", None),
        ("x:0", None),
        ("x:70000", None),
        ("[::1", None),
        ("evil.example/x", None),
        ("a@b", None),
        ("", None),
    ],
)
def test_split_host(value: str, parsed: tuple[str, int | None] | None) -> None:
    assert split_host(value) == parsed


@given(st.text())
def test_split_host_never_raises(value: str) -> None:
    parsed = split_host(value)
    assert parsed is None or (parsed[0] and (parsed[1] is None or 0 < parsed[1] <= 65535))


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        ("http://localhost:8000", ("localhost", 8000)),
        ("https://App.Example", ("app.example", 443)),
        ("http://[::1]:80", ("[::1]", 80)),
        ("null", None),
        ("file://", None),
        ("http://x:99999", None),
        ("http://x/path", None),
    ],
)
def test_origin_host(origin: str, host: tuple[str, int] | None) -> None:
    assert origin_host(origin) == host


@given(st.text())
def test_origin_host_never_raises(origin: str) -> None:
    origin_host(origin)


# -- keys and secrets ----------------------------------------------------------


def test_api_keys_compare_digests() -> None:
    keys = ApiKeys.of([KEY, "b" * 16])
    assert keys.check(KEY) and keys.check("b" * 16)
    assert not keys.check(KEY[:-1]) and not keys.check("")
    assert KEY not in repr(keys.digests)
    assert not ApiKeys.of([])


def test_client_secret_is_single_use_and_expires() -> None:
    store = ClientSecrets(max_live=2)
    first = store.mint(now=100.0, ttl_s=10)
    assert first.value.startswith("ek_") and first.expires_at == 110.0
    assert store.redeem(first.value, now=105.0)
    assert not store.redeem(first.value, now=105.0)  # used up
    late = store.mint(now=100.0, ttl_s=10)
    assert not store.redeem(late.value, now=110.0)  # expired at expires_at
    assert not store.redeem("ek_guess", now=100.0)


def test_client_secret_store_is_bounded_and_frees_expired_ones() -> None:
    store = ClientSecrets(max_live=2)
    held = [store.mint(0.0, 10), store.mint(0.0, 20)]
    with pytest.raises(SecretStoreFull):
        store.mint(5.0, 10)  # refused: never drops a secret someone holds
    assert store.statistics().live == 2
    again = store.mint(10.0, 10)  # the first expired: room again
    assert store.redeem(held[1].value, 15.0) and store.redeem(again.value, 15.0)
    assert store.statistics().live == 0


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", (600, {"type": "realtime"})),
        (b"{}", (600, {"type": "realtime"})),
        (
            b'{"expires_after": {"anchor": "created_at", "seconds": 10}, "session": {"x": 1}}',
            (10, {"x": 1}),
        ),
        (b'{"expires_after": {"seconds": 7200}}', (7200, {"type": "realtime"})),
        (b'{"expires_after": {"seconds": 9}}', "expires_after.seconds"),
        (b'{"expires_after": {"seconds": 7201}}', "expires_after.seconds"),
        (b'{"expires_after": {"seconds": true}}', "expires_after"),
        (b'{"expires_after": {"anchor": "now", "seconds": 60}}', "expires_after"),
        (b'{"expires_after": 5}', "expires_after"),
        (b'{"session": []}', "session"),
        (b"[]", "object"),
        (b"{", "JSON"),
        (b"\xff", "JSON"),
        # found by bench/fuzz_endpoints.py: each was a 500 (RecursionError; the echoed
        # session's NaN refused by the JSON writer)
        (b"[" * 100_000 + b"]" * 100_000, "JSON"),
        (b'{"session": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_001, "JSON"),
        (b'{"session": {"a": NaN}}', "JSON"),
        (b'{"session": {"a": [Infinity]}}', "JSON"),
        (b'{"expires_after": {"seconds": -Infinity}}', "JSON"),
        (b'{"session": {"a": 1e999}}', "JSON"),  # a number that overflows to infinity
        (b'{"session": {"a": -1e400, "b": 1.5}}', "JSON"),
    ],
)
def test_client_secret_request(body: bytes, expected: object) -> None:
    parsed = client_secret_request(body, 600)
    if isinstance(expected, str):
        assert isinstance(parsed, Refusal) and parsed.status == 400
        assert expected in parsed.message
    else:
        assert parsed == expected


# -- the limiter ---------------------------------------------------------------


def test_limiter_refuses_after_the_burst_and_recovers_as_it_refills() -> None:
    limiter = FailureLimiter(burst=3, window_s=3.0)
    for _ in range(3):
        assert not limiter.blocked("p", 0.0)
        limiter.fail("p", 0.0)
    assert limiter.blocked("p", 0.0) and limiter.blocked("p", 0.9)
    assert not limiter.blocked("other", 0.0)  # per key
    assert not limiter.blocked("p", 1.0)  # one failure forgiven a second
    limiter.fail("p", 1.0)
    assert limiter.blocked("p", 1.5)
    assert not limiter.blocked("p", 5.0)
    limiter.fail("p", 5.0)
    limiter.fail("p", 5.0)
    assert not limiter.blocked("p", 5.0)  # whole again after the window: a full burst
    assert limiter.statistics().refused == 3


def test_limiter_memory_is_bounded() -> None:
    limiter = FailureLimiter(burst=1, window_s=60.0, max_keys=100)
    for i in range(10_000):
        limiter.fail(f"k{i}", 0.0)
    assert limiter.statistics().tracked == 100
    assert limiter.blocked("k9999", 0.0) and not limiter.blocked("k0", 0.0)


def test_resume_guard_limits_per_peer_and_per_session() -> None:
    guard = ResumeGuard(burst=2, window_s=2.0)
    guard.fail("1.1.1.1", "sess_a", 0.0)
    guard.fail("2.2.2.2", "sess_a", 0.0)  # two peers, one id
    assert guard.blocked("3.3.3.3", "sess_a", 0.0)  # the id is spent, from anywhere
    assert not guard.blocked("3.3.3.3", "sess_b", 0.0)
    guard.fail("1.1.1.1", "sess_c", 0.0)  # one peer, many ids
    assert guard.blocked("1.1.1.1", "sess_d", 0.0)
    assert not guard.blocked("1.1.1.1", "sess_d", 2.0)  # recovered
    assert not guard.blocked("3.3.3.3", "sess_a", 2.0)


# -- the policy ----------------------------------------------------------------


def test_open_loopback_by_default() -> None:
    assert decide(policy(), {}) == Allowed(Principal.OPEN)
    assert decide(policy(), {"authorization": "Bearer whatever"}) == Allowed(Principal.OPEN)


def test_keys_wrong_then_right() -> None:
    p = keyed()
    assert decide(p, {}) is UNAUTHORIZED
    assert decide(p, {"authorization": "Bearer nope"}) is UNAUTHORIZED
    assert decide(p, {"authorization": f"Bearer {KEY}"}) == Allowed(Principal.API_KEY)
    ws = {"sec-websocket-protocol": f"realtime, openai-insecure-api-key.{KEY}"}
    assert decide(p, ws, kind="websocket") == Allowed(Principal.API_KEY)
    assert decide(p, ws, kind="http") is UNAUTHORIZED  # subprotocols are for WebSockets
    body = json.dumps(UNAUTHORIZED.body())
    assert KEY not in body and "nope" not in body


def test_client_secret_is_recognised_on_websockets_only() -> None:
    p = keyed()
    ws = {"sec-websocket-protocol": "realtime, openai-insecure-api-key.ek_abc"}
    assert decide(p, ws, kind="websocket") == Allowed(Principal.CLIENT_SECRET, "ek_abc")
    assert decide(p, {"authorization": "Bearer ek_abc"}) is UNAUTHORIZED


def test_wrong_keys_rate_limit_the_peer_then_it_recovers() -> None:
    p = keyed()
    for _ in range(3):
        assert decide(p, {"authorization": "Bearer guess"}) is UNAUTHORIZED
    right = {"authorization": f"Bearer {KEY}"}
    assert decide(p, right, now=0.5) is RATE_LIMITED  # even the right key, while spent
    assert decide(p, {}, now=0.5) is RATE_LIMITED
    assert decide(p, right, now=1.0) == Allowed(Principal.API_KEY)
    assert p.secret_refused("10.0.0.1", 1.0) is UNAUTHORIZED
    assert decide(p, right, now=1.0) is RATE_LIMITED  # a refused secret counts too


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        (None, True),  # not a browser
        ("http://127.0.0.1:8000", True),  # the page served from here
        ("http://evil.example", False),
        ("http://127.0.0.1:8001", False),
        ("http://localhost:8000", False),  # another name is another origin
        ("null", False),
        ("https://app.example", True),
        ("HTTPS://APP.EXAMPLE:443", True),
    ],
)
def test_origin(origin: str | None, allowed: bool) -> None:
    p = policy(allowed_origins=("https://app.example",))
    headers = {} if origin is None else {"origin": origin}
    assert (decide(p, headers) is FORBIDDEN_ORIGIN) is not allowed
    assert decide(policy(allowed_origins=("*",)), headers) == Allowed(Principal.OPEN)


@pytest.mark.parametrize(
    ("origin", "secure", "allowed"),
    [
        ("http://127.0.0.1:8000", False, True),
        ("https://127.0.0.1:8000", False, False),  # before: the scheme was not compared
        ("https://127.0.0.1:8000", True, True),
        ("http://127.0.0.1:8000", True, False),
        ("https://127.0.0.1:8000", None, True),  # not told: not compared
    ],
)
def test_the_pages_own_origin_has_the_connections_scheme(
    origin: str, secure: bool | None, allowed: bool
) -> None:
    p = policy()
    assert p.origin_allowed(origin, "127.0.0.1:8000", secure) is allowed


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:8000", True),
        ("localhost:8000", True),
        ("[::1]:8000", True),
        ("localhost:8001", False),
        ("localhost", False),  # port 80
        ("attacker.example:8000", False),  # DNS rebinding
        ("duplex.internal:8000", True),  # configured
        ("DUPLEX.internal", True),
        (None, False),
        ("a, b", False),  # two Host headers
    ],
)
def test_host_on_a_loopback_bind(host: str | None, allowed: bool) -> None:
    p = policy(allowed_hosts=("duplex.internal",))
    headers = {} if host is None else {"host": host}
    decision = p.decide("http", headers, peer=None, bound_port=8000, now=0.0)
    assert (decision is MISDIRECTED_HOST) is not allowed


def test_host_on_a_public_bind() -> None:
    anywhere = policy(loopback=False)
    assert anywhere.host_allowed("attacker.example", 8000)  # no names: any
    named = policy(loopback=False, allowed_hosts=("api.example",))
    assert named.host_allowed("api.example:443", 8000)
    assert not named.host_allowed("localhost:8000", 8000)
    assert policy(allowed_hosts=("*",)).host_allowed("x", 8000)


def test_peer_connections_refuse_at_the_cap_and_recover() -> None:
    peers = PeerConnections(2)
    assert peers.enter("10.0.0.1") and peers.enter("10.0.0.1")
    assert not peers.enter("10.0.0.1")  # refused: nothing counted
    assert peers.enter("10.0.0.2")  # another address is not affected
    peers.leave("10.0.0.1")
    assert peers.enter("10.0.0.1")
    for _ in range(2):
        peers.leave("10.0.0.1")
    peers.leave("10.0.0.2")
    assert peers.open == {}  # no entry is kept for a peer with nothing open


def test_peer_connections_without_a_cap() -> None:
    peers = PeerConnections(0)
    assert all(peers.enter(None) for _ in range(1000))
