"""The configuration in sections: one declaration per key, from which flags, environment
names, TOML keys and the old flat names are derived; every old spelling still loads."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.cli import _parser
from duplex.config import (
    ALIASES,
    DECLARED,
    SECTIONS,
    Config,
    Declared,
    doc_table,
    flag_overrides,
    load_config,
    setting,
)
from duplex.config._declare import declared
from duplex.exceptions import ConfigError

FLAT_DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1", "port": 8000, "model": "loopback", "model_device": "cpu",
    "model_seed": 0, "random_weights": False, "kv_cache_dtype": "auto", "weight_dtype": "auto",
    "codec_dtype": "float32",
    "loopback_delay_ms": 240,
    "model_cache_dir": "", "max_sessions": 0, "chat_wait_queue": 0, "max_frame_bytes": 16777216,
    "realtime_vad": "silero", "agent": True, "agent_llm": "", "agent_asr": "pocketsphinx",
    "agent_asr_grammar": "", "agent_asr_workers": 2, "vad_streams": 256,
    "first_event_timeout_s": 30.0, "connection_workers": "auto",
    "engine_process": "auto", "session_shards": "auto", "node_name": "", "chat_max_choices": 64,
    "engine_stall_timeout_s": 5.0, "log_format": "console",
    "log_level": "info", "shutdown_grace_s": 5.0, "malloc_trim_interval_s": 60.0, "api_keys": (),
    "api_key_file": "", "allow_unauthenticated": False, "allowed_origins": (),
    "allowed_hosts": (), "tls_certfile": "", "tls_keyfile": "", "client_secret_ttl_s": 600,
    "auth_failure_burst": 10, "auth_failure_window_s": 60.0, "policy": "reference",
    "policy_max_batch": 64, "policy_batch_wait_ms": 2.0, "policy_action_horizon": 10,
    "policy_action_dim": 8, "policy_idle_timeout_s": 30.0, "image_model": "", "video_model": "",
    "media_max_queue": 16, "image_max_batch": 1, "batch_beside_realtime": True,
    "video_chunk_frames": 16, "video_max_jobs": 64, "video_max_active_jobs": 8,
    "video_job_retention_s": 3600.0, "video_start_timeout_s": 10.0,
    "video_stall_timeout_s": 60.0, "tts": "espeak", "tts_max_batch": 8,
    "tts_batch_wait_ms": 2.0, "tts_max_queue": 64, "max_connections_per_peer": 0,
    # keys added since (issues 32, 33): their flat name is their key
    "audio_model": "", "audio_max_length_s": 30.0, "voice_dir": "", "voice_max_bytes": 10485760,
    "voice_max_count": 100, "voice_max_duration_s": 30.0,
    # issue 35's budgets, first added as flat keys
    "media_memory_budget_mb": 0, "media_max_request_s": 300.0, "speech_max_audio_s": 600.0,
    "http_body_timeout_s": 30.0, "max_connections": 0,
}  # fmt: skip
"""The flat ``[server]`` table before sections (tree ``0a62554``): every name and default
(since then ``connection_workers`` and ``session_shards`` default to ``auto``, and
``node_name`` names a cluster node: issue 29)."""


def value_of(config: Config, row: Declared) -> Any:
    return dataclasses.asdict(config)[row.section][row.key]


def test_every_flat_name_is_a_key_with_its_old_default_and_type() -> None:
    assert set(ALIASES) == set(FLAT_DEFAULTS)
    config = load_config(env={})
    for flat, default in FLAT_DEFAULTS.items():
        row = ALIASES[flat]
        assert row.default == default and type(row.default) is type(default), flat
        assert value_of(config, row) == default, flat


def changed(row: Declared) -> tuple[Any, str]:
    """A valid value other than the default, and how the environment spells it."""
    if row.kind == "bool":
        return (not row.default), str(not row.default).lower()
    if row.kind == "choice":
        value = next(choice for choice in row.choices if choice != row.default)
        return value, value
    if row.kind == "list":
        value = ("*",) if "key" not in row.key else ("k" * 20,)
        return value, ",".join(value)
    if row.kind in ("int", "float"):
        value = {"port": 9001, "session_shards": 1, "client_secret_ttl_s": 900}.get(
            row.key, row.default + 1
        )
        return value, str(value)
    return None, ""  # strings: paths and names, checked against the disk


SETTABLE = [
    row for row in DECLARED
    if changed(row)[0] is not None
    and row.key not in ("model_device", "engine_process", "enabled", "max_frame_bytes")
]  # fmt: skip
"""Keys with a value ``changed`` can make valid alone (a device or an engine layout needs
its companions; the agent off needs nothing but is covered by ``--no-agent``)."""


@pytest.mark.parametrize("row", SETTABLE, ids=lambda row: row.name)
def test_each_spelling_of_a_key_sets_it(row: Declared, tmp_path: Path) -> None:
    value, text = changed(row)
    toml_value = str(list(value)) if row.kind == "list" else repr(value)
    if row.kind == "bool":
        toml_value = text
    if row.kind == "choice":
        toml_value = f'"{value}"'
    spellings: list[dict[str, Any]] = [
        {"env": {row.env: text}},
        {"env": {row.flat_env: text}},
        {"env": {f"DUPLEX_SERVER__{row.flat.upper()}": text}},
        {"overrides": {row.name: value}},
        {"overrides": {f"server.{row.flat}": value}},
    ]
    for index, (table, key) in enumerate(((row.section, row.key), ("server", row.flat))):
        path = tmp_path / f"{index}.toml"
        path.write_text(f"[{table}]\n{key} = {toml_value}\n")
        spellings.append({"path": path})
    for spelling in spellings:
        kwargs = {"env": {}, **spelling}
        assert value_of(load_config(**kwargs), row) == value, spelling


def test_a_key_given_by_both_names_in_one_layer_is_refused(tmp_path: Path) -> None:
    env = {"DUPLEX_TTS_MAX_QUEUE": "10", "DUPLEX_SPEECH__MAX_QUEUE": "20"}
    with pytest.raises(ConfigError, match=r"given twice.*both name speech\.max_queue"):
        load_config(env=env)
    toml = tmp_path / "d.toml"
    toml.write_text('[server]\nimage_model = "tiny"\n[media]\nimage_model = "x"\n')
    with pytest.raises(ConfigError, match=r"media\.image_model: given twice"):
        load_config(toml, env={})
    overrides = {"server.policy_max_batch": 3, "policy.max_batch": 4}
    with pytest.raises(ConfigError, match="given twice"):
        load_config(env={}, overrides=overrides)
    # across layers the later one wins, whichever name each used
    toml.write_text("[server]\ntts_max_queue = 10\n")
    config = load_config(toml, env={"DUPLEX_SPEECH__MAX_QUEUE": "20"})
    assert config.speech.max_queue == 20
    flags = load_config(
        toml, env={"DUPLEX_SPEECH__MAX_QUEUE": "20"}, overrides={"server.tts_max_queue": 30}
    )
    assert flags.speech.max_queue == 30
    # one spelling twice in the environment (DUPLEX_PORT, DUPLEX_SERVER__PORT) loads, as ever
    assert load_config(env={"DUPLEX_PORT": "9", "DUPLEX_SERVER__PORT": "9"}).server.port == 9


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DUPLEX_TTS_MAX_QUEUE": "0"}, r"^server\.tts_max_queue: must be 1\.\.65536, got 0 "
         r"\(server\.tts_max_queue is speech\.max_queue\)"),
        ({"DUPLEX_SPEECH__MAX_QUEUE": "0"}, r"^speech\.max_queue: must be 1\.\.65536, got 0 \("),
        ({"DUPLEX_MEDIA__MAX_QUEUE": "0"}, r"^media\.max_queue: must be 1\.\.10000"),
        ({"DUPLEX_POLICY__MODEL": "x"}, r"^policy\.model: must be reference, none or"),
        ({"DUPLEX_POLICY": "x"}, r"^server\.policy: must be reference, none or"),
        ({"DUPLEX_ENGINE__STALL_TIMEOUT_S": "0.5"}, r"^engine\.stall_timeout_s: must be 0"),
        ({"DUPLEX_ACCESS__AUTH_FAILURE_BURST": "0"}, r"^access\.auth_failure_burst: must be"),
        ({"DUPLEX_MEDIA__VIDEO_MAX_JOBS": "4"}, r"^media\.video_max_active_jobs: must be 1\.\.4"),
        ({"DUPLEX_AGENT__ENABLED": "yes", "DUPLEX_SPEECH__TTS": "none"},
         r"^agent\.enabled: the voice agent speaks through the TTS.*'speech\.tts': 'env "),
        ({"DUPLEX_ENGINE__MODEL_DEVICE": "cuda:0,cuda:1", "DUPLEX_SERVER__ENGINE_PROCESS": "off"},
         r"^server\.engine_process: off, but model_device names 2 devices"),
        ({"DUPLEX_ENGINE__MODEL_DEVICE": "cuda:0,cuda:0"},
         r"^engine\.model_device: a GPU is named"),
        ({"DUPLEX_AGENT__NOPE": "1"}, r"^unknown key agent\.nope \(env DUPLEX_AGENT__NOPE\); "
         r"known keys: asr, asr_grammar, asr_workers, chat_max_choices, enabled, llm$"),
        ({"DUPLEX_AGENT__AGENT_ASR": "x"}, r"^unknown key agent\.agent_asr"),
    ],
)  # fmt: skip
def test_a_bad_value_names_the_key_as_it_was_written(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(env=env)


def test_each_limit_refuses_past_its_bound_and_loads_at_it() -> None:
    bounds = {
        "speech.max_queue": (1, 65536), "speech.max_batch": (1, 256),
        "speech.batch_wait_ms": (0, 1000), "media.max_queue": (1, 10_000),
        "media.image_max_batch": (1, 64), "media.video_chunk_frames": (1, 1024),
        "policy.max_batch": (1, 4096), "policy.batch_wait_ms": (0, 1000),
        "policy.action_horizon": (1, 4096), "policy.action_dim": (1, 4096),
        "agent.asr_workers": (1, 64), "server.connection_workers": (0, 64),
        "access.client_secret_ttl_s": (10, 7200), "engine.chat_wait_queue": (0, 10_000),
        "server.malloc_trim_interval_s": (0, 86_400),
    }  # fmt: skip
    for name, (low, high) in bounds.items():
        for good in (low, high):
            load_config(env={}, overrides={name: good})
        for bad in (low - 1, high + 1):
            with pytest.raises(ConfigError, match=f"^{name}: must be"):
                load_config(env={}, overrides={name: bad})


def test_every_declared_flag_is_a_serve_flag_that_sets_its_key() -> None:
    serve = _parser().parse_args(["serve"]).command_parser
    flags = {flag for action in serve._actions for flag in action.option_strings}
    declared_flags = {row.setting.flag for row in DECLARED if row.setting.flag}
    assert flags - {"-h", "--help", "--config"} == declared_flags | {"--no-agent"}
    argv = ["serve", "--tts-max-queue", "7", "--no-agent", "--api-key", "a", "--api-key", "b"]
    argv += ["--random-weights", "--kv-cache-dtype", "fp8", "--policy-batch-wait-ms", "1.5"]
    args = _parser().parse_args(argv)
    assert flag_overrides(args, DECLARED) == {
        "speech.max_queue": 7, "agent.enabled": False, "access.api_keys": ["a", "b"],
        "engine.random_weights": True, "engine.kv_cache_dtype": "fp8",
        "policy.batch_wait_ms": 1.5,
    }  # fmt: skip
    assert flag_overrides(_parser().parse_args(["serve"]), DECLARED) == {}


def test_serve_help_shows_the_declared_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "duplex.cli", "serve", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "--no-agent" in out and "--tts-max-queue N" in out and "(default 64)" in out
    assert "--host HOST" in out and "--engine-process MODE" in out  # no SECTION.KEY metavars
    groups = [line for line in out.splitlines() if line.startswith("[")]
    assert groups == [f"[{name}]:" for name in SECTIONS if name != "session"]
    assert "`" not in out and "](#" not in out  # Markdown dropped


def test_a_field_without_a_declaration_or_with_a_taken_flat_name_fails_at_import() -> None:
    from dataclasses import dataclass, field

    @dataclass(frozen=True)
    class Bare:
        x: int = field(default=0)

    @dataclass(frozen=True)
    class Taken:
        y: int = setting(0, "y", alias="port")

    with pytest.raises(TypeError, match="declared without setting"):
        declared([("bare", Bare)])
    with pytest.raises(TypeError, match=r"share the flat name\(s\) \['port'\]"):
        declared([("server", SECTIONS["server"]), ("taken", Taken)])


def test_the_doc_table_has_a_row_per_key_and_regenerates(tmp_path: Path) -> None:
    table = doc_table(DECLARED)
    assert len(table.splitlines()) == 2 + len(DECLARED)
    assert "| `[speech]` | `max_queue` (`tts_max_queue`) | int | `64` |" in table
    out = subprocess.run(
        [sys.executable, "-m", "duplex.config", "--doc-table"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out == table
    doc = tmp_path / "ops.md"
    from duplex.config import DOC_BEGIN, DOC_END

    doc.write_text(f"before\n{DOC_BEGIN}\nstale\n{DOC_END}\nafter\n")
    subprocess.run([sys.executable, "-m", "duplex.config", "--write-doc", str(doc)], check=True)
    assert doc.read_text() == f"before\n{DOC_BEGIN}\n\n{table}\n{DOC_END}\nafter\n"


SPELL = st.sampled_from(["canonical_env", "flat_env", "override", "flat_override"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(DECLARED), SPELL), max_size=12))
def test_any_spelling_of_the_defaults_loads_the_default_config(
    picks: list[tuple[Declared, str]],
) -> None:
    """Defaults written back through any of the names, by the last layer that names a key
    (one spelling per key per layer), load the default config."""
    env: dict[str, str] = {}
    overrides: dict[str, Any] = {}
    seen: set[tuple[str, str]] = set()
    for row, spelling in picks:
        layer = "env" if spelling.endswith("env") else "flags"
        if (row.name, layer) in seen:
            continue
        seen.add((row.name, layer))
        default = row.default
        text = (
            ",".join(default)
            if row.kind == "list"
            else str(default).lower()
            if row.kind == "bool"
            else str(default)
        )
        if spelling == "canonical_env":
            env[row.env] = text
        elif spelling == "flat_env":
            env[row.flat_env] = text
        elif spelling == "override":
            overrides[row.name] = default
        else:
            overrides[f"server.{row.flat}"] = default
    assert load_config(env=env, overrides=overrides) == load_config(env={})


def test_worker_settings_carry_the_server_section_through_json() -> None:
    from duplex.topology._workers import WorkerSettings
    from duplex.transport import AccessSettings

    server = load_config(env={}, overrides={"server.first_event_timeout_s": 7}).server
    settings_ = WorkerSettings(
        server, fingerprint="f", agent=True, shard_paths=("/a",),
        access=AccessSettings(key_digests=("d",), allowed_hosts=("h",)),
    )  # fmt: skip
    assert WorkerSettings.from_json(settings_.to_json()) == settings_


def test_duplex_talk_does_not_import_the_config() -> None:
    """``duplex serve``'s flags come from the declarations, which import the session core;
    ``duplex talk`` and ``--version`` build their parser without them."""
    code = (
        "import sys\nfrom duplex.cli import main\n"
        "try:\n    main(['talk', '--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'duplex.config' not in sys.modules and 'duplex.sessions' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
