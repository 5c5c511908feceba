"""The request engine serving a policy: the batching rule on numbers, the trio loop under
MockClock, the reference policy, and ``--policy module:factory``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from duplex.exceptions import ConfigError, RequestFailed, RequestsOverloaded
from duplex.models import (
    OneAtATime,
    PolicyOptions,
    PolicyRequest,
    PolicyRunner,
    ReferencePolicy,
    RequestBatcher,
    RequestEngine,
    load_policy,
)
from duplex.models._driver import inline

# -- the batching rule ---------------------------------------------------------------------


def test_a_lone_request_is_due_after_the_wait() -> None:
    batcher = RequestBatcher(max_batch=4, max_wait_s=0.002, max_queue=8)
    assert batcher.due() is None
    batcher.submit(1, now=10.0)
    assert batcher.due() == pytest.approx(10.002)
    batcher.submit(2, now=10.001)
    assert batcher.due() == pytest.approx(10.002)  # the oldest decides
    assert batcher.take() == [1, 2]
    assert batcher.due() is None


def test_a_full_batch_is_due_at_once_and_takes_the_oldest() -> None:
    batcher = RequestBatcher(max_batch=3, max_wait_s=1.0, max_queue=8)
    for ticket in range(5):
        batcher.submit(ticket, now=float(ticket))
    assert batcher.due() == 0.0  # three wait: due since the oldest arrived
    assert batcher.take() == [0, 1, 2]
    assert batcher.due() == pytest.approx(4.0)  # two left: the oldest waits its wait
    stats = batcher.statistics()
    assert (stats.batches, stats.batched, stats.largest_batch, stats.queued) == (1, 3, 3, 2)


def test_the_queue_refuses_when_full_and_takes_again_once_drained() -> None:
    batcher = RequestBatcher(max_batch=2, max_wait_s=0.0, max_queue=2)
    assert batcher.submit(1, 0.0) and batcher.submit(2, 0.0)
    assert not batcher.submit(3, 0.0)
    assert batcher.statistics().refused == 1
    batcher.take()
    assert batcher.submit(3, 0.0)
    assert batcher.statistics().peak_queued == 2


def test_a_cancelled_request_leaves_the_queue() -> None:
    batcher = RequestBatcher(max_batch=4, max_wait_s=1.0, max_queue=8)
    batcher.submit(1, 0.0)
    batcher.submit(2, 0.5)
    assert batcher.cancel(1) and not batcher.cancel(1)
    assert batcher.due() == pytest.approx(1.5)
    assert batcher.take() == [2]
    assert batcher.statistics().cancelled == 1


def test_bounds_are_checked() -> None:
    for kwargs in (
        {"max_batch": 0, "max_wait_s": 0.0, "max_queue": 1},
        {"max_batch": 1, "max_wait_s": -1.0, "max_queue": 1},
        {"max_batch": 4, "max_wait_s": 0.0, "max_queue": 2},
    ):
        with pytest.raises(ConfigError):
            RequestBatcher(**kwargs)


@given(
    st.lists(
        st.tuples(st.sampled_from(["submit", "cancel", "take"]), st.integers(0, 20)),
        max_size=60,
    ),
    st.integers(1, 5),
)
def test_every_request_is_taken_at_most_once_in_order(
    steps: list[tuple[str, int]], max_batch: int
) -> None:
    batcher = RequestBatcher(max_batch=max_batch, max_wait_s=0.01, max_queue=8)
    queued: list[int] = []
    taken: list[int] = []
    ticket = 0
    for now, (op, arg) in enumerate(steps):
        if op == "submit":
            if batcher.submit(ticket, float(now)):
                queued.append(ticket)
            else:
                assert len(queued) == 8
            ticket += 1
        elif op == "cancel" and queued:
            victim = queued[arg % len(queued)]
            assert batcher.cancel(victim)
            queued.remove(victim)
        elif op == "take":
            batch = batcher.take()
            assert batch == queued[:max_batch] and len(batch) <= max_batch
            del queued[: len(batch)]
            taken += batch
        assert len(batcher) == len(queued)
        due = batcher.due()
        assert (due is None) == (not queued)
    assert taken == sorted(taken) and len(set(taken)) == len(taken)


# -- the driver ----------------------------------------------------------------------------


class Recording:
    """A batched policy that records each call's requests; answers with its batch size."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[list[PolicyRequest]] = []
        self.fail_on = fail_on

    @property
    def metadata(self) -> Mapping[str, Any]:
        return {"kind": "recording"}

    def infer_batch(self, requests: Sequence[PolicyRequest]) -> list[Any]:
        self.calls.append(list(requests))
        if any(r.observation.get("boom") for r in requests):
            raise RuntimeError("the whole batch fails")
        return [
            ValueError("bad one")
            if r.observation.get("bad")
            else {"actions": np.full(2, r.observation["i"], np.float32), "n": len(requests)}
            for r in requests
        ]


def request(i: int, **extra: Any) -> PolicyRequest:
    return PolicyRequest({"i": i, **extra}, session_id=f"s{i}", reset=False, client=i)


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def run_engine(
    engine: RequestEngine[PolicyRequest, Any],
    requests: list[PolicyRequest],
    *,
    spacing_s: float = 0.0,
) -> list[Any]:
    """Submit ``requests`` (one every ``spacing_s``) concurrently; each one's reply or error."""
    out: list[Any] = [None] * len(requests)

    async def one(index: int) -> None:
        try:
            out[index] = await engine.submit_timed(requests[index])
        except (RequestFailed, RequestsOverloaded) as exc:
            out[index] = exc

    async with trio.open_nursery() as loop:
        await loop.start(engine.run)
        async with trio.open_nursery() as robots:
            for index in range(len(requests)):
                robots.start_soon(one, index)
                if spacing_s:
                    await trio.sleep(spacing_s)
        loop.cancel_scope.cancel()
    return out


async def test_concurrent_requests_share_one_call_and_each_gets_its_own_result(
    clock: trio.testing.MockClock,
) -> None:
    policy = Recording()
    engine = RequestEngine(PolicyRunner(policy, max_batch=8), max_wait_s=0.002, offload=inline)
    replies = await run_engine(engine, [request(i) for i in range(5)])
    assert len(policy.calls) == 1
    for i, reply in enumerate(replies):
        assert reply.result["actions"][0] == i and reply.batch_size == 5
    assert engine.statistics().batcher.largest_batch == 5


async def test_a_lone_request_waits_only_the_batch_wait(clock: trio.testing.MockClock) -> None:
    engine = RequestEngine(PolicyRunner(Recording(), max_batch=8), max_wait_s=0.002, offload=inline)
    async with trio.open_nursery() as loop:
        await loop.start(engine.run)
        start = trio.current_time()
        await engine.submit_timed(request(1))
        assert trio.current_time() - start == pytest.approx(0.002)
        loop.cancel_scope.cancel()


async def test_requests_beyond_max_batch_run_in_the_next_call(
    clock: trio.testing.MockClock,
) -> None:
    policy = Recording()
    engine = RequestEngine(PolicyRunner(policy, max_batch=3), max_wait_s=0.002, offload=inline)
    replies = await run_engine(engine, [request(i) for i in range(7)])
    assert [len(call) for call in policy.calls] == [3, 3, 1]
    assert [r.result["actions"][0] for r in replies] == list(range(7))


async def test_requests_spread_out_run_alone(clock: trio.testing.MockClock) -> None:
    policy = Recording()
    engine = RequestEngine(PolicyRunner(policy, max_batch=8), max_wait_s=0.002, offload=inline)
    await run_engine(engine, [request(i) for i in range(3)], spacing_s=0.01)
    assert [len(call) for call in policy.calls] == [1, 1, 1]


async def test_requests_gather_while_a_batch_runs(clock: trio.testing.MockClock) -> None:
    """A slow policy: what arrives during one call runs together in the next."""
    policy = Recording()

    async def slow(fn: Any) -> Any:
        await trio.sleep(0.05)  # the call takes 50 ms of (mock) time
        return fn()

    engine = RequestEngine(PolicyRunner(policy, max_batch=16), max_wait_s=0.002, offload=slow)
    await run_engine(engine, [request(i) for i in range(6)], spacing_s=0.01)
    assert [len(call) for call in policy.calls] == [1, 5]


async def test_one_failed_request_fails_alone(clock: trio.testing.MockClock) -> None:
    engine = RequestEngine(PolicyRunner(Recording(), max_batch=8), max_wait_s=0.002, offload=inline)
    replies = await run_engine(engine, [request(0), request(1, bad=True), request(2)])
    assert isinstance(replies[1], RequestFailed)
    assert isinstance(replies[1].__cause__, ValueError)
    assert replies[0].result["actions"][0] == 0 and replies[2].result["actions"][0] == 2
    assert engine.statistics().failed_requests == 1


async def test_a_raising_policy_fails_its_batch_and_the_engine_goes_on(
    clock: trio.testing.MockClock,
) -> None:
    policy = Recording()
    engine = RequestEngine(PolicyRunner(policy, max_batch=8), max_wait_s=0.002, offload=inline)
    async with trio.open_nursery() as loop:
        await loop.start(engine.run)
        with pytest.raises(RequestFailed) as failed:
            await engine.submit_timed(request(0, boom=True))
        assert isinstance(failed.value.__cause__, RuntimeError)
        reply = await engine.submit_timed(request(1))  # recovers
        assert reply.result["actions"][0] == 1
        loop.cancel_scope.cancel()
    assert engine.statistics().failed_batches == 1


async def test_a_policy_returning_too_few_results_fails_the_batch(
    clock: trio.testing.MockClock,
) -> None:
    class Short(Recording):
        def infer_batch(self, requests: Sequence[PolicyRequest]) -> list[Any]:
            return []

    engine = RequestEngine(PolicyRunner(Short(), max_batch=8), max_wait_s=0.0, offload=inline)
    replies = await run_engine(engine, [request(0), request(1)])
    assert all(isinstance(r, RequestFailed) for r in replies)
    assert "0 results for 2" in str(replies[0].__cause__)


async def test_a_full_queue_refuses_and_then_takes_again(clock: trio.testing.MockClock) -> None:
    """One request runs (a 1 s call), one waits in a queue of one: the third is refused."""

    async def slow(fn: Any) -> Any:
        await trio.sleep(1.0)
        return fn()

    engine = RequestEngine(
        PolicyRunner(Recording(), max_batch=1), max_wait_s=0.0, max_queue=1, offload=slow
    )
    replies: list[Any] = []

    async def robot(i: int) -> None:
        try:
            replies.append(await engine.submit_timed(request(i)))
        except RequestsOverloaded as exc:
            replies.append(exc)

    async with trio.open_nursery() as loop:
        await loop.start(engine.run)
        async with trio.open_nursery() as robots:
            robots.start_soon(robot, 0)
            await trio.sleep(0.1)  # taken: its call runs
            robots.start_soon(robot, 1)
            await trio.sleep(0.1)  # queued
            with pytest.raises(RequestsOverloaded):
                await engine.submit_timed(request(2))
        assert [r.result["actions"][0] for r in replies] == [0, 1]
        assert (await engine.submit_timed(request(3))).result["actions"][0] == 3  # recovered
        loop.cancel_scope.cancel()
    assert engine.statistics().batcher.refused == 1


async def test_a_robot_that_leaves_while_queued_is_withdrawn(
    clock: trio.testing.MockClock,
) -> None:
    policy = Recording()
    engine = RequestEngine(PolicyRunner(policy, max_batch=8), max_wait_s=1.0, offload=inline)
    async with trio.open_nursery() as loop:
        await loop.start(engine.run)
        with trio.move_on_after(0.1):
            await engine.submit_timed(request(0))
        reply = await engine.submit_timed(request(1))
        loop.cancel_scope.cancel()
    assert [len(call) for call in policy.calls] == [1]
    assert reply.result["actions"][0] == 1
    assert engine.statistics().batcher.cancelled == 1


async def test_a_robot_that_leaves_mid_batch_orphans_its_result(
    clock: trio.testing.MockClock,
) -> None:
    async def slow(fn: Any) -> Any:
        await trio.sleep(0.05)
        return fn()

    engine = RequestEngine(PolicyRunner(Recording(), max_batch=8), max_wait_s=0.0, offload=slow)
    async with trio.open_nursery() as loop:
        await loop.start(engine.run)
        with trio.move_on_after(0.02):
            await engine.submit_timed(request(0))
        await trio.sleep(0.1)
        loop.cancel_scope.cancel()
    assert engine.statistics().orphaned == 1


async def test_requests_waiting_when_the_loop_stops_are_failed_not_left_hanging(
    clock: trio.testing.MockClock,
) -> None:
    engine = RequestEngine(PolicyRunner(Recording(), max_batch=8), max_wait_s=10.0, offload=inline)
    outcome: list[BaseException] = []

    async def robot() -> None:
        try:
            await engine.submit_timed(request(0))
        except RequestFailed as exc:
            outcome.append(exc)

    async with trio.open_nursery() as nursery, trio.open_nursery() as loop:
        await loop.start(engine.run)
        nursery.start_soon(robot)
        await trio.sleep(1.0)
        loop.cancel_scope.cancel()
    assert len(outcome) == 1 and "stopped" in str(outcome[0])


# -- policies ------------------------------------------------------------------------------


def observation(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "observation/state": rng.standard_normal(8).astype(np.float32),
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (96, 128, 3), dtype=np.uint8),
        "prompt": "pick up the cube",
    }


def test_the_reference_policy_answers_chunks_of_the_configured_shape() -> None:
    policy = ReferencePolicy(PolicyOptions(action_horizon=50, action_dim=14, seed=3))
    (result,) = policy.infer_batch([PolicyRequest(observation())])
    assert result["actions"].shape == (50, 14) and result["actions"].dtype == np.float32
    assert np.all(np.abs(result["actions"]) <= 1.0)
    assert policy.metadata["action_horizon"] == 50 and policy.metadata["action_dim"] == 14


def test_the_reference_policy_is_seeded_and_batching_changes_nothing() -> None:
    options = PolicyOptions(seed=5)
    one = ReferencePolicy(options).infer_batch([PolicyRequest(observation(1))])[0]
    batch = ReferencePolicy(options).infer_batch([PolicyRequest(observation(i)) for i in range(4)])
    np.testing.assert_allclose(batch[1]["actions"], one["actions"], rtol=1e-5, atol=1e-6)
    other = ReferencePolicy(PolicyOptions(seed=6)).infer_batch([PolicyRequest(observation(1))])
    assert not np.allclose(other[0]["actions"], one["actions"])
    assert not np.allclose(batch[0]["actions"], batch[1]["actions"])  # inputs matter


def test_the_reference_policy_fails_a_bad_observation_alone() -> None:
    policy = ReferencePolicy(PolicyOptions())
    bad = [
        {"observation/image": np.zeros((4, 4), np.uint8)},
        {"observation/image": np.zeros((4, 4, 3), np.float32)},
        {"observation/state": "joints"},
        {"observation/state": np.zeros(2, np.complex64)},
    ]
    results = policy.infer_batch([PolicyRequest(o) for o in [observation(), *bad]])
    assert results[0]["actions"].shape == (10, 8)
    assert all(isinstance(r, ValueError) for r in results[1:])
    (empty,) = policy.infer_batch([PolicyRequest({})])  # missing keys read as zeros
    assert empty["actions"].shape == (10, 8)


def factory(options: PolicyOptions) -> OneAtATime:
    """A ``module:factory`` for ``load_policy`` (this test module)."""

    def infer(obs: Mapping[str, Any]) -> dict[str, Any]:
        if "boom" in obs:
            raise RuntimeError("no")
        return {"actions": np.zeros((options.action_horizon, options.action_dim), np.float32)}

    return OneAtATime(infer, {"custom": True})


def not_a_policy(options: PolicyOptions) -> object:
    return object()


def test_module_factory_policies_load_and_are_checked() -> None:
    policy = load_policy(f"{__name__}:factory", PolicyOptions(action_horizon=3, action_dim=2))
    assert policy.metadata == {"custom": True}
    ok, failed = policy.infer_batch([PolicyRequest({}), PolicyRequest({"boom": 1})])
    assert ok["actions"].shape == (3, 2) and isinstance(failed, RuntimeError)
    for name, message in (
        ("no.such.module:factory", "cannot import"),
        (f"{__name__}:missing", "no callable"),
        (f"{__name__}:not_a_policy", "infer_batch"),
        ("justaname", "module:factory"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_policy(name, PolicyOptions())
    assert isinstance(load_policy("reference", PolicyOptions()), ReferencePolicy)
