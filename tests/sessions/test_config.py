import json

import pytest

from duplex.exceptions import BadEvent, ConfigError
from duplex.sessions import (
    Capabilities,
    OverlapPolicy,
    PlaybackCommitPolicy,
    SessionConfig,
    SessionOptions,
    SessionPrompt,
    SessionSampling,
    TurnDetection,
    TurnPolicy,
    VadMode,
)


def test_defaults_follow_the_issue():
    c = SessionConfig()
    assert c.short_ack_ms == 700
    assert 500 <= c.barge_in_ms <= 1200
    assert c.false_interruption_timeout_s == 2.0
    assert c.max_pending_input_bytes == 16 * 1024 * 1024
    assert c.max_pending_turns == 4
    assert (c.journal_ttl_s, c.journal_max_bytes) == (60.0, 8 * 1024 * 1024)
    assert (c.idle_ttl_s, c.disconnect_grace_s) == (300.0, 30.0)
    assert c.model_sample_rate == 24_000


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"overlap_policy": "loud"}, "overlap_policy"),
        ({"playback_commit_policy": "never"}, "playback_commit_policy"),
        ({"barge_in_ms": 600}, "barge_in_ms"),  # not above short_ack_ms
        ({"idle_ttl_s": 0}, "idle_ttl_s"),
        ({"journal_max_bytes": -1}, "journal_max_bytes"),
        ({"input_sample_rate": 44_100}, "input_sample_rate"),
        ({"output_sample_rate": 16_000}, "output_sample_rate"),
        ({"false_interruption_timeout_s": float("inf")}, "false_interruption_timeout_s"),
        ({"max_pending_turns": True}, "max_pending_turns"),
    ],
)
def test_bad_values_name_the_key(changes, key):
    with pytest.raises(ConfigError, match=key):
        SessionConfig(**changes)


def test_updated_applies_only_set_options_and_revalidates():
    c = SessionConfig().updated(SessionOptions(overlap_policy="model", short_ack_ms=500))
    assert (c.overlap_policy, c.short_ack_ms, c.barge_in_ms) == ("model", 500, 1000)
    with pytest.raises(ConfigError):
        SessionConfig().updated(SessionOptions(short_ack_ms=5000))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"overlap_policy": "x"},
        {"barge_in_ms": 0},
        {"barge_in_ms": True},
        {"false_interruption_timeout_s": float("nan")},
        {"false_interruption_enabled": 1},
        {"input_sample_rate": 11025},
    ],
)
def test_options_refuse_bad_values_with_param(kwargs):
    with pytest.raises(BadEvent) as info:
        SessionOptions(**kwargs)
    assert info.value.param == f"session.{next(iter(kwargs))}"


def test_capabilities_as_dict_is_json_ready():
    d = Capabilities(supports_video_input=True).as_dict()
    for key in (
        "supports_barge_in",
        "supports_playback_ack",
        "supports_multi_session",
        "supports_session_resume",
        "chunk_period_ms",
        "session_admission_mode",
        "supports_video_input",
        "supports_model_native_turn_policy",
    ):
        assert key in d
    assert d["input_sample_rates"] == [8000, 16000, 24000, 48000]
    assert d["implementation_level"] == "turn_based_duplex"
    assert (
        Capabilities(supports_model_native_turn_policy=True).as_dict()["implementation_level"]
        == "model_native_duplex"
    )


def test_wire_audio_codecs_are_session_options():
    """The formats a client negotiates are session facts, set through ``session.update``."""
    g711 = SessionOptions(
        input_audio_codec="g711_ulaw", input_sample_rate=8000, output_audio_codec="g711_alaw"
    )
    c = SessionConfig().apply_update(g711)
    assert (c.input_audio_codec, c.output_audio_codec) == ("g711_ulaw", "g711_alaw")
    assert (SessionConfig().input_audio_codec, SessionConfig().output_audio_codec) == (
        "pcm16",
        "pcm16",
    )
    with pytest.raises(BadEvent) as info:  # G.711 is 8 kHz
        SessionConfig().apply_update(SessionOptions(input_audio_codec="g711_ulaw"))
    assert info.value.param == "session.input_sample_rate"
    with pytest.raises(BadEvent) as info:
        SessionOptions(output_audio_codec="opus")
    assert info.value.param == "session.output_audio_codec"
    with pytest.raises(BadEvent) as info:  # the VAD is fixed for the whole session
        SessionConfig().apply_update(SessionOptions(vad="silero"))
    assert info.value.param == "session.vad"
    with pytest.raises(BadEvent) as info:
        SessionConfig().apply_update(SessionOptions(barge_in_ms=500))
    assert info.value.param == "session.barge_in_ms"


MODES = {
    "overlap_policy": OverlapPolicy,
    "playback_commit_policy": PlaybackCommitPolicy,
    "vad": VadMode,
    "turn_policy": TurnPolicy,
    "turn_detection": TurnDetection,
}


@pytest.mark.parametrize("key", list(MODES))
def test_modes_are_members_from_the_wire_name_on(key):
    """Parsed once, where the config is built: from a name, from options, from a copy."""
    mode = MODES[key]
    assert type(getattr(SessionConfig(), key)) is mode  # the default too
    for member in mode:
        if key == "turn_policy" and member is TurnPolicy.DUPLEX:
            config = SessionConfig(turn_policy=member.value)
        else:
            config = SessionConfig(**{key: member.value, "turn_policy": "turn_based"})
        assert getattr(config, key) is member
        assert getattr(config.updated(SessionOptions(barge_in_ms=900)), key) is member
    with pytest.raises(ConfigError, match=key):
        SessionConfig(**{key: "nonsense"})


def test_options_give_the_config_members():
    options = SessionOptions(
        overlap_policy="model",
        playback_commit_policy="ack_only",
        turn_policy="turn_based",
        turn_detection="none",
        vad="silero",
    )
    config = SessionConfig().updated(options)
    assert config.overlap_policy is OverlapPolicy.MODEL
    assert config.playback_commit_policy is PlaybackCommitPolicy.ACK_ONLY
    assert config.turn_policy is TurnPolicy.TURN_BASED
    assert config.turn_detection is TurnDetection.NONE and not config.vad_enabled
    assert config.vad is VadMode.SILERO


def test_a_mode_says_its_wire_name_to_a_client():
    """A member equals, formats and serialises as its wire name; a refusal quotes the name,
    never the member's repr."""
    assert json.dumps({"v": VadMode.SILERO}) == '{"v": "silero"}'
    assert f"{OverlapPolicy.MODEL}" == "model" and OverlapPolicy.MODEL == "model"
    with pytest.raises(BadEvent) as info:
        SessionConfig(vad="silero").apply_update(SessionOptions(vad="energy"))
    assert info.value.message == "session.vad is 'silero' for the whole session"


# -- sampling ---------------------------------------------------------------------


def test_sampling_values_in_range_are_kept_and_out_of_range_ones_named():
    sampling = SessionSampling(
        text_temperature=0.0, text_top_k=0, audio_seed=-(2**63), text_seed=2**64 - 1
    )
    assert sampling.given == ("text_temperature", "text_top_k", "text_seed", "audio_seed")
    for key, bad in [
        ("text_temperature", -0.1),
        ("audio_temperature", float("nan")),
        ("audio_temperature", 101.0),
        ("text_top_k", 2.0),  # an integer field
        ("audio_top_k", 1_000_001),
        ("text_seed", 2**64),
        ("audio_seed", -(2**63) - 1),
        ("repetition_penalty", 0.0),
        ("repetition_penalty_context", -1),
        ("pad_mult", float("inf")),
        ("text_top_k", True),
    ]:
        with pytest.raises(BadEvent) as caught:
            SessionSampling(**{key: bad})
        assert caught.value.param == f"session.sampling.{key}"
    with pytest.raises(BadEvent) as caught:
        SessionOptions(sampling={"text_top_k": 5})  # type: ignore[arg-type]
    assert caught.value.param == "session.sampling"


def test_sampling_is_fixed_when_the_session_opens_as_the_prompt_is():
    sampling = SessionSampling(text_temperature=0.5)
    config = SessionConfig().accepting(SessionOptions(sampling=sampling))
    assert config.sampling == sampling
    assert config.apply_update(SessionOptions(sampling=sampling)).sampling == sampling
    assert config.apply_update(SessionOptions(barge_in_ms=1500)).sampling == sampling
    with pytest.raises(BadEvent) as caught:
        config.apply_update(SessionOptions(sampling=SessionSampling(text_temperature=0.6)))
    assert caught.value.param == "session.sampling"
    prompted = config.accepting(SessionOptions(prompt=SessionPrompt("hi")))
    assert (prompted.prompt, prompted.sampling) == (SessionPrompt("hi"), sampling)
