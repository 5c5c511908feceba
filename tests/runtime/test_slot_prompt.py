"""The session's prompt and sampling, as the engine gets them (`slot_prompt`)."""

from __future__ import annotations

import dataclasses

from duplex.models import SamplingRequest, SlotPrompt
from duplex.runtime._actor import slot_prompt
from duplex.sessions import SessionConfig, SessionPrompt, SessionSampling


def test_the_sessions_sampling_and_the_engines_request_have_the_same_fields() -> None:
    names = [f.name for f in dataclasses.fields(SessionSampling)]
    assert names == [f.name for f in dataclasses.fields(SamplingRequest)]


def test_the_slot_prompt_carries_the_prompt_and_the_sampling_the_session_owns() -> None:
    assert slot_prompt(SessionConfig()) is None
    prompted = SessionConfig(prompt=SessionPrompt("Be brief.", "NATF0.pt"))
    assert slot_prompt(prompted) == SlotPrompt("Be brief.", "NATF0.pt")
    sampling = SessionSampling(text_temperature=0.4, audio_top_k=9, text_seed=-1)
    want = SamplingRequest(text_temperature=0.4, audio_top_k=9, text_seed=-1)
    assert slot_prompt(SessionConfig(sampling=sampling)) == SlotPrompt(sampling=want)
    both = dataclasses.replace(prompted, sampling=sampling)
    assert slot_prompt(both) == SlotPrompt("Be brief.", "NATF0.pt", want)
