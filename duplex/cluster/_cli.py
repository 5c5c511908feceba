"""``duplex cluster``: what an operator runs (docs/cluster.md, "Runbook").

``head`` starts Ray's head on this machine and the cluster's controller; ``join``
adds this machine to it; ``ingress`` serves the cluster's port; ``nodes`` lists the
nodes with their load; ``drain`` stops new sessions on one; ``undrain`` gives drained
room back; ``down`` stops every node and the controller (Ray stays: ``ray stop``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence

import ray
import trio

from ._controller import NAMESPACE, NODE_RESOURCE
from ._ingress import Ingress, serve_ingress
from ._ray import LOOPBACK_ENV, RayTable, controller, start_controller

__all__ = ["LOOPBACK_FLAG", "cluster_main", "cluster_parser"]

LOOPBACK_FLAG = "--loopback"


def cluster_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="duplex cluster", description="duplex nodes on a Ray cluster (docs/cluster.md)"
    )
    commands = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def with_address(command: argparse.ArgumentParser) -> argparse.ArgumentParser:
        command.add_argument("--address", default="auto", help="Ray's head (HOST:PORT)")
        command.add_argument(
            "--loopback",
            action="store_true",
            help="every Ray listener on 127.0.0.1 (one machine; must come first: "
            "`duplex cluster ACTION --loopback` sets it before Ray loads)",
        )
        return command

    head = commands.add_parser("head", help="start Ray's head here and the controller")
    head.add_argument("--port", type=int, default=6379, help="Ray's GCS port (default 6379)")
    head.add_argument("--node-ip-address", default=None, help="this machine's address for Ray")
    head.add_argument("--loopback", action="store_true", help="one machine: Ray on 127.0.0.1")
    head.add_argument(
        "--nodes", type=int, default=0, help="duplex nodes on this machine too (CPU; default 0)"
    )
    head.add_argument(
        "--gpus-per-node", type=float, default=0, help="GPUs per duplex node (0: CPU nodes)"
    )
    head.add_argument(
        "serve_args",
        nargs=argparse.REMAINDER,
        help="after --: what every node's `duplex serve` gets (--model, limits)",
    )

    join = commands.add_parser("join", help="add this machine to the cluster")
    join.add_argument("--address", required=True, help="Ray's head (HOST:PORT)")
    join.add_argument("--nodes", type=int, default=1, help="duplex nodes here (CPU; default 1)")
    join.add_argument("--gpus", type=int, default=None, help="GPUs here (a node per GPU)")
    join.add_argument("--node-ip-address", default=None, help="this machine's address for Ray")

    ingress = with_address(commands.add_parser("ingress", help="serve the cluster's port"))
    ingress.add_argument("--host", default="127.0.0.1")
    ingress.add_argument("--port", type=int, default=8000)
    ingress.add_argument(
        "--copies", type=int, default=1, help="ingress copies running (each places its share)"
    )

    with_address(commands.add_parser("nodes", help="list the nodes with their load"))
    drain = with_address(commands.add_parser("drain", help="stop new sessions on a node"))
    drain.add_argument("node", help="the node's name (from `nodes`)")
    drain.add_argument(
        "--deadline", type=float, default=0.0, help="stop it after this many seconds anyway"
    )
    with_address(commands.add_parser("undrain", help="refill the room drained nodes left"))
    with_address(commands.add_parser("down", help="stop every node and the controller"))
    return parser


def _ray_start(args: list[str], *, loopback: bool) -> int:
    """``ray start ARGS`` with this interpreter's Ray (its ``ray`` script need not be on
    ``PATH``: ``.venv/bin/duplex`` runs without the venv activated)."""
    _token_auth()  # a node that joins sends the cluster's token, if this machine has it
    env = {**os.environ, **LOOPBACK_ENV} if loopback else None
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", *args]
    return subprocess.run(command, env=env, check=False).returncode


def _token_auth() -> None:
    """Ray's token authentication whenever a token is at hand (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``) and the operator set no
    ``RAY_AUTH_MODE``. ``ray start`` turns it on for a new cluster and writes the token,
    but a driver that connects later (this command) does not turn it on by itself and is
    refused (Ray 2.60: ``InvalidAuthToken``); a cluster without authentication accepts a
    driver that sends a token. Ray's own rule, after its token cache is dropped (the token
    may have been written since this process looked)."""
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )
    from ray._raylet import AuthenticationTokenLoader

    AuthenticationTokenLoader.instance().reset_cache()
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _connect(address: str) -> None:
    if not ray.is_initialized():
        _token_auth()
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)


def cluster_main(argv: Sequence[str]) -> int:
    """``duplex cluster ...``; the exit code."""
    args = cluster_parser().parse_args(list(argv))
    if args.action == "head":
        ray_args = ["--head", f"--port={args.port}", "--include-dashboard=false"]
        address = args.node_ip_address or ("127.0.0.1" if args.loopback else None)
        if address:
            ray_args.append(f"--node-ip-address={address}")
        if args.nodes:
            ray_args.append(f"--resources={json.dumps({NODE_RESOURCE: args.nodes})}")
        code = _ray_start(ray_args, loopback=args.loopback)
        if code:
            return code
        _connect(f"{address or '127.0.0.1'}:{args.port}")
        serve_args = [a for a in args.serve_args if a != "--"]
        start_controller(serve_args, gpus_per_node=args.gpus_per_node)
        print(f"duplex cluster: head and controller up; nodes join with --address HOST:{args.port}")
        return 0
    if args.action == "join":
        ray_args = [f"--address={args.address}"]
        if args.node_ip_address:
            ray_args.append(f"--node-ip-address={args.node_ip_address}")
        if args.gpus is not None:
            ray_args.append(f"--num-gpus={args.gpus}")
        else:
            ray_args.append(f"--resources={json.dumps({NODE_RESOURCE: args.nodes})}")
        return _ray_start(ray_args, loopback=False)
    _connect(args.address)
    handle = controller()
    if args.action == "ingress":
        ingress = Ingress(RayTable(handle), copies=max(args.copies, 1))

        async def run() -> None:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(serve_ingress, ingress, args.host, args.port)
                print(f"duplex cluster: ingress on {url}", flush=True)

        trio.run(run)
        return 0
    if args.action == "nodes":
        print(f"{'node':<10} {'state':<9} {'live':>5} {'capacity':>8} {'step':>5}  url  reason")
        for row in sorted(ray.get(handle.rows.remote(), timeout=10), key=lambda r: r.report.name):
            r = row.report
            print(
                f"{r.name:<10} {r.state.value:<9} {r.live:>5} {r.capacity:>8} "
                f"{r.step_load:>5.2f}  {r.url}  {row.reason}"
            )
        return 0
    if args.action == "drain":
        if not ray.get(handle.drain.remote(args.node, args.deadline), timeout=10):
            print(f"duplex cluster: no serving node {args.node!r}", file=sys.stderr)
            return 1
        print(f"duplex cluster: {args.node} drains (no new sessions; stops when its last ends)")
        return 0
    if args.action == "undrain":
        print(f"duplex cluster: {ray.get(handle.undrain.remote(), timeout=10)} node(s) refilled")
        return 0
    ray.get(handle.shutdown.remote(), timeout=60)  # down: every node's server, then the
    ray.kill(handle)  # controller; Ray itself stays (`ray stop` on each machine ends it)
    ray.shutdown()
    print("duplex cluster: nodes and controller stopped; `ray stop` on each machine ends Ray")
    return 0
