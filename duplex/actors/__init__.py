"""The actor runtime: actors, refs, mailboxes with lanes, OTP supervision, the system.

This package imports no other duplex package (only ``duplex.exceptions``,
``duplex.logs`` and ``duplex.metrics``); ``tests/actors/test_layering.py`` checks it.
"""

from ._actor import Actor, ActorContext, ControlMessage
from ._mailbox import (
    CONTROL,
    DATA,
    DEFAULT_LANES,
    LaneSpec,
    LaneStatistics,
    Mailbox,
    MailboxStatistics,
    Overflow,
)
from ._ref import ActorRef, Reply
from ._spec import Backoff, Restart, Strategy, SupervisorSpec
from ._supervisor import Supervisor, unwrap
from ._system import ActorSystem, DeadLetter, open_actor_system, run_until_signal

__all__ = [
    "CONTROL",
    "DATA",
    "DEFAULT_LANES",
    "Actor",
    "ActorContext",
    "ActorRef",
    "ActorSystem",
    "Backoff",
    "ControlMessage",
    "DeadLetter",
    "LaneSpec",
    "LaneStatistics",
    "Mailbox",
    "MailboxStatistics",
    "Overflow",
    "Reply",
    "Restart",
    "Strategy",
    "Supervisor",
    "SupervisorSpec",
    "open_actor_system",
    "run_until_signal",
    "unwrap",
]
