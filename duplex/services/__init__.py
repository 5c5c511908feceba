"""duplex.services: the request route families beside the sessions' routes.

One package per family, each a wire schema (``_protocol.py``, sans-I/O) and its
serving (``_serving.py``: the routes and the service they call): ``speech``
(``/v1/audio/speech*``), ``media`` (``/v1/images/*``, ``/v1/videos*``,
``/v1/realtime/video``) and ``robots`` (OpenPI). The topology builds the
services and hands their routes to the app (``duplex.transport.build_app``);
the app imports none of them.

``_cost.py`` is what every family shares: a request's cost estimated before it is
accepted, and the process's budget it is checked against (sans-I/O); ``_models.py`` the one
policy of a request's ``model`` (the served names, OpenAI's names as aliases, one refusal).
"""

from ._cost import (
    CHARS_PER_SECOND,
    DIFFUSION_BYTES_PER_PIXEL,
    DIFFUSION_CALL_UNITS,
    DIFFUSION_KNEE_PIXELS,
    DIFFUSION_SECONDS_PER_UNIT,
    Cost,
    CostBudget,
    CostLease,
    CostStatistics,
    DiffusionCost,
    DiffusionShape,
    default_media_memory_bytes,
    speech_audio_refusal,
    speech_audio_seconds,
)

__all__ = [
    "CHARS_PER_SECOND",
    "DIFFUSION_BYTES_PER_PIXEL",
    "DIFFUSION_CALL_UNITS",
    "DIFFUSION_KNEE_PIXELS",
    "DIFFUSION_SECONDS_PER_UNIT",
    "Cost",
    "CostBudget",
    "CostLease",
    "CostStatistics",
    "DiffusionCost",
    "DiffusionShape",
    "default_media_memory_bytes",
    "speech_audio_refusal",
    "speech_audio_seconds",
]
