"""``duplex`` command line: ``duplex serve`` runs the server; ``duplex talk`` talks to one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from duplex import __version__
from duplex.exceptions import ConfigError, UnknownModel


def _parser(*, serve_flags: bool = True) -> argparse.ArgumentParser:
    """The command line; ``serve_flags=False`` leaves out ``duplex serve``'s flags, whose
    declarations import the config (and the session core): ``duplex talk`` needs neither."""
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
    serve.add_argument("--config", metavar="FILE", help="TOML config file")
    if serve_flags:
        from duplex.config import DECLARED, add_flags

        add_flags(serve, DECLARED)  # one per declared key (duplex/config/_sections.py)
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
    cluster = commands.add_parser(
        "cluster",
        help="duplex nodes on a Ray cluster: head, join, ingress, nodes, drain, undrain, down "
        "(docs/cluster.md; `duplex cluster --help`)",
        add_help=False,
    )
    cluster.add_argument("args", nargs=argparse.REMAINDER)
    cluster.set_defaults(command_parser=cluster)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = _parser(serve_flags=argv[:1] == ["serve"]).parse_known_args(argv)
    if args.command == "cluster":  # its own parser takes every argument after it
        args.args = [*unknown, *args.args]
        unknown = []
    if unknown:  # the subcommand's usage, not the top level's (argparse's own error: exit 2)
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "serve":
        return _serve(args)
    if args.command == "cluster":
        import os

        if "--loopback" in args.args:  # read by Ray when it loads: before the import below
            os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
        from duplex.cluster import cluster_main

        return cluster_main(args.args)
    if args.command == "talk":
        import os

        from duplex.client._talk import run_talk

        key = os.environ.get(args.api_key_env) or None
        return run_talk(args.url, args.wav, args.out, key, args.device)
    return 2  # pragma: no cover - argparse rejects unknown commands


def _serve(args: argparse.Namespace) -> int:
    from duplex.config import DECLARED, api_keys_of, flag_overrides, load_config
    from duplex.topology import resolve_media, resolve_model, resolve_policy, run_server

    overrides = flag_overrides(args, DECLARED)
    try:
        config = load_config(args.config, overrides=overrides)
        resolve_model(config)
        resolve_policy(config)
        resolve_media(config)
        api_keys_of(config.access)
    except (ConfigError, UnknownModel) as exc:
        print(f"duplex: configuration error: {exc}", file=sys.stderr)
        return 2
    return run_server(config)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def console_main() -> None:
    """Entry point of the ``duplex`` script."""
    sys.exit(main())
