"""The ``model`` a request names: one policy for every OpenAI-style route.

A route accepts the names of the model it serves and, for the endpoint families whose OpenAI
SDK calls name a model of OpenAI's (speech, images, videos), OpenAI's names for that family as
aliases of it, so an app written for OpenAI runs unchanged on the model served here. Chat and
video chat take no alias: an app that chooses a chat model gets the checkpoint it asked for,
or a refusal naming what is served. Any other name is ``404 model_not_found`` (``param:
model``), worded the same on every route. Whether ``model`` may be left out is the family's
(``required``). The table in docs/operations.md ("The `model` of a request") lists it.

Pure: the client's value and the served names in, the accepted name or a `ProtocolError` out;
each route turns the error into its own answer (an HTTP refusal, a socket's error event).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final, final

from duplex.exceptions import ProtocolError
from duplex.refusals import echo

__all__ = [
    "AUDIO",
    "CHAT",
    "IMAGES",
    "SPEECH",
    "VIDEOS",
    "VIDEO_CHAT",
    "InvalidModel",
    "ModelFamily",
    "ModelNotFound",
    "ModelRequired",
    "served_names",
]


class ModelNotFound(ProtocolError):
    """A ``model`` the route does not answer to (404, as OpenAI answers)."""

    code: ClassVar[str] = "model_not_found"
    status_hint: ClassVar[int] = 404


class ModelRequired(ProtocolError):
    """No ``model`` on a route that needs one (chat, as OpenAI's)."""

    code: ClassVar[str] = "missing_required_parameter"


class InvalidModel(ProtocolError):
    """A ``model`` that is not a string."""

    code: ClassVar[str] = "invalid_type"


@final
@dataclass(frozen=True, slots=True)
class ModelFamily:
    """The routes of one endpoint family, as their ``model`` field is read.

    Args:
        aliases: OpenAI's model names for the family, each accepted for the served model.
        required: a request must name its model (else it may leave ``model`` out, or null).
    """

    aliases: tuple[str, ...] = ()
    required: bool = False

    def accepted(self, value: object, served: str | tuple[str, ...]) -> str | None:
        """The name the client sent, accepted (``None``: left out, where that is allowed).

        Args:
            value: the request's ``model`` (``None``: absent or null).
            served: the served model's names, the one clients are shown first.

        Raises:
            ModelRequired, InvalidModel, ModelNotFound: ``param`` is ``model``.
        """
        names = (served,) if isinstance(served, str) else served
        if value is None:
            if self.required:
                raise ModelRequired("'model' is required.", param="model")
            return None
        if not isinstance(value, str):
            raise InvalidModel("'model' must be a string.", param="model")
        if value in names or value in self.aliases:
            return value
        raise ModelNotFound(self.refusal_message(value, names[0]), param="model")

    def refusal_message(self, value: object, shown: str) -> str:
        """The one wording of a refused name: what is served, and the aliases taken for it."""
        aliases = (
            f" (OpenAI's names {', '.join(self.aliases)} are accepted as aliases)"
            if self.aliases
            else ""
        )
        return f"The model {echo(value)} is not served here; this server serves {shown!r}{aliases}."


SPEECH: Final = ModelFamily(("tts-1", "tts-1-hd", "gpt-4o-mini-tts"))
"""``/v1/audio/speech``, ``/batch``, the ``/stream`` socket's ``session.config``; ``model``
may be left out (as it always could here; OpenAI's API requires it)."""
IMAGES: Final = ModelFamily(("dall-e-2", "dall-e-3", "gpt-image-1", "gpt-image-1-mini"))
"""``/v1/images/generations``, ``/v1/images/edits``."""
VIDEOS: Final = ModelFamily(("sora-2", "sora-2-pro"))
"""``/v1/videos``, ``/v1/videos/sync``, the ``/v1/realtime/video`` socket's ``session.start``."""
AUDIO: Final = ModelFamily()
"""``/v1/audio/generate`` (OpenAI has no such endpoint: no alias)."""
CHAT: Final = ModelFamily(required=True)
"""``/v1/chat/completions`` and ``/batch``: the checkpoint asked for, or a refusal."""
VIDEO_CHAT: Final = ModelFamily()
"""The ``/v1/video/chat/stream`` socket's ``session.config`` (``model`` may be left out)."""


def served_names(model: str) -> tuple[str, ...]:
    """The names a checkpoint answers to: its folder's name (shown first, as ``GET
    /v1/models`` lists it), and the path it was loaded from."""
    shown = model.rstrip("/").rsplit("/", 1)[-1]
    return (shown, model) if shown != model else (shown,)
