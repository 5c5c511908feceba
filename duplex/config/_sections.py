"""The sections of the configuration, each a frozen dataclass that checks its own ranges.

Each field declares its help, and its flag where it has one, with `setting`: the
TOML key, environment name, flag, old flat name and the docs table are derived
from it (``_declare.py``). A rule that spans sections (shards and devices, the
agent and the TTS, a public bind and its keys) is checked by `Config`.

To add a key: add a field to its section with ``setting(default, help, ...)``,
check its range in that section's ``__post_init__`` (with `refuse`, which names
the key), and regenerate the docs table (``python -m duplex.config --write-doc``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import dataclass, field
from typing import Literal, NoReturn, final

from duplex.exceptions import ConfigError
from duplex.sessions import SessionConfig

from ._declare import setting

__all__ = [
    "CLIENT_SECRET_MAX_TTL_S",
    "CLIENT_SECRET_MIN_TTL_S",
    "MAX_CHAT_WAIT_QUEUE",
    "MAX_CONNECTION_WORKERS",
    "MAX_POLICY_BATCH",
    "MAX_SESSION_SHARDS",
    "AccessConfig",
    "AgentConfig",
    "Config",
    "EngineConfig",
    "MediaConfig",
    "PolicyConfig",
    "ServerConfig",
    "SpeechConfig",
    "is_loopback",
    "refuse",
]

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
_MIB = 1024 * 1024

CLIENT_SECRET_MIN_TTL_S = 10
CLIENT_SECRET_MAX_TTL_S = 7200
"""Bounds of a client secret's lifetime, as OpenAI's ``expires_after.seconds``."""
MAX_CONNECTION_WORKERS = 64
MAX_SESSION_SHARDS = 64
MAX_POLICY_BATCH = 4096
MAX_CHAT_WAIT_QUEUE = 10_000
"""Sockets a session process may hold waiting: each is a socket and a few tasks."""


def refuse(key: str, rule: str) -> NoReturn:
    """Raise the `ConfigError` of ``key`` (a field of the section, or ``section.key`` from
    `Config`); the loader names the key as the user wrote it and adds the sources."""
    raise ConfigError(f"{key}: {rule}", key=key)


def _within(key: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        refuse(key, f"must be {low}..{high}, got {value}")


def is_loopback(host: str) -> bool:
    """``host`` (a bind address or name) reaches this machine only."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """The processes: where they listen, how many of each, their logs and shutdown."""

    host: str = setting(
        "127.0.0.1",
        "interface to bind; must not be empty. A non-loopback bind needs API keys or "
        "`access.allow_unauthenticated` (see [Security](#security))",
        flag="--host",
    )
    port: int = setting(8000, "port to bind; 0..65535; 0 picks a free port", flag="--port")
    connection_workers: int | Literal["auto"] = setting(
        "auto",
        "worker processes that accept this port's connections and do their WebSocket I/O, "
        "JSON and base64; sessions and the engine stay in the server process. 0: one process "
        f"does everything. 0..{MAX_CONNECTION_WORKERS}, or `auto`: chosen at startup from "
        "the cores and the engine's slots (see [Layout](#layout), "
        "[Connection workers](#connection-workers))",
        flag="--connection-workers",
        metavar="N|auto",
    )
    session_shards: int | Literal["auto"] = setting(
        "auto",
        "session processes, each with its own sessions, engine and part of "
        "`engine.max_sessions`. Above 1 it needs `connection_workers` >= 1, "
        '`engine.model_device = "cpu"` or engine processes (then every shard links to the '
        "same engines), and `engine.max_sessions` (when set) >= K. "
        f"1..{MAX_SESSION_SHARDS}, or `auto` (see [Layout](#layout), "
        "[Session shards](#session-shards))",
        flag="--session-shards",
        metavar="K|auto",
    )
    engine_process: Literal["auto", "on", "off"] = setting(
        "auto",
        "where the engine runs: `on`, in its own process per device of "
        "`engine.model_device`, which every session process links to; `off`, inside each "
        "session process; `auto`, `on` when `engine.model_device` is not `cpu` "
        "(see [Engine processes](#engine-processes))",
        flag="--engine-process",
        metavar="MODE",
    )
    max_frame_bytes: int = setting(
        16 * _MIB,
        "largest WebSocket message accepted (>= 1024). Larger messages get "
        "`event_too_large`. hypercorn closes with 1009 above 2x this value",
    )
    first_event_timeout_s: float = setting(
        30.0,
        "a socket that has opened no session by then (`/v1/duplex` before its first event "
        "opens one, `/v1/realtime?resume=1` before its `session.resume`) gets `error` "
        "`first_event_timeout` and is closed with 1008. Admission counts sessions, not "
        "sockets: this bounds the idle ones. 0 disables; >= 0",
    )
    http_body_timeout_s: float = setting(
        30.0,
        "an HTTP request body must arrive within this many seconds, then at 4 KiB/s at least "
        "(a stalled or trickled body, slowloris, is answered 408 and closed); 0: no deadline; "
        "0..3600",
    )
    max_connections: int = setting(
        0,
        "TCP connections each serving process (the server, each connection worker) serves "
        "in full at once; at the cap the connection that has waited longest without work "
        "(none in flight, then a body still arriving) is closed to make room, and when every "
        "one works a new one gets only `/health` and `/metrics`, anything else "
        "`503 server_busy`. 0: from the process's file descriptors (less those open at start "
        "and a reserve of 1/16, at least 64) and an eighth of the memory at 64 KiB a "
        "connection; >= 0 (see [Connections](#connections))",
        flag="--max-connections",
        metavar="N",
    )
    node_name: str = setting(
        "",
        "this server's name as a node of a duplex cluster (docs/cluster.md): 1-16 lowercase "
        "letters and digits, carried in its session ids so the cluster's ingress routes a "
        "resume here without a lookup; set by the cluster. Empty: not a cluster node",
    )
    log_format: Literal["console", "json"] = setting("console", "log renderer", flag="--log-format")
    log_level: Literal["debug", "info", "warning", "error"] = setting(
        "info", "minimum log level", flag="--log-level"
    )
    shutdown_grace_s: float = setting(
        5.0,
        "how long shutdown waits for open connections (hypercorn `graceful_timeout`); >= 0",
    )
    malloc_trim_interval_s: float = setting(
        60.0,
        "how often each server process (the server, session shards, engine processes) gives "
        "freed heap memory back to the system (glibc's `malloc_trim`, off the event loop); "
        "`0`: never. 0..86400 (see [Memory](#memory))",
    )

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            refuse("port", f"must be 0..65535, got {self.port}")
        if not self.host:
            refuse("host", "must not be empty")
        if self.max_frame_bytes < 1024:
            refuse("max_frame_bytes", f"must be at least 1024, got {self.max_frame_bytes}")
        workers, shards = self.connection_workers, self.session_shards
        if workers != "auto" and not 0 <= workers <= MAX_CONNECTION_WORKERS:
            refuse(
                "connection_workers", f"must be 0..{MAX_CONNECTION_WORKERS} or auto, got {workers}"
            )
        if shards != "auto" and not 1 <= shards <= MAX_SESSION_SHARDS:
            refuse("session_shards", f"must be 1..{MAX_SESSION_SHARDS} or auto, got {shards}")
        if self.node_name and not re.fullmatch(r"[a-z0-9]{1,16}", self.node_name):
            refuse("node_name", f"1-16 lowercase letters and digits, got {self.node_name!r}")
        # auto: the topology gives shards their workers
        if shards != "auto" and shards > 1 and not workers:
            refuse(
                "session_shards",
                f"{self.session_shards} shards need connection_workers >= 1 "
                "(the workers route each socket to its shard)",
            )
        if self.shutdown_grace_s < 0:
            refuse("shutdown_grace_s", "must be >= 0")
        _within("malloc_trim_interval_s", self.malloc_trim_interval_s, 0, 86_400)
        if not self.first_event_timeout_s >= 0:
            refuse("first_event_timeout_s", "must be >= 0")
        _within("http_body_timeout_s", self.http_body_timeout_s, 0, 3600)
        if self.max_connections < 0:
            refuse("max_connections", f"must be >= 0, got {self.max_connections}")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AccessConfig:
    """Who may connect: API keys, browser origins, host names, TLS, and the limits on
    failed credentials and on one peer's sockets."""

    api_keys: tuple[str, ...] = setting(
        (),
        "keys clients must present as `Authorization: Bearer <key>` (or, from a browser, the "
        "`openai-insecure-api-key.<key>` WebSocket subprotocol); each >= 16 characters, no "
        "commas or surrounding spaces; in the environment comma-separated. Empty: no keys. "
        "Never logged; other local users can read a command line, so prefer the environment "
        "or `api_key_file` (see [Security](#security))",
        flag="--api-key",
        metavar="KEY",
        repr=False,
    )
    api_key_file: str = setting(
        "",
        "a file of more keys, one a line, `#` comments; read at startup; a missing, empty "
        "or malformed file stops the server (exit 2)",
        flag="--api-key-file",
        metavar="FILE",
    )
    allow_unauthenticated: bool = setting(
        False,
        "serve a non-loopback `server.host` without keys, on purpose; without it such a "
        "bind refuses to start",
        flag="--allow-unauthenticated",
    )
    allowed_origins: tuple[str, ...] = setting(
        (),
        "browser origins (`https://app.example`) besides the server's own page that may "
        "connect; `*`: any. Requests without `Origin` (not browsers) pass",
        flag="--allowed-origin",
        metavar="ORIGIN",
    )
    allowed_hosts: tuple[str, ...] = setting(
        (),
        "`Host` names served besides `localhost`, `127.0.0.1` and `[::1]` on a loopback "
        "bind (a DNS-rebinding guard); on another bind, when set, the only ones; `name` or "
        "`name:port`; `*`: any",
        flag="--allowed-host",
        metavar="NAME",
    )
    tls_certfile: str = setting(
        "",
        "PEM certificate chain: with `tls_keyfile`, the port speaks HTTPS and WSS only; set "
        "both or neither; a missing file stops the server (exit 2)",
        flag="--tls-certfile",
        metavar="PEM",
    )
    tls_keyfile: str = setting(
        "", "PEM private key of `tls_certfile`", flag="--tls-keyfile", metavar="PEM"
    )
    client_secret_ttl_s: int = setting(
        600,
        "lifetime of a client secret whose `POST /v1/realtime/client_secrets` names none; "
        f"{CLIENT_SECRET_MIN_TTL_S}..{CLIENT_SECRET_MAX_TTL_S}",
    )
    auth_failure_burst: int = setting(
        10,
        "wrong credentials per peer address (for the whole server: connection workers share "
        "it), and failed `session.resume` per peer and per session id, allowed at once "
        "before `rate_limited`; >= 1",
    )
    auth_failure_window_s: float = setting(
        60.0,
        "time for a refused peer or id to be whole again; one failure is forgiven every "
        "`auth_failure_window_s / auth_failure_burst` s; > 0",
    )
    max_connections_per_peer: int = setting(
        0,
        "open WebSockets and HTTP requests in flight one peer address may hold (each can hold "
        "a session and a model slot, or a socket and a task); more get "
        "`429 too_many_connections`; 0: no cap. Per process "
        "(with connection workers, per worker); behind a proxy every client has the proxy's "
        "address: set it there instead",
        flag="--max-connections-per-peer",
        metavar="N",
    )

    def __post_init__(self) -> None:
        for key in self.api_keys:
            if not key or key != key.strip() or "," in key or len(key) < 16:
                refuse(
                    "api_keys",
                    "each key must be at least 16 characters, without spaces around it or "
                    "commas (the key itself is not shown)",
                )
        for origin in self.allowed_origins:
            if origin != "*" and not re.match(r"^https?://[^/?#@\s]+/?$", origin):
                refuse(
                    "allowed_origins",
                    f"{origin!r} is not * or an origin like https://app.example",
                )
        for name in self.allowed_hosts:
            if not re.match(r"^(\*|\[[0-9a-fA-F:.]+\](:\d+)?|[^:/?#@\s\[\]]+(:\d+)?)$", name):
                refuse("allowed_hosts", f"{name!r} is not * or a host name like api.example[:port]")
        if bool(self.tls_certfile) != bool(self.tls_keyfile):
            refuse("tls_certfile", "tls_certfile and tls_keyfile must be set together")
        _within(
            "client_secret_ttl_s",
            self.client_secret_ttl_s,
            CLIENT_SECRET_MIN_TTL_S,
            CLIENT_SECRET_MAX_TTL_S,
        )
        if self.max_connections_per_peer < 0:
            refuse("max_connections_per_peer", f"must be >= 0, got {self.max_connections_per_peer}")
        if self.auth_failure_burst < 1:
            refuse("auth_failure_burst", f"must be >= 1, got {self.auth_failure_burst}")
        if not self.auth_failure_window_s > 0:
            refuse("auth_failure_window_s", "must be > 0")

    @property
    def keyed(self) -> bool:
        """Some API key is configured (inline or in a file)."""
        return bool(self.api_keys or self.api_key_file)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """The realtime model and its engines: which model, on which devices, how many
    sessions, and the VAD sessions share."""

    model: str = setting(
        "loopback",
        "model to serve: `loopback`, `tiny`, `moshi-7b`, `personaplex-7b`, a checkpoint "
        "folder or `PRESET:PATH` (see [Models](#models)). An unknown name stops the server "
        "with `unknown model 'x'; known: ...` and exit code 2",
        flag="--model",
    )
    model_device: str = setting(
        "cpu",
        "torch device of the model: `cpu`, `cuda` or `cuda:N`, or several comma-separated "
        "(`cuda:0,cuda:1`: one engine process per device, new sessions on the one with most "
        "room); CUDA without a CUDA device is a configuration error. The Moshi LM runs in "
        "bfloat16 on CUDA, float32 on CPU; Mimi in `codec_dtype`",
        flag="--model-device",
    )
    model_seed: int = setting(
        0,
        "base sampling seed (with it, a session's output is reproducible); the seed of the "
        "`tiny` weights too, and of `random_weights`",
        flag="--model-seed",
    )
    random_weights: bool = setting(
        False,
        "serve a Moshi preset (`moshi-7b`, `personaplex-7b`, `tiny`, `tiny-personaplex`) with "
        "weights drawn from `model_seed` on `model_device` instead of a checkpoint "
        "(benchmarks without a download; nothing is written; see [Models](#models)); refused "
        "for `loopback` and for a checkpoint folder",
        flag="--random-weights",
    )
    kv_cache_dtype: Literal["auto", "fp8", "int4"] = setting(
        "auto",
        "storage of Moshi's temporal KV rings: `auto` (the LM's dtype: bf16 on a GPU), "
        "`fp8` (float8 e4m3: half the bytes, about twice the GPU slots; the Triton attention "
        "kernel reads it at one byte an element) or `int4` (4-bit values with a float16 scale "
        "a group of 32: 0.28 of bf16's bytes, about 1.75 times fp8's slots; read in place by "
        "its own kernel, the query rounded to 8 bits a group for the keys' integer products "
        "and the values' on tensor cores, which reads 128 full rings of the 7B in 0.58 of "
        "fp8's time on an H100 for 0.56 of its bytes: the same rate). Their accuracy and "
        "speed are measured in docs/benchmarks.md "
        '("KV storage precision", "KV in 4 bits", "The int4 read timed", '
        '"The keys\' products in 8-bit integers")',
        flag="--kv-cache-dtype",
    )
    weight_dtype: Literal["auto", "fp8"] = setting(
        "auto",
        "storage of a Moshi LM's temporal transformer weights (most of its bytes): `auto` (the "
        "LM's dtype: bf16 on a GPU) or `fp8` (float8 e4m3 with a float32 scale a row, the "
        "activations quantized per token; on a GPU with fp8 tensor cores one `_scaled_mm` a "
        "projection, elsewhere emulated in float32): about 6.6 GB fewer for the 7B, so more "
        "slots. On an H100 it does not shorten the step (quantizing the activations costs "
        'what the halved weight read saves). Its accuracy and speed: docs/benchmarks.md ("fp8 '
        'weights")',
        flag="--weight-dtype",
    )
    codec_dtype: Literal["float32", "bf16"] = setting(
        "float32",
        "the dtype Moshi's codec (Mimi) computes in: `float32`, or `bf16` (half its weight "
        "and state bytes; its codebooks and code distances stay float32). Its code agreement "
        'and audio SNR against float32 are measured in docs/benchmarks.md ("Mimi in bf16"): '
        "on an H100 it takes 0.66 of float32's time at 128 sessions, and moves 1-6% of the "
        "codes, so float32 stays the default",
        flag="--codec-dtype",
    )
    loopback_delay_ms: int = setting(
        240,
        "echo delay of the `loopback` model, a multiple of 80 ms (>= 0); another value stops "
        "`duplex serve` with one line",
    )
    model_cache_dir: str = setting(
        "",
        "where locally built models go (`tiny`); empty means `$XDG_CACHE_HOME/duplex/models` "
        "(`~/.cache/duplex/models`)",
    )
    max_sessions: int = setting(
        0, "cap on concurrent sessions, below the engine's slot count; 0 lets the engine "
        "decide; >= 0"
    )  # fmt: skip
    chat_wait_queue: int = setting(
        0,
        "`/api/chat` sockets held waiting for a slot when the server is full, each sent its "
        "handshake when a slot frees (see [Admission](#admission-and-capacity)); one more is "
        f"refused with 1013; 0: all refused at once; 0 to {MAX_CHAT_WAIT_QUEUE:,}, per "
        "session process",
    )
    realtime_vad: Literal["silero", "energy"] = setting(
        "silero",
        "the VAD behind `server_vad` in Realtime turn-based sessions (`/v1/realtime` without "
        "`?duplex=1`): the shared [silero VAD](#the-silero-vad), or each session's built-in "
        "energy VAD. Native `/v1/duplex` and `?duplex=1` sessions use `session.vad` instead",
    )
    vad_streams: int = setting(
        256,
        "stream pool of the shared silero VAD: how many sessions may use it at once; one "
        "more is refused (see [Admission](#admission-and-capacity)); >= 1",
    )
    stall_timeout_s: float = setting(
        5.0,
        "an engine process with live slots and no tick for this long (alive but stuck: "
        "stopped by a signal, a step hung in a kernel) is killed and restarted as on a "
        "crash; `0`: never. 0, or 1..3600 (see [Engine processes](#engine-processes))",
        alias="engine_stall_timeout_s",
    )

    def __post_init__(self) -> None:
        devices = self.devices
        if not all(_DEVICE.match(device) for device in devices):
            refuse(
                "model_device",
                "must be cpu, cuda or cuda:N, or several of them comma-separated: "
                f"{self.model_device!r}",
            )
        gpus = [device for device in devices if device != "cpu"]
        if len(set(gpus)) != len(gpus):  # several CPU engines may share the cores; a GPU not
            refuse("model_device", f"a GPU is named twice: {self.model_device!r}")
        if self.max_sessions < 0:
            refuse("max_sessions", f"must be >= 0, got {self.max_sessions}")
        if not 0 <= self.chat_wait_queue <= MAX_CHAT_WAIT_QUEUE:
            refuse(
                "chat_wait_queue",
                f"must be from 0 to {MAX_CHAT_WAIT_QUEUE}, got {self.chat_wait_queue}",
            )
        if self.vad_streams < 1:
            refuse("vad_streams", f"must be >= 1, got {self.vad_streams}")
        stall = self.stall_timeout_s
        if not (stall == 0 or 1 <= stall <= 3600):
            refuse("stall_timeout_s", f"must be 0 (never) or 1..3600, got {stall}")

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices of ``model_device``, one engine each."""
        return tuple(device.strip() for device in self.model_device.split(","))


def _check_whisper(path: str) -> None:
    # as duplex.models.agent.check_whisper_folder (not imported: config is read before torch)
    config = os.path.join(path, "config.json")
    try:
        with open(config, encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if model_type != "whisper":
        refuse(
            "asr",
            "must be pocketsphinx or a Whisper checkpoint folder (its config.json says "
            f"model_type whisper), got {path!r}",
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    """The voice agent of Realtime turn-based sessions: its ASR and its reply model (it
    speaks through `SpeechConfig`'s TTS)."""

    enabled: bool = setting(
        True,
        "the voice agent answers Realtime sessions (turn-based, and `?duplex=1` ones, which "
        "then open turn-based too): ASR, a reply model and TTS on engines shared by every "
        "session ([docs/agent.md](agent.md)); `false` (`--no-agent`): the turn responder "
        "replays the user's audio",
        flag="--agent",
        alias="agent",
    )
    llm: str = setting(
        "",
        "a local chat checkpoint folder the agent replies with, through vllm (vllm runs from "
        'its own environment, `.venv-vllm`); empty: the deterministic responder ("You said: '
        '..."), no weights',
        flag="--llm",
        metavar="PATH",
        alias="agent_llm",
    )
    asr: str = setting(
        "pocketsphinx",
        "the agent's ASR: `pocketsphinx` (its model ships in its wheel), or a local Whisper "
        "checkpoint folder (transformers, on the model device; any other path is refused at "
        'start; docs/agent.md, "Whisper")',
        flag="--asr",
        metavar="NAME|PATH",
        alias="agent_asr",
    )
    asr_grammar: str = setting(
        "",
        "a JSGF grammar file pocketsphinx decodes with instead of its language model "
        "(deterministic tests); empty: the language model",
        alias="agent_asr_grammar",
    )
    asr_workers: int = setting(
        2,
        "pocketsphinx processes side by side (each stream decodes in one): speakers at once "
        "decode on as many cores; 1..64",
        alias="agent_asr_workers",
    )

    chat_max_choices: int = setting(
        64,
        "chat completion choices (`/v1/chat/completions` and `/batch`) in flight at once on "
        "the `agent.llm` engine; a request past it gets 429 with `Retry-After`; 1..4096",
    )

    def __post_init__(self) -> None:
        if not 1 <= self.chat_max_choices <= 4096:
            refuse("chat_max_choices", f"must be 1..4096, got {self.chat_max_choices}")
        _within("asr_workers", self.asr_workers, 1, 64)
        if self.asr != "pocketsphinx":
            _check_whisper(self.asr)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechConfig:
    """Text to speech: the engine of ``/v1/audio/speech*`` and of the voice agent."""

    tts: str = setting(
        "espeak",
        "the text-to-speech engine of `/v1/audio/speech*` and of the voice agent: `espeak` "
        "(espeak-ng from the `espeakng-loader` wheel, no weights), `none` (the speech "
        "endpoints answer `404 tts_not_loaded`), or the folder of a local VITS / MMS-TTS "
        "checkpoint (`config.json`, weights, `vocab.json`); see [speech.md](speech.md)",
        flag="--tts",
        metavar="ENGINE",
    )
    max_batch: int = setting(
        8,
        "the most speech requests (texts, or stream sentences) one TTS call takes; 1..256",
        alias="tts_max_batch",
    )
    batch_wait_ms: float = setting(
        2.0,
        "how long a speech request waits for others before its batch runs; 0..1000",
        alias="tts_batch_wait_ms",
    )
    max_queue: int = setting(
        64,
        "speech requests waiting at most; more are answered `429` with `Retry-After`; 1..65536",
        flag="--tts-max-queue",
        metavar="N",
        alias="tts_max_queue",
    )
    voice_dir: str = setting(
        "",
        "the folder of uploaded voices (`POST /v1/audio/voices`), kept across restarts; "
        "PersonaPlex reads its voice prompts there too, after its checkpoint's own; empty: "
        "`$XDG_DATA_HOME/duplex/voices` (`~/.local/share` by default); see "
        "[speech.md](speech.md#uploaded-voices)",
    )
    voice_max_count: int = setting(
        100,
        "uploaded voices kept at once; one more is refused 409 `voice_store_full` until one "
        "is deleted; 1..100,000",
    )
    voice_max_bytes: int = setting(
        10 * 1024 * 1024,
        "the largest voice sample file accepted (400 naming `audio_sample`; a body past it "
        "and 64 KiB of form is 413); 1024..1 GiB",
    )
    voice_max_duration_s: float = setting(
        30.0, "the longest voice sample accepted (400 naming `audio_sample`); 1..3600"
    )
    max_audio_s: float = setting(
        600.0,
        "the most audio one speech request, or one batch together, may make (estimated from "
        "its characters and `speed` before any is made); more is refused 400 "
        "`audio_too_long`; > 0",
        alias="speech_max_audio_s",
    )

    def __post_init__(self) -> None:
        # as duplex.models.tts.check_tts (not imported: config is read before torch loads)
        if self.tts not in ("espeak", "none") and not os.path.isfile(
            os.path.join(self.tts, "config.json")
        ):
            refuse("tts", f"must be espeak, none or a VITS checkpoint folder, got {self.tts!r}")
        _within("max_batch", self.max_batch, 1, 256)
        _within("batch_wait_ms", self.batch_wait_ms, 0, 1000)
        _within("max_queue", self.max_queue, 1, 65536)
        _within("voice_max_count", self.voice_max_count, 1, 100_000)
        _within("voice_max_bytes", self.voice_max_bytes, 1024, 1024**3)
        _within("voice_max_duration_s", self.voice_max_duration_s, 1, 3600)
        if not self.max_audio_s > 0:
            refuse("max_audio_s", f"must be > 0, got {self.max_audio_s}")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MediaConfig:
    """Image, video and audio generation: the pipelines and the video jobs' limits."""

    image_model: str = setting(
        "",
        "the diffusers pipeline behind `POST /v1/images/generations`: a local folder "
        "holding a `model_index.json`, or `tiny` (seeded random weights, built into "
        "`engine.model_cache_dir`); empty: the route answers 404 `model_not_loaded` (see "
        "[images-video.md](images-video.md))",
        flag="--image-model",
        metavar="PATH",
    )
    video_model: str = setting(
        "",
        "the diffusers text-to-video pipeline behind `/v1/videos` and `/v1/realtime/video`: "
        "a folder whose pipeline takes `num_frames` and `callback_on_step_end`, or `tiny`",
        flag="--video-model",
        metavar="PATH",
    )
    audio_model: str = setting(
        "",
        "the diffusers text-to-audio pipeline behind `POST /v1/audio/generate`: a Stable "
        "Audio folder, or `tiny`; empty: the route answers 404 `model_not_loaded` (see "
        "[images-video.md](images-video.md#post-v1audiogenerate))",
        flag="--audio-model",
        metavar="PATH",
    )
    audio_max_length_s: float = setting(
        30.0,
        "the longest `audio_length` one `/v1/audio/generate` request may ask for (the "
        "pipeline's own longest caps it too); > 0",
    )
    max_queue: int = setting(
        16,
        "image, video or audio generation requests that may wait for their pipeline; one "
        "more is refused 429 with `Retry-After`; 1..10,000",
        alias="media_max_queue",
    )
    image_max_batch: int = setting(
        1,
        "the most image requests (and images) one pipeline call denoises together: requests "
        "of one size, steps and guidance that queued while a call ran share the next; 1..64 "
        "(see [images-video.md](images-video.md))",
    )
    batch_beside_realtime: bool = setting(
        True,
        "on a CUDA device, image and video units run on a low-priority CUDA stream (the "
        "realtime steps on a high-priority one), so a unit that starts between two steps may "
        "run on beside the next instead of waiting for a gap it fits (see "
        "[images-video.md](images-video.md)); no effect off CUDA",
    )
    video_chunk_frames: int = setting(
        16,
        "frames one video request generates: a job's chunk, and a `/v1/realtime/video` "
        "chunk; 1..1024, and within the pipeline's own frame limit (AnimateDiff's motion "
        "modules take at most 32)",
    )
    video_max_jobs: int = setting(
        64, "video jobs kept; a new one drops the oldest finished job; 1..100,000"
    )
    video_max_active_jobs: int = setting(
        8,
        "video jobs queued or in progress at once; one more is refused 429; 1..`video_max_jobs`",
    )
    video_job_retention_s: float = setting(
        3600.0, "how long a finished video job and its MP4 are kept; > 0"
    )
    video_start_timeout_s: float = setting(
        10.0,
        "a `/v1/realtime/video` socket without `session.start` by then gets `start_timeout` "
        "and 1008; > 0",
    )
    video_stall_timeout_s: float = setting(
        60.0,
        "a `/v1/realtime/video` stream with no chunk and no `session.ping` this long gets "
        "`stall_timeout`, is stopped and closed with 1011; > 0",
    )
    memory_budget_mb: int = setting(
        0,
        "host memory every image and video request in progress may hold together, by each "
        "request's estimate (pixels x frames x images); a request alone over it is refused "
        "413, one that would pass it while others run 429 (`Retry-After`). 0: a quarter of "
        "the machine's memory; else a size in MiB",
        alias="media_memory_budget_mb",
    )
    max_request_s: float = setting(
        300.0,
        "the most time one image request or video (job or stream) may take by its estimate "
        "(size, frames, images, steps, at the pipeline's measured rate); longer ones are "
        "refused 400 up front (the OpenAI SDK gives up after 600 s and resends); > 0",
        alias="media_max_request_s",
    )

    def __post_init__(self) -> None:
        _within("max_queue", self.max_queue, 1, 10_000)
        _within("image_max_batch", self.image_max_batch, 1, 64)
        _within("video_chunk_frames", self.video_chunk_frames, 1, 1024)
        _within("video_max_jobs", self.video_max_jobs, 1, 100_000)
        _within("video_max_active_jobs", self.video_max_active_jobs, 1, self.video_max_jobs)
        for key, seconds in (
            ("audio_max_length_s", self.audio_max_length_s),
            ("video_job_retention_s", self.video_job_retention_s),
            ("video_start_timeout_s", self.video_start_timeout_s),
            ("video_stall_timeout_s", self.video_stall_timeout_s),
            ("max_request_s", self.max_request_s),
        ):
            if not seconds > 0:
                refuse(key, f"must be > 0, got {seconds}")
        if not 0 <= self.memory_budget_mb <= 16 * 1024 * 1024:
            refuse(
                "memory_budget_mb",
                "must be 0 (a quarter of the memory) or a size in MiB, "
                f"got {self.memory_budget_mb}",
            )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyConfig:
    """The robot policy behind ``/v1/realtime/robot/openpi`` and how its requests batch."""

    model: str = setting(
        "reference",
        "the robot policy behind `/v1/realtime/robot/openpi`: `reference` (the built-in "
        "seeded model), `none` (the endpoint answers `Robot policy not available`), or "
        "`module:factory`, a callable taking `duplex.models.PolicyOptions` and returning a "
        "`duplex.models.Policy` (see [Robot policies](#robot-policies)); a module that does "
        "not import or has no such callable stops the server (exit 2). With connection "
        "workers its sockets are relayed to the server process",
        flag="--policy",
        metavar="NAME",
        alias="policy",
    )
    max_batch: int = setting(
        64,
        f"the most robot requests one policy call takes; 1..{MAX_POLICY_BATCH}",
        flag="--policy-max-batch",
        metavar="N",
        alias="policy_max_batch",
    )
    batch_wait_ms: float = setting(
        2.0,
        "how long a robot request waits for others before its batch runs; 0..1000",
        flag="--policy-batch-wait-ms",
        metavar="MS",
        alias="policy_batch_wait_ms",
    )
    action_horizon: int = setting(
        10,
        "steps per action chunk, given to the policy factory (the reference policy's chunk "
        "length); 1..4096",
        alias="policy_action_horizon",
    )
    action_dim: int = setting(
        8, "values per action step, given to the policy factory; 1..4096", alias="policy_action_dim"
    )
    idle_timeout_s: float = setting(
        30.0,
        "a robot socket that sends no frame this long is closed with 1000 `idle_timeout` "
        "(its own inference time never counts); 0 disables; >= 0",
        alias="policy_idle_timeout_s",
    )

    def __post_init__(self) -> None:
        module, sep, factory = self.model.partition(":")
        if self.model not in ("reference", "none") and not (sep and module and factory):
            refuse("model", f"must be reference, none or module:factory, got {self.model!r}")
        _within("max_batch", self.max_batch, 1, MAX_POLICY_BATCH)
        _within("batch_wait_ms", self.batch_wait_ms, 0, 1000)
        _within("action_horizon", self.action_horizon, 1, 4096)
        _within("action_dim", self.action_dim, 1, 4096)
        if not self.idle_timeout_s >= 0:
            refuse("idle_timeout_s", "must be >= 0")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Every section; checks the rules that span sections."""

    server: ServerConfig = field(default_factory=ServerConfig)
    access: AccessConfig = field(default_factory=AccessConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    speech: SpeechConfig = field(default_factory=SpeechConfig)
    media: MediaConfig = field(default_factory=MediaConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    session: SessionConfig = field(default_factory=SessionConfig)

    def __post_init__(self) -> None:
        server, engine = self.server, self.engine
        devices = engine.devices
        if len(devices) > 1 and server.engine_process == "off":
            refuse(
                "server.engine_process",
                f"off, but model_device names {len(devices)} devices: each needs its own "
                "engine process",
            )
        shards = 1 if server.session_shards == "auto" else server.session_shards
        if shards > 1 and engine.model_device != "cpu" and not self.engine_processes:
            refuse(
                "server.session_shards",
                f"each shard runs its own engine, and model_device {engine.model_device!r} "
                "needs one engine batching every session; use 1 shard or engine_process = on",
            )
        if shards > 1 and engine.max_sessions and engine.max_sessions < shards:
            refuse(
                "server.session_shards",
                f"max_sessions {engine.max_sessions} is split over {shards} shards and must "
                "be at least one per shard",
            )
        if self.agent.enabled and self.speech.tts == "none":
            refuse(
                "agent.enabled",
                "the voice agent speaks through the TTS, so tts must not be none (or turn the "
                "agent off: --no-agent, DUPLEX_AGENT=false)",
            )
        open_bind = not is_loopback(server.host) and not self.access.keyed
        if open_bind and not self.access.allow_unauthenticated:
            refuse(
                "server.host",
                f"{server.host!r} is not a loopback address and no API key is set: anyone "
                "who reaches the port could use the server. Set api_keys (--api-key, "
                "DUPLEX_API_KEYS) or api_key_file, or allow_unauthenticated = true "
                "(--allow-unauthenticated) to serve it open on purpose",
            )

    @property
    def engine_processes(self) -> bool:
        """Engines run in their own processes (``server.engine_process``, ``auto`` resolved:
        on for any device but the CPU)."""
        if self.server.engine_process == "auto":
            return self.engine.model_device != "cpu"
        return self.server.engine_process == "on"
