"""The store of ``/v1/videos`` jobs: their states, progress, content and retention; pure.

::

    queued ──start──> in_progress ──complete──> completed
      │                   │ ╰──────fail──────> failed
      ╰──cancel / fail────┴──────cancel──────> cancelled

Every transition is in `TRANSITIONS`; one the table lacks (a job that finished
while its ``DELETE`` arrived) is refused with ``False`` and changes nothing, so the
late party drops its result. Time is passed in (``now``, a Unix time), never read.

Bounds: at most ``max_active`` jobs queued or in progress (more are refused: 429),
at most ``max_jobs`` kept in all (the oldest finished job is evicted for a new
one), and a finished job is kept ``retention_s`` after it finished (then gone:
404). ``DELETE`` cancels an active job (its work is withdrawn by the route) and
removes a finished one.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, final

__all__ = ["JobStatus", "JobStore", "JobStoreFull", "JobStoreStatistics", "VideoJob"]


class JobStatus(enum.Enum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


_Q, _P = JobStatus.QUEUED, JobStatus.IN_PROGRESS
TRANSITIONS: Final[Mapping[tuple[JobStatus, str], JobStatus]] = {
    (_Q, "start"): _P,
    (_Q, "cancel"): JobStatus.CANCELLED,
    (_Q, "fail"): JobStatus.FAILED,
    (_P, "complete"): JobStatus.COMPLETED,
    (_P, "cancel"): JobStatus.CANCELLED,
    (_P, "fail"): JobStatus.FAILED,
}
"""(state, event) -> next state; absent pairs are refused."""


class JobStoreFull(Exception):
    """``max_active`` jobs are queued or running: the client should retry later (429)."""


@final
@dataclass(slots=True)
class VideoJob:
    """One job. ``progress`` is 0..100; ``completed_at`` is set in every finished state."""

    id: str
    model: str
    prompt: str
    size: str
    seconds: str
    created_at: float
    status: JobStatus = JobStatus.QUEUED
    progress: int = 0
    completed_at: float | None = None
    error: dict[str, str] | None = None
    content: bytes | None = field(default=None, repr=False)

    def as_dict(self, retention_s: float) -> dict[str, Any]:
        """OpenAI's video object (``status`` may also be ``cancelled``)."""
        finished = self.completed_at
        return {
            "id": self.id,
            "object": "video",
            "model": self.model,
            "status": self.status.value,
            "progress": self.progress,
            "created_at": int(self.created_at),
            "completed_at": None if finished is None else int(finished),
            "expires_at": None if finished is None else int(finished + retention_s),
            "prompt": self.prompt,
            "size": self.size,
            "seconds": self.seconds,
            "error": self.error,
        }


@final
@dataclass(frozen=True, slots=True)
class JobStoreStatistics:
    jobs: int
    active: int
    created: int
    refused: int
    completed: int
    failed: int
    cancelled: int
    expired: int
    evicted: int


@final
class JobStore:
    """The jobs by id, oldest first."""

    def __init__(self, *, max_jobs: int, max_active: int, retention_s: float) -> None:
        if not 1 <= max_active <= max_jobs:
            raise ValueError("need 1 <= max_active <= max_jobs")
        self.max_jobs = max_jobs
        self.max_active = max_active
        self.retention_s = retention_s
        self._jobs: dict[str, VideoJob] = {}
        self._counts = dict.fromkeys(
            ("created", "refused", "completed", "failed", "cancelled", "expired", "evicted"), 0
        )

    def _active(self) -> int:
        return sum(1 for job in self._jobs.values() if not job.status.finished)

    def expire(self, now: float) -> None:
        """Forget finished jobs older than the retention."""
        for job in list(self._jobs.values()):
            if job.completed_at is not None and now >= job.completed_at + self.retention_s:
                del self._jobs[job.id]
                self._counts["expired"] += 1

    def create(self, job: VideoJob, now: float) -> VideoJob:
        """Admit a new queued job.

        Raises:
            JobStoreFull: ``max_active`` jobs are active, or every kept job is active.
        """
        self.expire(now)
        if self._active() >= self.max_active:
            self._counts["refused"] += 1
            raise JobStoreFull(f"{self.max_active} video jobs are queued or in progress")
        while len(self._jobs) >= self.max_jobs:
            oldest = next(j for j in self._jobs.values() if j.status.finished)
            del self._jobs[oldest.id]
            self._counts["evicted"] += 1
        self._jobs[job.id] = job
        self._counts["created"] += 1
        return job

    def get(self, job_id: str, now: float) -> VideoJob | None:
        self.expire(now)
        return self._jobs.get(job_id)

    def list(self, now: float, *, limit: int = 20, after: str | None = None) -> list[VideoJob]:
        """Newest first; ``after``: the id the previous page ended with."""
        self.expire(now)
        jobs = list(reversed(self._jobs.values()))
        if after is not None:
            ids = [job.id for job in jobs]
            jobs = jobs[ids.index(after) + 1 :] if after in ids else []
        return jobs[:limit]

    def _move(self, job_id: str, event: str, now: float) -> VideoJob | None:
        job = self._jobs.get(job_id)
        if job is None:
            return None
        target = TRANSITIONS.get((job.status, event))
        if target is None:
            return None
        job.status = target
        if target.finished:
            job.completed_at = now
            self._counts[target.value] += 1
        return job

    def start(self, job_id: str, now: float) -> bool:
        return self._move(job_id, "start", now) is not None

    def set_progress(self, job_id: str, percent: int) -> None:
        """Progress of an in-progress job (0..99: 100 is for ``complete``)."""
        job = self._jobs.get(job_id)
        if job is not None and job.status is JobStatus.IN_PROGRESS:
            job.progress = max(job.progress, min(99, max(0, percent)))

    def complete(self, job_id: str, content: bytes, now: float) -> bool:
        job = self._move(job_id, "complete", now)
        if job is None:
            return False
        job.content = content
        job.progress = 100
        return True

    def fail(
        self, job_id: str, message: str, now: float, *, code: str = "generation_failed"
    ) -> bool:
        job = self._move(job_id, "fail", now)
        if job is None:
            return False
        job.error = {"code": code, "message": message}
        return True

    def cancel(self, job_id: str, now: float) -> bool:
        """Cancel an active job; ``False``: it is unknown or already finished."""
        return self._move(job_id, "cancel", now) is not None

    def remove(self, job_id: str) -> bool:
        """Forget a finished job; ``False``: unknown, or still active (cancel it first)."""
        job = self._jobs.get(job_id)
        if job is None or not job.status.finished:
            return False
        del self._jobs[job_id]
        return True

    def statistics(self) -> JobStoreStatistics:
        return JobStoreStatistics(jobs=len(self._jobs), active=self._active(), **self._counts)
