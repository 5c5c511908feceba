"""Refusal reasons and the rate limit of their log lines."""

from __future__ import annotations

import pytest

from duplex.sessions._admission import Admission, RefusalLog, RefusalReason


def test_first_refusal_of_each_reason_is_logged_then_one_line_per_interval() -> None:
    log = RefusalLog(interval_s=10.0)
    assert log.note(RefusalReason.STEP_TIME, 0.0) == 0
    assert log.note(RefusalReason.SLOTS, 0.5) == 0  # another reason has its own line
    assert [log.note(RefusalReason.STEP_TIME, t) for t in (1.0, 2.0, 9.9)] == [None] * 3
    assert log.note(RefusalReason.STEP_TIME, 10.0) == 3  # says how many went unlogged
    assert log.note(RefusalReason.STEP_TIME, 25.0) == 0


def test_refusal_log_rejects_a_bad_interval() -> None:
    with pytest.raises(ValueError):
        RefusalLog(interval_s=0)


def test_admission_bound_and_live() -> None:
    adm = Admission(capacity=2)
    assert adm.try_admit("a") and adm.try_admit("b")
    assert (adm.bound, adm.live) == (2, 2)
    adm.release("a")
    assert adm.live == 1
