"""The voice routes: ``GET``/``POST /v1/audio/voices`` and ``DELETE /v1/audio/voices/{name}``.

``GET`` lists the TTS engine's built-in voices (when a TTS is served) and the uploaded
ones; ``POST`` (multipart, the SDK's ``audio.voices.create``: ``name``, ``audio_sample``,
``consent``, and ``reference_text``, this server's own) stores one in the `VoiceStore`;
``DELETE`` (the SDK's ``audio.voices.delete``) removes one. The store's file work runs
in a worker thread; uploads run one at a time, so two of one name cannot both land.

An uploaded voice is then a voice name wherever a voice is taken: a PersonaPlex
session's ``session.prompt.voice`` and ``/api/chat?voice_prompt=`` (the engine reads the
same folder), and the TTS, which answers ``voice_not_supported`` when it cannot
condition on a sample (`SpeechService.check_voice`) instead of speaking another voice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final, final

import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from duplex.exceptions import ProtocolError, UnsupportedParameter
from duplex.metrics import Counter, MetricsRegistry
from duplex.models.tts import OPENAI_VOICES
from duplex.refusals import Refusal, echo
from duplex.transport import refusal_response
from duplex.wire import dumps

from .._forms import read_upload_form
from ..speech import LOADING, SpeechService
from ._store import VoiceStore

__all__ = ["FORM_OVERHEAD_BYTES", "VoiceService", "voice_routes"]

FORM_OVERHEAD_BYTES: Final = 64 * 1024
"""What an upload's body may hold beyond its sample: the text fields and the part headers."""
_FIELDS: Final = frozenset({"name", "audio_sample", "consent", "reference_text", "type"})


@final
class UnknownParameter(ProtocolError):
    code = "unknown_parameter"


@final
class MissingParameter(ProtocolError):
    code = "missing_required_parameter"


def _json(content: Any, status: int = 200) -> Response:
    return Response(dumps(content), status_code=status, media_type="application/json")


@final
class VoiceService:
    """The uploaded voices and the TTS's built-in ones, as the voice routes see them.

    Args:
        store: the folder of uploaded voices.
        speech: the TTS service (``None``: no TTS here, so no built-in voices).
        registry: where the routes' outcomes are counted.
        wall_clock: Unix time, for ``created_at``.
    """

    def __init__(
        self,
        store: VoiceStore,
        speech: SpeechService | None = None,
        *,
        registry: MetricsRegistry | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.speech = speech
        self.wall_clock = wall_clock
        self._writes = trio.Lock()
        self._outcomes: Counter | None = None
        if registry is not None:
            self._outcomes = registry.counter(
                "duplex_voice_requests_total",
                "Voice route requests, by endpoint and outcome",
                ["endpoint", "outcome"],
            )

    def count(self, endpoint: str, outcome: str) -> None:
        if self._outcomes is not None:
            self._outcomes.inc(endpoint=endpoint, outcome=outcome)

    def _builtin(self) -> dict[str, Any] | Refusal:
        """The TTS's voice listing (empty without a TTS; `LOADING` while it starts)."""
        speech = self.speech
        if speech is None or not speech.configured:
            return {"voices": [], "data": [], "sample_rate": None, "variants": []}
        if speech.engine is None:
            return LOADING
        return speech.voices_body()

    async def list(self) -> Response:
        builtin = self._builtin()
        if isinstance(builtin, Refusal):
            self.count("list", "loading")
            return refusal_response(builtin)
        uploaded = await trio.to_thread.run_sync(self.store.list)
        data = [{**entry, "uploaded": False} for entry in builtin["data"]]
        data += [voice.as_dict() for voice in uploaded]
        self.count("list", "ok")
        return _json(
            {
                "object": "list",
                "voices": [*builtin["voices"], *(voice.name for voice in uploaded)],
                "data": data,
                "sample_rate": builtin["sample_rate"],
                "variants": builtin.get("variants", []),
            }
        )

    def _reserved(self) -> set[str]:
        names = set(OPENAI_VOICES)
        builtin = self._builtin()
        if not isinstance(builtin, Refusal):
            names.update(builtin["voices"])
        return names

    async def create(self, request: Request) -> Response:
        limits = self.store.limits
        try:
            form = await read_upload_form(
                request,
                max_bytes=limits.max_bytes + FORM_OVERHEAD_BYTES,
                files=frozenset({"audio_sample"}),
                max_fields=len(_FIELDS),
            )
            unknown = sorted(set(form.fields) - _FIELDS)
            if unknown:
                raise UnknownParameter(
                    f"Unrecognized form field {echo(unknown[0])}.", param=unknown[0][:100]
                )
            if form.fields.get("type", "audio_sample") != "audio_sample":
                raise UnsupportedParameter(
                    "Only type 'audio_sample' is supported: a voice is made from a recording.",
                    param="type",
                )
            name = form.text("name")
            if name is None:
                raise MissingParameter("The form needs a 'name'.", param="name")
            sample = form.files.get("audio_sample")
            if sample is None:
                message = "The form needs an 'audio_sample' file."
                raise MissingParameter(message, param="audio_sample")
            reference = form.text("reference_text") or None
            async with self._writes:
                voice = await trio.to_thread.run_sync(
                    self.store.add,
                    name,
                    sample,
                    reference,
                    int(self.wall_clock()),
                    self._reserved(),
                )
        except ProtocolError as exc:
            self.count("create", "refused")
            return refusal_response(Refusal.of(exc))
        self.count("create", "ok")
        return _json(voice.as_dict())

    async def delete(self, name: str) -> Response:
        try:
            async with self._writes:
                await trio.to_thread.run_sync(self.store.delete, name)
        except ProtocolError as exc:
            self.count("delete", "refused")
            return refusal_response(Refusal.of(exc))
        self.count("delete", "ok")
        return _json({"id": name, "object": "audio.voice.deleted", "deleted": True})


def voice_routes(voices: VoiceService | None) -> list[BaseRoute]:
    """The voice routes; with no service (``None``: a worker that relays them, or a server
    with no voice folder) each answers ``voices_not_served``."""
    missing = Refusal(404, "This server keeps no voices.", "voices_not_served")

    async def listed(request: Request) -> Response:
        return refusal_response(missing) if voices is None else await voices.list()

    async def create(request: Request) -> Response:
        return refusal_response(missing) if voices is None else await voices.create(request)

    async def delete(request: Request) -> Response:
        if voices is None:
            return refusal_response(missing)
        return await voices.delete(request.path_params["name"])

    return [
        Route("/v1/audio/voices", listed, methods=["GET"]),
        Route("/v1/audio/voices", create, methods=["POST"]),
        Route("/v1/audio/voices/{name}", delete, methods=["DELETE"]),
    ]
