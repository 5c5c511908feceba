"""Where an uploaded voice lives: one ``<name>.wav`` in the voice folder, by a name that
cannot leave it.

The voice service (``duplex.services.voices``) writes the folder; the models that
condition on a voice sample (PersonaPlex's prompts) read it through `uploaded_voice_path`,
so both agree on one rule and no name forms a path outside the folder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

__all__ = ["UPLOADED_VOICE_NAME", "uploaded_voice_path"]

UPLOADED_VOICE_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
"""An uploaded voice's name: no dot and no separator, so it is one file name in one folder."""


def uploaded_voice_path(folder: Path | None, name: str) -> Path | None:
    """The WAV of uploaded voice ``name`` in ``folder`` (``None``: no folder, no such voice,
    or ``name`` is not a voice name, so no path outside ``folder`` is ever formed)."""
    if folder is None or not UPLOADED_VOICE_NAME.fullmatch(name):
        return None
    path = folder / f"{name}.wav"
    return path if path.is_file() else None
