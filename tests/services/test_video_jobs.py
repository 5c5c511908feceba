"""The video job store: every transition of its table, its bounds both ways, retention."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.services.media._video_jobs import (
    TRANSITIONS,
    JobStatus,
    JobStore,
    JobStoreFull,
    VideoJob,
)


def job(i: int, now: float = 0.0) -> VideoJob:
    return VideoJob(id=f"v{i}", model="m", prompt="p", size="8x8", seconds="1", created_at=now)


def store(**kw: float) -> JobStore:
    return JobStore(**{"max_jobs": 4, "max_active": 2, "retention_s": 100.0, **kw})  # type: ignore[arg-type]


EVENTS = ("start", "complete", "fail", "cancel")


def apply(jobs: JobStore, event: str, job_id: str, now: float) -> bool:
    if event == "start":
        return jobs.start(job_id, now)
    if event == "complete":
        return jobs.complete(job_id, b"mp4", now)
    if event == "fail":
        return jobs.fail(job_id, "broken", now)
    return jobs.cancel(job_id, now)


def reach(jobs: JobStore, status: JobStatus) -> None:
    path = {
        JobStatus.QUEUED: [],
        JobStatus.IN_PROGRESS: ["start"],
        JobStatus.COMPLETED: ["start", "complete"],
        JobStatus.FAILED: ["start", "fail"],
        JobStatus.CANCELLED: ["cancel"],
    }[status]
    for event in path:
        assert apply(jobs, event, "v0", 1.0)


@pytest.mark.parametrize("status", list(JobStatus))
@pytest.mark.parametrize("event", EVENTS)
def test_each_cell_of_the_table(status: JobStatus, event: str) -> None:
    jobs = store()
    jobs.create(job(0), 0.0)
    reach(jobs, status)
    target = TRANSITIONS.get((status, event))
    assert apply(jobs, event, "v0", 2.0) is (target is not None)
    current = jobs.get("v0", 2.0)
    assert current is not None
    assert current.status is (target or status)
    if target is not None and target.finished:
        assert current.completed_at == 2.0
        assert current.as_dict(100.0)["expires_at"] == 102


def test_completed_job_holds_its_content_and_full_progress() -> None:
    jobs = store()
    jobs.create(job(0), 0.0)
    jobs.set_progress("v0", 50)  # queued: no progress yet
    assert jobs.get("v0", 0.0).progress == 0  # type: ignore[union-attr]
    jobs.start("v0", 1.0)
    jobs.set_progress("v0", 150)
    assert jobs.get("v0", 1.0).progress == 99  # type: ignore[union-attr]
    jobs.set_progress("v0", 10)  # never goes back
    assert jobs.get("v0", 1.0).progress == 99  # type: ignore[union-attr]
    jobs.complete("v0", b"mp4", 2.0)
    done = jobs.get("v0", 2.0)
    assert done is not None and (done.progress, done.content) == (100, b"mp4")
    assert done.as_dict(100.0)["status"] == "completed"


def test_active_bound_refuses_then_recovers() -> None:
    jobs = store()
    jobs.create(job(0), 0.0)
    jobs.create(job(1), 0.0)
    with pytest.raises(JobStoreFull):
        jobs.create(job(2), 0.0)
    jobs.cancel("v0", 1.0)
    jobs.create(job(2), 1.0)
    assert jobs.statistics().refused == 1


def test_count_bound_evicts_the_oldest_finished_job() -> None:
    jobs = store()
    for i in range(4):
        jobs.create(job(i), float(i))
        jobs.cancel(f"v{i}", float(i))
    jobs.create(job(4), 5.0)
    assert jobs.get("v0", 5.0) is None
    assert [j.id for j in jobs.list(5.0)] == ["v4", "v3", "v2", "v1"]
    assert jobs.statistics().evicted == 1


def test_retention_forgets_finished_jobs_only() -> None:
    jobs = store()
    jobs.create(job(0), 0.0)
    jobs.create(job(1), 0.0)
    jobs.cancel("v0", 10.0)
    assert jobs.get("v0", 109.0) is not None
    assert jobs.get("v0", 110.0) is None
    assert jobs.get("v1", 10_000.0) is not None  # queued jobs never expire
    assert jobs.statistics().expired == 1


def test_remove_only_finished_jobs_and_pages() -> None:
    jobs = store(max_jobs=10, max_active=10)
    for i in range(5):
        jobs.create(job(i), float(i))
    assert not jobs.remove("v0")  # active
    jobs.cancel("v0", 6.0)
    assert jobs.remove("v0")
    assert not jobs.remove("v0")
    assert [j.id for j in jobs.list(6.0, limit=2)] == ["v4", "v3"]
    assert [j.id for j in jobs.list(6.0, limit=2, after="v3")] == ["v2", "v1"]
    assert jobs.list(6.0, after="gone") == []


@given(st.lists(st.tuples(st.sampled_from((*EVENTS, "create", "remove")), st.integers(0, 5))))
def test_any_sequence_keeps_the_bounds(steps: list[tuple[str, int]]) -> None:
    jobs = store()
    now = 0.0
    for event, i in steps:
        now += 7.0
        if event == "create":
            with contextlib.suppress(JobStoreFull):
                jobs.create(job(i * 100 + int(now)), now)
        elif event == "remove":
            jobs.remove(f"v{i}")
        else:
            apply(jobs, event, f"v{i}", now)
        stats = jobs.statistics()
        assert stats.jobs <= 4 and stats.active <= 2
        for kept in jobs.list(now, limit=10):
            assert kept.status.finished is (kept.completed_at is not None)
