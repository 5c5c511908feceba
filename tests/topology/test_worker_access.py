"""Connection workers share the server's wrong-credential budget (`worker_access`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.topology._workers import worker_access
from duplex.transport import AccessSettings
from duplex.transport._access import FailureLimiter


@given(st.integers(1, 200), st.floats(0.1, 3600), st.integers(1, 16))
def test_a_peer_on_every_worker_gets_the_servers_burst_and_refill(
    burst: int, window: float, workers: int
) -> None:
    """However the kernel spreads a peer's connections, the workers together let through at
    most the server's burst (or one each, when there are more workers than failures), and
    forgive at the server's rate."""
    share = worker_access(AccessSettings(failure_burst=burst, failure_window_s=window), workers)
    limiters = [
        FailureLimiter(burst=share.failure_burst, window_s=share.failure_window_s)
        for _ in range(workers)
    ]
    admitted = 0
    for limiter in limiters:  # the worst case: the peer tries each worker until it is refused
        while not limiter.blocked("peer", 0.0):
            limiter.fail("peer", 0.0)
            admitted += 1
    assert admitted <= max(burst, workers)
    assert admitted >= min(burst, workers)
    if workers == 1:
        assert share == AccessSettings(failure_burst=burst, failure_window_s=window)
    refill_per_s = workers * share.failure_burst / share.failure_window_s
    assert refill_per_s == pytest.approx(burst / window)
