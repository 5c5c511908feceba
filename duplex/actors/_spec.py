"""Supervision policy as plain values (OTP's child specs and restart intensity)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import final


class Strategy(enum.Enum):
    """Which siblings restart when one child fails."""

    ONE_FOR_ONE = "one_for_one"
    """Only the failed child."""
    ONE_FOR_ALL = "one_for_all"
    """Every child: all stop (reverse start order), then all start (start order)."""
    REST_FOR_ONE = "rest_for_one"
    """The failed child and every child started after it."""


class Restart(enum.Enum):
    """When a child is restarted after it ends."""

    PERMANENT = "permanent"
    """Always, even after a normal stop."""
    TRANSIENT = "transient"
    """Only after a crash."""
    TEMPORARY = "temporary"
    """Never."""


@final
@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before the n-th consecutive restart: ``min(initial * factor**(n-1), maximum)``."""

    initial: float = 0.1
    factor: float = 2.0
    maximum: float = 10.0

    def __post_init__(self) -> None:
        if self.initial < 0 or self.factor < 1 or self.maximum < self.initial:
            raise ValueError(f"invalid backoff {self}")

    def delay(self, n: int) -> float:
        if n <= 0:
            return 0.0
        return min(self.initial * self.factor ** (n - 1), self.maximum)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SupervisorSpec:
    """Strategy and restart intensity: more than ``max_restarts`` within ``period`` s escalates.

    OTP semantics: the restarts of all children count together; a supervisor
    that exceeds its intensity stops every child and fails, so its parent decides.
    """

    strategy: Strategy = Strategy.ONE_FOR_ONE
    max_restarts: int = 3
    period: float = 5.0
    backoff: Backoff | None = None
    default_restart: Restart = Restart.PERMANENT

    def __post_init__(self) -> None:
        if not isinstance(self.strategy, Strategy) or not isinstance(self.default_restart, Restart):
            raise ValueError("strategy and default_restart must be Strategy / Restart members")
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        if not (self.period > 0 and math.isfinite(self.period)):
            raise ValueError("period must be a positive number of seconds")
