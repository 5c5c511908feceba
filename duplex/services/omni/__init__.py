"""Operator routes of the engine: ``POST /v1/omni/sleep`` and ``POST /v1/omni/wakeup``, and the
gate that answers every other service route ``engine_sleeping`` while it sleeps."""

from ._serving import SLEEPING, EngineSleep, OmniService, gated_while_asleep, omni_routes

__all__ = ["SLEEPING", "EngineSleep", "OmniService", "gated_while_asleep", "omni_routes"]
