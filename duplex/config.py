"""One typed configuration: defaults, then a TOML file, then ``DUPLEX_*`` env, then CLI flags.

Every value is checked at startup; a bad one stops the server with a message
that names the key, where it came from and the rule it broke.

TOML layout::

    [server]
    host = "127.0.0.1"
    port = 8000
    model = "loopback"

    [session]
    overlap_policy = "barge_in_on_speech"
    idle_ttl_s = 300

Environment: ``DUPLEX_PORT=9000`` sets ``server.port``;
``DUPLEX_SESSION__IDLE_TTL_S=60`` sets ``session.idle_ttl_s``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, final, get_args, get_origin, get_type_hints

from duplex.exceptions import ConfigError
from duplex.sessions import SessionConfig

ENV_PREFIX = "DUPLEX_"
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
_MIB = 1024 * 1024


CLIENT_SECRET_MIN_TTL_S = 10
CLIENT_SECRET_MAX_TTL_S = 7200
"""Bounds of a client secret's lifetime, as OpenAI's ``expires_after.seconds``."""


def is_loopback(host: str) -> bool:
    """``host`` (a bind address or name) reaches this machine only."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


MAX_CONNECTION_WORKERS = 64
MAX_SESSION_SHARDS = 64
MAX_POLICY_BATCH = 4096
MAX_CHAT_WAIT_QUEUE = 10_000
"""Sockets a session process may hold waiting: each is a socket and a few tasks."""


def _check_whisper(path: str) -> None:
    # as duplex.models.agent.check_whisper_folder (not imported: config is read before torch)
    config = os.path.join(path, "config.json")
    try:
        with open(config, encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if model_type != "whisper":
        raise ConfigError(
            f"agent_asr: must be pocketsphinx or a Whisper checkpoint folder (its config.json "
            f"says model_type whisper), got {path!r}",
            key="agent_asr",
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """The process: where it listens, which model it serves, its limits and logs."""

    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "loopback"
    """``loopback``, ``tiny``, ``moshi-7b``, ``personaplex-7b``, a checkpoint folder, or
    ``PRESET:PATH`` (docs/operations.md, "Models")."""
    model_device: str = "cpu"
    """Torch device of the model: ``cpu``, ``cuda`` or ``cuda:N``; or several, comma-separated
    (``cuda:0,cuda:1``): one engine process per device, new sessions on the one with room."""
    model_seed: int = 0
    """Base sampling seed; with it, a session's output is reproducible."""
    random_weights: bool = False
    """Serve a Moshi preset (``moshi-7b``, ``personaplex-7b``, ``tiny``) with weights drawn
    from ``model_seed`` on ``model_device`` instead of a checkpoint: for benchmarks without a
    download; nothing is written. Refused for ``loopback`` and for a checkpoint folder."""
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    """Storage of Moshi's KV rings: ``auto`` (the LM's dtype: bf16 on a GPU) or ``fp8``
    (e4m3: half the bytes, about twice the sessions; accuracy cost in docs/benchmarks.md)."""
    loopback_delay_ms: int = 240
    """Echo delay of the ``loopback`` model, a multiple of 80 ms."""
    model_cache_dir: str = ""
    """Folder for locally built models (``tiny``); empty: ``$XDG_CACHE_HOME/duplex/models``."""
    max_sessions: int = 0
    """Cap on concurrent sessions below the engine's own capacity; 0 means the engine decides."""
    chat_wait_queue: int = 0
    """``/api/chat`` sockets that may wait for a slot when the server is full, as Kyutai's
    server holds them, each getting its handshake when a slot frees; one more is refused
    with 1013. 0: every one is refused at once. Per session process (shard)."""
    max_frame_bytes: int = 16 * _MIB
    """Largest WebSocket message accepted; larger ones get ``event_too_large``."""
    realtime_vad: Literal["silero", "energy"] = "silero"
    """The VAD behind ``server_vad`` in Realtime turn-based sessions (``/v1/realtime``
    without ``?duplex=1``): the shared silero model, or the built-in energy VAD.
    Native ``/v1/duplex`` sessions use ``session.vad`` (``energy`` by default)."""
    agent: bool = True
    """Answer Realtime turn-based sessions with the voice agent: ASR, a reply model and
    TTS on engines shared by every session (docs/agent.md). Off: the turn responder
    replays the user's audio (tests of the session surface)."""
    agent_llm: str = ""
    """A local chat checkpoint (folder) the agent replies with, through vllm; empty: the
    deterministic responder ("You said: ..."), which needs no weights."""
    agent_asr: str = "pocketsphinx"
    """``pocketsphinx`` (its model ships in its wheel), or a local Whisper checkpoint
    folder (transformers)."""
    agent_asr_grammar: str = ""
    """A JSGF grammar file pocketsphinx decodes with instead of its language model
    (deterministic tests); empty: the language model."""
    agent_asr_workers: int = 2
    """pocketsphinx processes side by side (each stream decodes in one): speakers at once
    decode on as many cores. 1: one process."""
    vad_streams: int = 256
    """Stream pool of the shared silero VAD: sessions using it at once (more are refused)."""
    first_event_timeout_s: float = 30.0
    """A socket that has opened no session by then (``/v1/duplex`` before its first event,
    ``/v1/realtime?resume=1`` before ``session.resume``) gets ``first_event_timeout`` and is
    closed with 1008; 0 disables. Admission counts sessions, so idle sockets are bounded here."""
    connection_workers: int = 0
    """Worker processes that accept the port's connections and do their WebSocket I/O, JSON
    and base64, relaying decoded events to this process, which keeps every session and the
    engine (docs/operations.md, "Connection workers"). 0: one process does everything."""
    engine_process: Literal["auto", "on", "off"] = "auto"
    """Where the engine runs: ``on``, in an engine process per device of ``model_device``,
    which every session process links to (docs/operations.md, "Engine processes"); ``off``,
    inside each session process; ``auto``: ``on`` for a GPU (or several devices), else ``off``."""
    session_shards: int = 1
    """Session processes, each with its own sessions, engine and share of ``max_sessions``;
    connection workers send a new session to the least loaded one and a resume to its owner
    (docs/operations.md, "Session shards"). Above 1 it needs ``connection_workers`` and a
    model on the CPU or engine processes: a GPU model must batch every session in one
    engine."""
    engine_stall_timeout_s: float = 5.0
    """An engine process with live slots and no tick for this long (alive but stuck: a
    signal stopped it, a step hangs in a kernel) is killed and restarted as on a crash
    (docs/operations.md, "Engine processes"). 0: never. 0, or 1..3600."""
    log_format: Literal["console", "json"] = "console"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    shutdown_grace_s: float = 5.0
    malloc_trim_interval_s: float = 60.0
    """How often each server process gives freed heap memory back to the system
    (glibc's ``malloc_trim``; 0: never). Without it RSS stays at the heap's high-water
    mark (docs/operations.md, "Memory")."""
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    """Keys a client must send as ``Authorization: Bearer <key>`` on every route (or, from
    a browser, as the ``openai-insecure-api-key.<key>`` WebSocket subprotocol); empty: no
    keys. ``DUPLEX_API_KEYS`` takes them comma-separated. Never logged."""
    api_key_file: str = ""
    """A file of more API keys, one a line (``#`` comments and blank lines skipped)."""
    allow_unauthenticated: bool = False
    """Serve a non-loopback ``host`` without API keys: an explicit opt-out, since anyone
    who reaches the port could then drive the model."""
    allowed_origins: tuple[str, ...] = ()
    """Browser origins (``https://app.example.com``) besides the server's own page that
    may connect; ``*`` allows any. Requests without ``Origin`` (not browsers) pass."""
    allowed_hosts: tuple[str, ...] = ()
    """``Host`` names served besides ``localhost``/``127.0.0.1``/``[::1]`` on a loopback
    bind (a DNS-rebinding guard); on another bind, when set, the only ones; ``*``: any."""
    tls_certfile: str = ""
    """PEM certificate chain: with ``tls_keyfile``, the port speaks HTTPS and WSS only."""
    tls_keyfile: str = ""
    client_secret_ttl_s: int = 600
    """Lifetime of a client secret when ``POST /v1/realtime/client_secrets`` names none."""
    auth_failure_burst: int = 10
    """Wrong credentials (per peer address) or failed ``session.resume`` (per peer and per
    session id) allowed at once before that peer or id is refused ``rate_limited``..."""
    auth_failure_window_s: float = 60.0
    """...and the time a refused one takes to be whole again (one failure is forgiven
    every ``auth_failure_window_s / auth_failure_burst`` seconds)."""

    policy: str = "reference"
    """The robot policy behind ``/v1/realtime/robot/openpi``: ``reference`` (the built-in
    seeded model), ``none`` (the endpoint answers ``Robot policy not available``), or
    ``module:factory``, a callable taking ``duplex.models.PolicyOptions`` and returning a
    ``duplex.models.Policy`` (docs/operations.md, "Robot policies")."""
    policy_max_batch: int = 64
    """The most robot requests one policy call takes."""
    policy_batch_wait_ms: float = 2.0
    """How long a robot request waits for others before its batch runs."""
    policy_action_horizon: int = 10
    """Steps per action chunk (passed to the policy factory; the reference policy's shape)."""
    policy_action_dim: int = 8
    """Values per action step (passed to the policy factory)."""
    policy_idle_timeout_s: float = 30.0
    """A robot socket that sends no frame this long is closed (1000 ``idle_timeout``);
    0 disables."""

    image_model: str = ""
    """The diffusers pipeline behind ``POST /v1/images/generations``: a local folder
    (``model_index.json``), or ``tiny`` (seeded random weights, built into the model cache);
    empty: not served (the route answers 404 ``model_not_loaded``)."""
    video_model: str = ""
    """The diffusers text-to-video pipeline behind ``/v1/videos`` and ``/v1/realtime/video``
    (a folder whose pipeline takes ``num_frames`` and ``callback_on_step_end``, or ``tiny``)."""
    media_max_queue: int = 16
    """Image or video requests that may wait for their pipeline; more are refused 429."""
    image_max_batch: int = 1
    """The most image requests (and images) one pipeline call denoises together: queued
    requests of one size, steps and guidance share a call."""
    batch_beside_realtime: bool = True
    """On a CUDA device, image and video units run on a low-priority stream (the realtime
    steps on a high-priority one), so a unit that starts between two steps need not end
    before the next: it runs on beside it."""
    video_chunk_frames: int = 16
    """Frames one video request generates: a job's and a stream's chunk."""
    video_max_jobs: int = 64
    """Video jobs kept (the oldest finished one is dropped for a new one)."""
    video_max_active_jobs: int = 8
    """Video jobs queued or in progress at once; more are refused 429."""
    video_job_retention_s: float = 3600.0
    """How long a finished video job (and its MP4) is kept."""
    video_start_timeout_s: float = 10.0
    """``/v1/realtime/video``: a socket without ``session.start`` by then is closed."""
    video_stall_timeout_s: float = 60.0
    """``/v1/realtime/video``: a stream without generation progress or ``session.ping`` this
    long is stopped."""
    media_memory_budget_mb: int = 0
    """Host memory every image and video request in progress may hold together, by each
    request's estimate (pixels x frames x images); a request alone over it is refused 413,
    one that would pass it while others run 429 (``Retry-After``). 0: a quarter of the
    machine's memory."""
    media_max_request_s: float = 300.0
    """The most time one image request or video (job or stream) may take by its estimate
    (size, frames, images, steps, at the pipeline's measured rate); longer ones are refused
    400 up front (the OpenAI SDK gives up after 600 s and resends)."""
    tts: str = "espeak"
    """The text-to-speech engine of ``/v1/audio/speech*`` (and of the voice agent):
    ``espeak`` (espeak-ng, no weights), ``none`` (the speech endpoints answer
    ``tts_not_loaded``), or the folder of a local VITS / MMS-TTS checkpoint."""
    tts_max_batch: int = 8
    """The most speech requests (texts or stream sentences) one TTS call takes."""
    tts_batch_wait_ms: float = 2.0
    """How long a speech request waits for others before its batch runs."""
    tts_max_queue: int = 64
    """Speech requests waiting at most; more are refused 429 with ``Retry-After``."""
    speech_max_audio_s: float = 600.0
    """The most audio one speech request, or one batch together, may make (estimated from
    its characters and ``speed`` before any is made); more is refused 400."""

    http_body_timeout_s: float = 30.0
    """An HTTP request body must arrive within this many seconds, then at 4 KiB/s at least
    (a stalled or trickled body, slowloris, is answered 408 and closed); 0: no deadline."""
    max_connections_per_peer: int = 0
    """Open WebSockets and HTTP requests in flight one peer address may hold (each can hold
    a session and a model slot, or a socket and a task); more are refused 429
    ``too_many_connections``. 0: no cap. Counted per
    process (with connection workers, per worker). Behind a proxy every client has
    the proxy's address: set it there instead."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port: must be 0..65535, got {self.port}")
        if not self.host:
            raise ConfigError("host: must not be empty")
        devices = self.devices
        if not all(_DEVICE.match(device) for device in devices):
            raise ConfigError(
                "model_device: must be cpu, cuda or cuda:N, or several of them comma-separated: "
                f"{self.model_device!r}"
            )
        gpus = [device for device in devices if device != "cpu"]
        if len(set(gpus)) != len(gpus):  # several CPU engines may share the cores; a GPU not
            raise ConfigError(f"model_device: a GPU is named twice: {self.model_device!r}")
        if len(devices) > 1 and self.engine_process == "off":
            raise ConfigError(
                f"engine_process: off, but model_device names {len(devices)} devices: each "
                "needs its own engine process"
            )
        if self.max_sessions < 0:
            raise ConfigError(f"max_sessions: must be >= 0, got {self.max_sessions}")
        if not 0 <= self.chat_wait_queue <= MAX_CHAT_WAIT_QUEUE:
            raise ConfigError(
                f"chat_wait_queue: must be from 0 to {MAX_CHAT_WAIT_QUEUE}, "
                f"got {self.chat_wait_queue}"
            )
        if self.max_frame_bytes < 1024:
            raise ConfigError(f"max_frame_bytes: must be at least 1024, got {self.max_frame_bytes}")
        if not 0 <= self.connection_workers <= MAX_CONNECTION_WORKERS:
            raise ConfigError(
                f"connection_workers: must be 0..{MAX_CONNECTION_WORKERS}, "
                f"got {self.connection_workers}"
            )
        if not 1 <= self.session_shards <= MAX_SESSION_SHARDS:
            raise ConfigError(
                f"session_shards: must be 1..{MAX_SESSION_SHARDS}, got {self.session_shards}"
            )
        if self.session_shards > 1:
            self._check_shards()
        if self.vad_streams < 1:
            raise ConfigError(f"vad_streams: must be >= 1, got {self.vad_streams}")
        if self.shutdown_grace_s < 0:
            raise ConfigError("shutdown_grace_s: must be >= 0")
        if not 0 <= self.malloc_trim_interval_s <= 86_400:
            raise ConfigError(
                f"malloc_trim_interval_s: must be 0..86400, got {self.malloc_trim_interval_s}",
                key="malloc_trim_interval_s",
            )
        stall = self.engine_stall_timeout_s
        if not (stall == 0 or 1 <= stall <= 3600):
            raise ConfigError(
                f"engine_stall_timeout_s: must be 0 (never) or 1..3600, got {stall}",
                key="engine_stall_timeout_s",
            )
        if not self.first_event_timeout_s >= 0:
            raise ConfigError("first_event_timeout_s: must be >= 0")
        self._check_policy()
        self._check_media()
        self._check_tts()
        self._check_exposure()

    def _check_policy(self) -> None:
        name = self.policy
        module, sep, factory = name.partition(":")
        if name not in ("reference", "none") and not (sep and module and factory):
            raise ConfigError(f"policy: must be reference, none or module:factory, got {name!r}")
        if not 1 <= self.policy_max_batch <= MAX_POLICY_BATCH:
            raise ConfigError(
                f"policy_max_batch: must be 1..{MAX_POLICY_BATCH}, got {self.policy_max_batch}"
            )
        if not 0 <= self.policy_batch_wait_ms <= 1000:
            raise ConfigError(
                f"policy_batch_wait_ms: must be 0..1000, got {self.policy_batch_wait_ms}"
            )
        shape = (
            ("policy_action_horizon", self.policy_action_horizon),
            ("policy_action_dim", self.policy_action_dim),
        )
        for key, value in shape:
            if not 1 <= value <= 4096:
                raise ConfigError(f"{key}: must be 1..4096, got {value}")
        if not self.policy_idle_timeout_s >= 0:
            raise ConfigError("policy_idle_timeout_s: must be >= 0")

    def _check_media(self) -> None:
        counts = (
            ("media_max_queue", self.media_max_queue, 1, 10_000),
            ("image_max_batch", self.image_max_batch, 1, 64),
            ("video_chunk_frames", self.video_chunk_frames, 1, 1024),
            ("video_max_jobs", self.video_max_jobs, 1, 100_000),
            ("video_max_active_jobs", self.video_max_active_jobs, 1, self.video_max_jobs),
        )
        for key, value, low, high in counts:
            if not low <= value <= high:
                raise ConfigError(f"{key}: must be {low}..{high}, got {value}", key=key)
        if not 0 <= self.media_memory_budget_mb <= 16 * 1024 * 1024:
            raise ConfigError(
                f"media_memory_budget_mb: must be 0 (a quarter of the memory) or a size in MiB, "
                f"got {self.media_memory_budget_mb}",
                key="media_memory_budget_mb",
            )
        for key, seconds in (
            ("media_max_request_s", self.media_max_request_s),
            ("speech_max_audio_s", self.speech_max_audio_s),
            ("video_job_retention_s", self.video_job_retention_s),
            ("video_start_timeout_s", self.video_start_timeout_s),
            ("video_stall_timeout_s", self.video_stall_timeout_s),
        ):
            if not seconds > 0:
                raise ConfigError(f"{key}: must be > 0, got {seconds}", key=key)

    def _check_tts(self) -> None:
        # as duplex.models.tts.check_tts (not imported: config is read before torch loads)
        if self.tts not in ("espeak", "none") and not os.path.isfile(
            os.path.join(self.tts, "config.json")
        ):
            raise ConfigError(
                f"tts: must be espeak, none or a VITS checkpoint folder, got {self.tts!r}"
            )
        if self.agent and self.tts == "none":
            raise ConfigError(
                "agent: the voice agent speaks through the TTS, so tts must not be none "
                "(or turn the agent off: --no-agent, DUPLEX_AGENT=false)",
                key="agent",
            )
        if not 1 <= self.tts_max_batch <= 256:
            raise ConfigError(f"tts_max_batch: must be 1..256, got {self.tts_max_batch}")
        if not 0 <= self.tts_batch_wait_ms <= 1000:
            raise ConfigError(f"tts_batch_wait_ms: must be 0..1000, got {self.tts_batch_wait_ms}")
        if not 1 <= self.tts_max_queue <= 65536:
            raise ConfigError(f"tts_max_queue: must be 1..65536, got {self.tts_max_queue}")
        if not 1 <= self.agent_asr_workers <= 64:
            raise ConfigError(
                f"agent_asr_workers: must be 1..64, got {self.agent_asr_workers}",
                key="agent_asr_workers",
            )
        if self.agent_asr != "pocketsphinx":
            _check_whisper(self.agent_asr)

    def _check_exposure(self) -> None:
        for key in self.api_keys:
            if not key or key != key.strip() or "," in key or len(key) < 16:
                raise ConfigError(
                    "api_keys: each key must be at least 16 characters, without spaces "
                    "around it or commas (the key itself is not shown)"
                )
        for origin in self.allowed_origins:
            if origin != "*" and not re.match(r"^https?://[^/?#@\s]+/?$", origin):
                raise ConfigError(
                    f"allowed_origins: {origin!r} is not * or an origin like https://app.example"
                )
        for name in self.allowed_hosts:
            if not re.match(r"^(\*|\[[0-9a-fA-F:.]+\](:\d+)?|[^:/?#@\s\[\]]+(:\d+)?)$", name):
                raise ConfigError(
                    f"allowed_hosts: {name!r} is not * or a host name like api.example[:port]"
                )
        if bool(self.tls_certfile) != bool(self.tls_keyfile):
            raise ConfigError("tls_certfile: tls_certfile and tls_keyfile must be set together")
        if not CLIENT_SECRET_MIN_TTL_S <= self.client_secret_ttl_s <= CLIENT_SECRET_MAX_TTL_S:
            raise ConfigError(
                f"client_secret_ttl_s: must be {CLIENT_SECRET_MIN_TTL_S}.."
                f"{CLIENT_SECRET_MAX_TTL_S}, got {self.client_secret_ttl_s}"
            )
        if not 0 <= self.http_body_timeout_s <= 3600:
            raise ConfigError(
                f"http_body_timeout_s: must be 0..3600, got {self.http_body_timeout_s}",
                key="http_body_timeout_s",
            )
        if self.max_connections_per_peer < 0:
            raise ConfigError(
                f"max_connections_per_peer: must be >= 0, got {self.max_connections_per_peer}"
            )
        if self.auth_failure_burst < 1:
            raise ConfigError(f"auth_failure_burst: must be >= 1, got {self.auth_failure_burst}")
        if not self.auth_failure_window_s > 0:
            raise ConfigError("auth_failure_window_s: must be > 0")
        keyed = bool(self.api_keys or self.api_key_file)
        if not is_loopback(self.host) and not keyed and not self.allow_unauthenticated:
            raise ConfigError(
                f"host: {self.host!r} is not a loopback address and no API key is set: anyone "
                "who reaches the port could use the server. Set api_keys (--api-key, "
                "DUPLEX_API_KEYS) or api_key_file, or allow_unauthenticated = true "
                "(--allow-unauthenticated) to serve it open on purpose"
            )

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices of ``model_device``, one engine each."""
        return tuple(device.strip() for device in self.model_device.split(","))

    @property
    def engine_processes(self) -> bool:
        """Engines run in their own processes (``engine_process``, ``auto`` resolved)."""
        if self.engine_process == "auto":
            return self.model_device != "cpu"
        return self.engine_process == "on"

    def _check_shards(self) -> None:
        shards = self.session_shards
        if not self.connection_workers:
            raise ConfigError(
                f"session_shards: {shards} shards need connection_workers >= 1 "
                "(the workers route each socket to its shard)"
            )
        if self.model_device != "cpu" and not self.engine_processes:
            raise ConfigError(
                f"session_shards: each shard runs its own engine, and model_device "
                f"{self.model_device!r} needs one engine batching every session; use 1 shard "
                "or engine_process = on"
            )
        if self.max_sessions and self.max_sessions < shards:
            raise ConfigError(
                f"session_shards: max_sessions {self.max_sessions} is split over {shards} "
                "shards and must be at least one per shard"
            )


def api_keys_of(server: ServerConfig) -> tuple[str, ...]:
    """Every API key: ``api_keys`` and the lines of ``api_key_file`` (read at startup).

    Raises:
        ConfigError: the file cannot be read, or holds no key or a malformed one; a
            TLS file is missing.
    """
    keys = list(server.api_keys)
    if server.api_key_file:
        path = Path(server.api_key_file).expanduser()
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"server.api_key_file: cannot read {path}: {exc.strerror}") from None
        found = [
            line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")
        ]
        if not found:
            raise ConfigError(f"server.api_key_file: {path} holds no key")
        if any(len(key) < 16 or "," in key or " " in key for key in found):
            raise ConfigError(
                f"server.api_key_file: {path}: each key must be at least 16 characters, "
                "one a line, without commas or spaces (the key itself is not shown)"
            )
        keys += found
    for key, name in (("tls_certfile", server.tls_certfile), ("tls_keyfile", server.tls_keyfile)):
        if name and not Path(name).expanduser().is_file():
            raise ConfigError(f"server.{key}: {name} is not a file")
    return tuple(dict.fromkeys(keys))


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    session: SessionConfig = field(default_factory=SessionConfig)


_SECTIONS: dict[str, type[Any]] = {"server": ServerConfig, "session": SessionConfig}


def load_config(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the config from its layers; ``overrides`` keys are ``section.key`` (CLI flags).

    Raises:
        ConfigError: unknown key, wrong type or a value that breaks a rule.
    """
    layers: dict[str, dict[str, tuple[Any, str]]] = {name: {} for name in _SECTIONS}
    if path is not None:
        _merge_file(layers, Path(path))
    _merge_env(layers, os.environ if env is None else env)
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        _put(layers, section, key, value, "command line")
    built: dict[str, Any] = {}
    for section, cls in _SECTIONS.items():
        hints = get_type_hints(cls)
        kwargs = {
            key: _coerce(f"{section}.{key}", hints[key], value, source)
            for key, (value, source) in layers[section].items()
        }
        try:
            built[section] = cls(**kwargs)
        except ConfigError as exc:
            sources = {k: s for k, (_, s) in layers[section].items()}
            # the section's own checks name the key; the prefix says which section
            raise ConfigError(f"{section}.{exc} (sources: {sources or 'defaults'})") from None
    return Config(**built)


def _put(
    layers: dict[str, dict[str, tuple[Any, str]]], section: str, key: str, value: Any, source: str
) -> None:
    cls = _SECTIONS.get(section)
    if cls is None:
        raise ConfigError(f"unknown section [{section}] ({source}); known: {', '.join(_SECTIONS)}")
    names = {f.name for f in dataclasses.fields(cls)}
    if key not in names:
        raise ConfigError(
            f"unknown key {section}.{key} ({source}); known keys: {', '.join(sorted(names))}"
        )
    layers[section][key] = (value, source)


def _merge_file(layers: dict[str, dict[str, tuple[Any, str]]], path: Path) -> None:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: top-level key {section!r} must be a [table]")
        for key, value in table.items():
            _put(layers, section, key, value, str(path))


def _merge_env(layers: dict[str, dict[str, tuple[Any, str]]], env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        section, sep, key = rest.partition("__")
        if not sep:
            section, key = "server", rest
        _put(layers, section, key, value, f"env {name}")


def _coerce(key: str, hint: Any, value: Any, source: str) -> Any:
    """Check ``value`` against the field's type; env strings are parsed."""
    origin = get_origin(hint)
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices:
            raise ConfigError(f"{key}: must be one of {list(choices)}, got {value!r} ({source})")
        return value
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{key}: optional values are not configurable here")  # pragma: no cover
    if hint is bool:
        if isinstance(value, str):
            lowered = value.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: must be a boolean, got {value!r} ({source})")
    if hint in (int, float):
        if isinstance(value, str):
            try:
                value = hint(value.strip())
            except ValueError:
                raise ConfigError(f"{key}: must be a number, got {value!r} ({source})") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: must be a number, got {value!r} ({source})")
        if hint is int and isinstance(value, float):
            if not value.is_integer():
                raise ConfigError(f"{key}: must be an integer, got {value!r} ({source})")
            value = int(value)
        return hint(value)
    if hint is str or (isinstance(hint, type) and issubclass(hint, str)):  # str enums too
        if not isinstance(value, str):
            raise ConfigError(f"{key}: must be a string, got {value!r} ({source})")
        return value
    if origin is tuple and get_args(hint) == (str, ...):
        if isinstance(value, str):  # env: comma-separated
            return tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{key}: must be a list of strings ({source})")
    raise ConfigError(f"{key}: unsupported config type {hint!r}")  # pragma: no cover
