"""Configuration layers (defaults < TOML < env < flags), validation messages, the CLI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from duplex.cli import main
from duplex.config import load_config
from duplex.exceptions import ConfigError

KEY = "k" * 24


def test_defaults() -> None:
    config = load_config(env={})
    assert (config.server.host, config.server.port, config.engine.model) == (
        "127.0.0.1",
        8000,
        "loopback",
    )
    assert config.session.idle_ttl_s == 300 and config.session.disconnect_grace_s == 30


def test_layers_override_in_order(tmp_path: Path) -> None:
    toml = tmp_path / "duplex.toml"
    toml.write_text('[server]\nport = 9000\nhost = "0.0.0.0"\n[session]\nidle_ttl_s = 60\n')
    env = {"DUPLEX_PORT": "9100", "DUPLEX_SESSION__BARGE_IN_MS": "900", "HOME": "/x"}
    env["DUPLEX_API_KEYS"] = KEY  # 0.0.0.0 needs a key
    config = load_config(toml, env=env, overrides={"server.port": 9200})
    assert config.server.port == 9200  # flag beats env beats file
    assert config.server.host == "0.0.0.0"  # file beats default
    assert config.session.idle_ttl_s == 60
    assert config.session.barge_in_ms == 900  # env string parsed as int


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DUPLEX_PORT": "eighty"}, "server.port: must be a number"),
        ({"DUPLEX_PORT": "70000"}, "server.port: must be 0..65535"),
        ({"DUPLEX_LOG_FORMAT": "xml"}, "server.log_format: must be one of"),
        ({"DUPLEX_KV_CACHE_DTYPE": "int3"}, "server.kv_cache_dtype: must be one of"),
        ({"DUPLEX_CONNECTION_WORKERS": "-1"}, "connection_workers: must be 0..64 or auto, got -1"),
        ({"DUPLEX_CONNECTION_WORKERS": "65"}, "connection_workers: must be 0..64 or auto, got 65"),
        ({"DUPLEX_CONNECTION_WORKERS": "many"}, "connection_workers: must be a whole number or"),
        ({"DUPLEX_SESSION_SHARDS": "1.5"}, "session_shards: must be a whole number or auto"),
        ({"DUPLEX_NO_SUCH": "1"}, "unknown key server.no_such"),
        ({"DUPLEX_SESSION__OVERLAP_POLICY": "sometimes"}, "overlap_policy"),
        ({"DUPLEX_SESSION__BARGE_IN_MS": "500"}, "barge_in_ms"),
        ({"DUPLEX_NOPE__X": "1"}, "unknown section [nope]"),
        ({"DUPLEX_AGENT_ASR_WORKERS": "0"}, "agent_asr_workers: must be 1..64, got 0"),
        ({"DUPLEX_AGENT_ASR_WORKERS": "65"}, "agent_asr_workers: must be 1..64, got 65"),
    ],
)
def test_bad_values_name_the_key(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config(env=env)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"server.session_shards": 0}, "session_shards: must be 1..64 or auto, got 0"),
        (
            {"server.session_shards": 65, "server.connection_workers": 1},
            "must be 1..64 or auto, got 65",
        ),
        (
            {"server.session_shards": 2, "server.connection_workers": 0},
            "session_shards: 2 shards need connection_workers >= 1",
        ),
        (
            {"server.session_shards": 2, "server.connection_workers": 1,
             "server.model_device": "cuda", "server.engine_process": "off"},
            "session_shards: each shard runs its own engine, and model_device 'cuda'",
        ),
        (
            {"server.session_shards": 2, "server.connection_workers": 1,
             "server.model_device": "cuda:1", "server.engine_process": "off"},
            "model_device 'cuda:1' needs one engine",
        ),
        (
            {"server.session_shards": 3, "server.connection_workers": 2,
             "server.max_sessions": 2},
            "session_shards: max_sessions 2 is split over 3 shards",
        ),
    ],
)  # fmt: skip
def test_bad_session_shards_name_the_key(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(env={}, overrides=overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        {"server.session_shards": 1},  # one shard: no workers needed
        {"server.session_shards": 1, "server.model_device": "cuda"},
        {"server.session_shards": 2, "server.connection_workers": 1},
        {"server.session_shards": 3, "server.connection_workers": 2, "server.max_sessions": 3},
        {"server.session_shards": 2, "server.connection_workers": 1, "server.max_sessions": 0},
        {"server.session_shards": 64, "server.connection_workers": 64},
    ],
)
def test_valid_session_shards_load(overrides: dict[str, object]) -> None:
    config = load_config(env={}, overrides=overrides)
    assert config.server.session_shards == overrides["server.session_shards"]


def test_agent_asr_workers_load_at_their_bounds() -> None:
    assert load_config(env={}).agent.asr_workers == 2
    for workers in ("1", "64"):
        config = load_config(env={"DUPLEX_AGENT_ASR_WORKERS": workers})
        assert config.agent.asr_workers == int(workers)


def test_session_shards_from_env_and_the_cli_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_config(env={}).server.session_shards == "auto"
    env = {"DUPLEX_SERVER__SESSION_SHARDS": "3", "DUPLEX_SERVER__CONNECTION_WORKERS": "2"}
    assert load_config(env=env).server.session_shards == 3
    env = {"DUPLEX_SERVER__SESSION_SHARDS": " auto", "DUPLEX_SERVER__CONNECTION_WORKERS": "auto"}
    server = load_config(env=env).server
    assert (server.session_shards, server.connection_workers) == ("auto", "auto")
    args = ["serve", "--session-shards", "2", "--connection-workers", "0", "--port", "0"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "session_shards: 2 shards need connection_workers >= 1" in err


def test_bad_toml_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\nport=1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})


def test_cli_reports_config_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "99999"]) == 2
    assert "server.port" in capsys.readouterr().err


def test_cli_help_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "duplex.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--config" in out.stdout and "--model" in out.stdout


def test_cli_rejects_an_unknown_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", "no-such-model", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "loopback" in err


def test_cli_rejects_a_model_rate_mismatch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUPLEX_SESSION__MODEL_SAMPLE_RATE", "16000")
    monkeypatch.setenv("DUPLEX_SESSION__OUTPUT_SAMPLE_RATE", "16000")
    assert main(["serve", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "model_sample_rate" in err and "24000" in err


def test_cli_port_in_use_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot serve on 127.0.0.1:{port}" in err and "Traceback" not in err
    # no "starting"/"started" line first: the server logs that only once it is bound
    assert not re.search(r"\]\s+(started|listening)\s", err), err
    (line,) = [line for line in err.splitlines() if "127.0.0.1" in line]
    assert line.startswith("duplex: cannot serve on")


def test_cli_unknown_flag_prints_the_serve_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: duplex serve [-h]")  # not the top level's "duplex COMMAND"
    assert "unrecognized arguments: --bogus" in err


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="the check is for a machine without CUDA"
)
@pytest.mark.parametrize("model", ["loopback", "tiny"])
def test_cli_refuses_cuda_without_a_cuda_device(
    model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--model", model, "--model-device", "cuda", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "configuration error: engine.model_device: 'cuda'" in err
    assert "no CUDA device" in err and "Traceback" not in err


# -- exposure: keys, origins, hosts, TLS --------------------------------------


def test_api_keys_from_env_toml_and_flags(tmp_path: Path) -> None:
    other = "o" * 20
    env = {"DUPLEX_API_KEYS": f" {KEY} , {other},"}
    assert load_config(env=env).access.api_keys == (KEY, other)
    toml = tmp_path / "d.toml"
    toml.write_text(f'[server]\napi_keys = ["{KEY}"]\nallowed_origins = ["https://a.example"]\n')
    access = load_config(toml, env={}).access
    assert access.api_keys == (KEY,) and access.allowed_origins == ("https://a.example",)
    flags = load_config(env=env, overrides={"server.api_keys": [other]}).access
    assert flags.api_keys == (other,)  # the flag replaces the env list
    assert KEY not in repr(access)  # never printed with the config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"server.host": "0.0.0.0"}, "host: '0.0.0.0' is not a loopback address"),
        ({"server.host": "192.168.1.5"}, "allow_unauthenticated"),
        ({"server.api_keys": ["short"]}, "api_keys: each key must be at least 16"),
        ({"server.api_keys": [KEY, 5]}, "api_keys: must be a list of strings"),
        ({"server.tls_certfile": "c.pem"}, "tls_certfile and tls_keyfile must be set together"),
        ({"server.client_secret_ttl_s": 5}, "client_secret_ttl_s: must be 10..7200, got 5"),
        ({"server.auth_failure_burst": 0}, "auth_failure_burst: must be >= 1"),
        ({"server.auth_failure_window_s": 0}, "auth_failure_window_s: must be > 0"),
        ({"server.allowed_origins": ["app.example"]}, "allowed_origins: 'app.example' is not"),
        ({"server.allowed_origins": ["https://a/x"]}, "allowed_origins: 'https://a/x' is not"),
        ({"server.allowed_hosts": ["https://a"]}, "allowed_hosts: 'https://a' is not"),
        ({"server.allowed_hosts": ["a b"]}, "allowed_hosts: 'a b' is not"),
    ],
)
def test_bad_exposure_values_name_the_key(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(env={}, overrides=overrides)
    assert "short" not in str(caught.value)  # a key is never echoed


@pytest.mark.parametrize(
    "overrides",
    [
        {"server.host": "0.0.0.0", "server.api_keys": [KEY]},
        {"server.host": "0.0.0.0", "server.allow_unauthenticated": True},
        {"server.host": "::", "server.api_key_file": "/keys"},
        {"server.host": "::1"},
        {"server.host": "localhost"},
        {"server.host": "127.0.0.2"},
        {"server.allowed_origins": ["*", "http://localhost:3000", "https://app.example/"]},
        {"server.allowed_hosts": ["*", "api.example", "api.example:8443", "[::1]:9"]},
    ],
)
def test_exposure_values_that_load(overrides: dict[str, object]) -> None:
    load_config(env={}, overrides=overrides)


def test_api_key_file(tmp_path: Path) -> None:
    from duplex.config import api_keys_of

    keys = tmp_path / "keys"
    keys.write_text(f"# ops\n{KEY}\n\n  {'z' * 16}  \n{KEY}\n")
    access = load_config(env={}, overrides={"server.api_key_file": str(keys)}).access
    assert api_keys_of(access) == (KEY, "z" * 16)
    keys.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="holds no key"):
        api_keys_of(access)
    keys.write_text("tiny\n")
    with pytest.raises(ConfigError, match="at least 16") as caught:
        api_keys_of(access)
    assert "tiny" not in str(caught.value)
    missing = load_config(env={}, overrides={"server.api_key_file": str(tmp_path / "no")})
    with pytest.raises(ConfigError, match="api_key_file: cannot read"):
        api_keys_of(missing.access)


def test_cli_refuses_an_open_public_bind_then_serves_it_on_purpose(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--host", "0.0.0.0", "--port", "0", "--model", "nope"]) == 2
    err = capsys.readouterr().err
    assert "not a loopback address and no API key is set" in err
    # the opt-out passes the check (then the unknown model stops it: nothing binds)
    argv = ["serve", "--host", "0.0.0.0", "--allow-unauthenticated", "--model", "nope"]
    assert main(argv) == 2
    assert "unknown model" in capsys.readouterr().err
    argv = ["serve", "--host", "0.0.0.0", "--api-key-file", "/no/such/file"]
    assert main(argv) == 2
    assert "api_key_file: cannot read" in capsys.readouterr().err


def test_random_weights_from_toml_env_and_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_config(env={}).engine.random_weights is False
    assert load_config(env={"DUPLEX_RANDOM_WEIGHTS": "1"}).engine.random_weights is True
    toml = tmp_path / "duplex.toml"
    toml.write_text("[server]\nrandom_weights = true\n")
    assert load_config(toml, env={}).engine.random_weights is True
    # the flag reaches the model resolver: loopback has no weights, so it is refused
    assert main(["serve", "--random-weights", "--port", "0"]) == 2
    assert "'loopback' has no weights" in capsys.readouterr().err
    # without the flag, missing 7B weights say how to serve the architecture anyway
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["serve", "--model", "moshi-7b", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "never downloaded" in err and "--random-weights" in err
