"""``duplex`` command line: ``duplex serve`` runs the server; ``duplex talk`` talks to one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from duplex import __version__
from duplex.exceptions import ConfigError, UnknownModel


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="duplex",
        description="Event-driven actor runtime for realtime full-duplex AI sessions.",
    )
    parser.add_argument("--version", action="version", version=f"duplex {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run the server (HTTP + WebSocket on one port)",
        description="Run the duplex server. Values: defaults < --config FILE < DUPLEX_* env "
        "< flags.",
    )
    serve.add_argument("--host", help="interface to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default 8000; 0 picks one)")
    serve.add_argument("--config", metavar="FILE", help="TOML config file")
    serve.add_argument(
        "--model", help="loopback (default), tiny, moshi-7b, personaplex-7b or a checkpoint folder"
    )
    serve.add_argument(
        "--model-device",
        help="torch device of the model: cpu, cuda, cuda:N, or several (cuda:0,cuda:1)",
    )
    serve.add_argument("--model-seed", type=int, help="base sampling seed of the model")
    serve.add_argument(
        "--agent",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="answer Realtime turn-based sessions with the voice agent (default: on); "
        "--no-agent: the turn responder replays the user's turn",
    )
    serve.add_argument(
        "--llm",
        metavar="PATH",
        help="a local chat checkpoint the voice agent replies with (through vllm); default: "
        'a deterministic responder ("You said: ...")',
    )
    serve.add_argument(
        "--asr", metavar="NAME|PATH", help="the agent's ASR: pocketsphinx, or a Whisper folder"
    )
    serve.add_argument(
        "--random-weights",
        action="store_true",
        default=None,
        help="serve a Moshi preset (moshi-7b, personaplex-7b, tiny) with weights drawn from "
        "--model-seed on the model device, without a checkpoint (benchmarks)",
    )
    serve.add_argument(
        "--kv-cache-dtype", choices=["auto", "fp8"], help="Moshi KV ring storage (default auto)"
    )
    serve.add_argument(
        "--connection-workers",
        type=int,
        metavar="N",
        help="processes for WebSocket I/O, JSON and base64 (default 0: all in one process)",
    )
    serve.add_argument(
        "--session-shards",
        type=int,
        metavar="K",
        help="session processes, each with its own engine (default 1; needs connection workers)",
    )
    serve.add_argument(
        "--engine-process",
        choices=("auto", "on", "off"),
        help="run the engine in its own process per device (auto: on for a GPU)",
    )
    serve.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="require this API key (Authorization: Bearer); repeatable. Other local users "
        "can read a command line: prefer DUPLEX_API_KEYS or --api-key-file",
    )
    serve.add_argument("--api-key-file", metavar="FILE", help="API keys, one a line")
    serve.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=None,
        help="serve a non-loopback --host without API keys, on purpose",
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        metavar="ORIGIN",
        help="a browser origin (https://app.example) that may connect besides the server's "
        "own; repeatable; * for any",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a Host name to serve (DNS-rebinding guard on loopback); repeatable; * for any",
    )
    serve.add_argument(
        "--max-connections-per-peer",
        type=int,
        metavar="N",
        help="open WebSockets one client address may hold (default 0: no cap)",
    )
    serve.add_argument(
        "--policy",
        metavar="NAME",
        help="robot policy of /v1/realtime/robot/openpi: reference (default), none, or "
        "module:factory",
    )
    serve.add_argument(
        "--policy-max-batch", type=int, metavar="N", help="robot requests per policy call"
    )
    serve.add_argument(
        "--policy-batch-wait-ms",
        type=float,
        metavar="MS",
        help="how long a robot request waits for others (default 2)",
    )
    serve.add_argument(
        "--image-model",
        metavar="PATH",
        help="diffusers pipeline folder (or tiny) behind POST /v1/images/generations",
    )
    serve.add_argument(
        "--video-model",
        metavar="PATH",
        help="diffusers text-to-video pipeline folder (or tiny) behind /v1/videos and "
        "/v1/realtime/video",
    )
    serve.add_argument(
        "--audio-model",
        metavar="PATH",
        help="diffusers text-to-audio pipeline folder (Stable Audio, or tiny) behind "
        "POST /v1/audio/generate",
    )
    serve.add_argument(
        "--tts",
        metavar="ENGINE",
        help="text to speech of /v1/audio/speech: espeak (default), none, or a VITS checkpoint "
        "folder",
    )
    serve.add_argument(
        "--tts-max-queue", type=int, metavar="N", help="speech requests waiting at most (64)"
    )
    serve.add_argument("--tls-certfile", metavar="PEM", help="certificate chain: serve HTTPS/WSS")
    serve.add_argument("--tls-keyfile", metavar="PEM", help="private key of --tls-certfile")
    serve.add_argument("--log-format", choices=["console", "json"])
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(command_parser=serve)
    talk = commands.add_parser(
        "talk",
        help="hold a conversation with a server, from the microphone or a WAV file, and print "
        "the transcript",
        description="Talk to a duplex server over WS /v1/realtime?duplex=1: stream the microphone "
        "(or a WAV file) at real time, play the replies on the speaker (or into a WAV), ack what "
        "played, resume after a dropped connection. Ctrl-C ends a microphone conversation.",
    )
    talk.add_argument(
        "--url", default="ws://127.0.0.1:8000", help="the server (default ws://127.0.0.1:8000)"
    )
    talk.add_argument("--wav", metavar="FILE", help="what to say: a 16-bit PCM WAV file")
    talk.add_argument("--out", metavar="FILE", help="write the agent's audio here (a WAV)")
    talk.add_argument(
        "--device",
        metavar="NAME",
        help="without --wav: the sound device (a PortAudio name or index; default: the default)",
    )
    talk.add_argument(
        "--api-key-env",
        default="DUPLEX_API_KEY",
        metavar="NAME",
        help="environment variable holding the API key, if the server needs one",
    )
    talk.set_defaults(command_parser=talk)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, unknown = _parser().parse_known_args(argv)
    if unknown:  # the subcommand's usage, not the top level's (argparse's own error: exit 2)
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "serve":
        return _serve(args)
    if args.command == "talk":
        import os

        from duplex.client._talk import run_talk

        key = os.environ.get(args.api_key_env) or None
        return run_talk(args.url, args.wav, args.out, key, args.device)
    return 2  # pragma: no cover - argparse rejects unknown commands


def _serve(args: argparse.Namespace) -> int:
    from duplex.config import api_keys_of, load_config
    from duplex.topology import resolve_media, resolve_model, resolve_policy, run_server

    overrides: dict[str, Any] = {
        f"server.{key}": value
        for key, value in (
            ("host", args.host),
            ("port", args.port),
            ("model", args.model),
            ("model_device", args.model_device),
            ("model_seed", args.model_seed),
            ("agent", args.agent),
            ("agent_llm", args.llm),
            ("agent_asr", args.asr),
            ("random_weights", args.random_weights),
            ("kv_cache_dtype", args.kv_cache_dtype),
            ("connection_workers", args.connection_workers),
            ("session_shards", args.session_shards),
            ("engine_process", args.engine_process),
            ("log_format", args.log_format),
            ("log_level", args.log_level),
            ("api_keys", args.api_key),
            ("api_key_file", args.api_key_file),
            ("allow_unauthenticated", args.allow_unauthenticated),
            ("allowed_origins", args.allowed_origin),
            ("allowed_hosts", args.allowed_host),
            ("tls_certfile", args.tls_certfile),
            ("tls_keyfile", args.tls_keyfile),
            ("max_connections_per_peer", args.max_connections_per_peer),
            ("policy", args.policy),
            ("policy_max_batch", args.policy_max_batch),
            ("policy_batch_wait_ms", args.policy_batch_wait_ms),
            ("image_model", args.image_model),
            ("video_model", args.video_model),
            ("audio_model", args.audio_model),
            ("tts", args.tts),
            ("tts_max_queue", args.tts_max_queue),
        )
        if value is not None
    }
    try:
        config = load_config(args.config, overrides=overrides)
        resolve_model(config)
        resolve_policy(config)
        resolve_media(config)
        api_keys_of(config.server)
    except (ConfigError, UnknownModel) as exc:
        print(f"duplex: configuration error: {exc}", file=sys.stderr)
        return 2
    return run_server(config)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def console_main() -> None:
    """Entry point of the ``duplex`` script."""
    sys.exit(main())
