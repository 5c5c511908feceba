"""The cluster's control plane on Ray: nodes started, placed, watched, drained, listed.

One ``Controller`` (a named, detached Ray actor, restarted by Ray if its process dies)
runs per cluster. Every
``poll_s`` it looks at Ray's node table: each alive Ray node that offers the node
resource (``duplex_node`` on a CPU host, or a GPU) and has no duplex node gets one, a
``NodeServer`` actor pinned to it (Ray's ``NodeAffinitySchedulingStrategy``). It asks
each node for its report, and a node whose actor Ray says is dead (its process, or its
machine, by Ray's own health checks), or whose server exited, is gone: its name is
never reused, so its sessions' ids can only expire. A drained node takes no new
session and is stopped once its last session ended (or at its deadline).

Nodes are detached actors too, named ``duplex-node-<name>``: a controller that dies takes
no node with it (an actor's children otherwise die with it), and its restarted self takes
every living node back (`Controller._adopt`) before it looks for room. What it forgets:
gone nodes (an id naming one then names no node: the same ``session_resume_expired``),
drains in progress (the node serves on, undrained) and the drained hosts' held room.

The ingresses read ``table()``: one Ray call per ingress per refresh, never one per
request or per frame.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, final

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from duplex.logs import get_logger

from ._node import NodeServer, ServerReport
from ._placement import NodeReport, NodeState

__all__ = ["CONTROLLER_NAME", "NAMESPACE", "NODE_RESOURCE", "Controller", "NodeRow"]

NAMESPACE = "duplex"
CONTROLLER_NAME = "duplex-controller"
NODE_ACTOR_PREFIX = "duplex-node-"
"""A node actor's Ray name: this and its node name."""
NODE_RESOURCE = "duplex_node"
"""The custom resource a CPU host offers (1 per duplex node it may run)."""

REPORT_TIMEOUT_S = 1.0

log = get_logger(component="cluster-controller")


@final
@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node for ``duplex cluster nodes``: its report and where it runs."""

    report: NodeReport
    ray_node: str
    pid: int
    reason: str


@dataclass
class _Node:
    name: str
    ray_node: str
    actor: Any
    pid: int
    url: str
    state: NodeState = NodeState.STARTING
    live: int = 0
    capacity: int = 0
    step_load: float = 0.0
    seq: int = 0
    refused: int = 0
    drain_deadline: float | None = None
    drain_seq: int = 0
    reason: str = ""
    pending: Any = field(default=None)

    def report(self) -> NodeReport:
        return NodeReport(
            self.name,
            self.url,
            self.state,
            self.live,
            self.capacity,
            self.step_load,
            self.seq,
            self.refused,
        )


class Controller:
    """Starts and watches one duplex node per Ray node that offers the node resource
    (``ray.remote(Controller)``, detached, named ``CONTROLLER_NAME``)."""

    def __init__(
        self,
        serve_args: Sequence[str] = (),
        *,
        gpus_per_node: float = 0,
        poll_s: float = 0.5,
        drain_grace_s: float = 5.0,
        env: dict[str, str] | None = None,
    ) -> None:
        """``serve_args``: what every node's ``duplex serve`` gets (model, layout);
        ``gpus_per_node``: a GPU node's ``num_gpus`` (0: the ``duplex_node`` resource)."""
        self.serve_args = list(serve_args)
        self.gpus_per_node = gpus_per_node
        self.poll_s = poll_s
        self.drain_grace_s = drain_grace_s
        self.env = dict(env or {})
        self._nodes: dict[str, _Node] = {}
        self._drained_hosts: Counter[str] = Counter()
        """Drained nodes per Ray node: their room there is not refilled until ``undrain``."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._adopt()
        self._thread = threading.Thread(target=self._run, name="duplex-controller", daemon=True)
        self._thread.start()

    # -- what the ingresses and the CLI ask -----------------------------------

    def table(self) -> list[NodeReport]:
        """Every node's last report, gone ones included (so ids naming them expire)."""
        with self._lock:
            return [node.report() for node in self._nodes.values()]

    def rows(self) -> list[NodeRow]:
        with self._lock:
            return [
                NodeRow(node.report(), node.ray_node, node.pid, node.reason)
                for node in self._nodes.values()
            ]

    def drain(self, name: str, deadline_s: float = 0.0) -> bool:
        """Stop new sessions on ``name``; stop it once its sessions ended, or after
        ``deadline_s`` (0: no deadline). ``False``: no such serving node."""
        with self._lock:
            node = self._nodes.get(name)
            if node is None or node.state not in (NodeState.STARTING, NodeState.SERVING):
                return False
            node.state = NodeState.DRAINING
            node.seq += 1
            node.drain_seq = node.seq  # its live count is trusted from the next report on
            node.drain_deadline = time.monotonic() + deadline_s if deadline_s > 0 else None
            self._drained_hosts[node.ray_node] += 1
            return True

    def undrain(self) -> int:
        """Let every drained node's room take a new node again; how many."""
        with self._lock:
            count = self._drained_hosts.total()
            self._drained_hosts.clear()
            return count

    def shutdown(self) -> None:
        """Stop watching and stop every node's server (the cluster is being taken down)."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            nodes = [node for node in self._nodes.values() if node.state is not NodeState.GONE]
        for node in nodes:
            self._stop_node(node, "cluster shut down")

    # -- the loop --------------------------------------------------------------

    def _adopt(self) -> None:
        """Take back the nodes an earlier life of this controller started (Ray restarted
        it): each living node actor of the namespace, with its url, server and Ray node;
        its next report says its state. One that does not answer is left to Ray."""
        names = [
            actor["name"]
            for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["namespace"] == NAMESPACE and actor["name"].startswith(NODE_ACTOR_PREFIX)
        ]
        for actor_name in names:
            name = actor_name.removeprefix(NODE_ACTOR_PREFIX)
            try:
                actor = ray.get_actor(actor_name, namespace=NAMESPACE)
                calls = [actor.url.remote(), actor.pid.remote(), actor.ray_node.remote()]
                url, pid, ray_node = ray.get(calls, timeout=10)
            except (ValueError, RayActorError, RayTaskError, GetTimeoutError) as exc:
                log.warning("node not taken back", node=name, error=str(exc)[:200])
                continue
            self._nodes[name] = _Node(name, ray_node, actor, pid, url)
            log.info("node taken back", node=name, url=url)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.poll_s):
                self._start_missing()
                self._collect()
                self._finish_drains()
        except BaseException:  # the loop is the controller: without it, let Ray see it die
            log.exception("controller loop failed; exiting so Ray reports the actor dead")
            os._exit(1)

    def _offers(self, resources: dict[str, float]) -> int:
        """Duplex nodes a Ray node holds: one per ``gpus_per_node`` GPUs, or one per unit
        of the ``duplex_node`` resource."""
        if self.gpus_per_node:
            return int(resources.get("GPU", 0) // self.gpus_per_node)
        return int(resources.get(NODE_RESOURCE, 0))

    def _start_missing(self) -> None:
        with self._lock:
            held = Counter(
                n.ray_node for n in self._nodes.values() if n.state is not NodeState.GONE
            )
            held.update(self._drained_hosts)
        started = []
        for info in ray.nodes():
            ray_node = info["NodeID"]
            if not info["Alive"]:
                continue
            for _ in range(self._offers(info["Resources"]) - held[ray_node]):
                started.append(self._start(ray_node))
        for name, ray_node, actor in started:  # every one starts at once; then ask each
            try:
                url, pid = ray.get([actor.url.remote(), actor.pid.remote()], timeout=60)
            except (RayActorError, RayTaskError, GetTimeoutError) as exc:
                log.warning("node did not start", node=name, error=str(exc)[:200])
                ray.kill(actor)
                continue
            with self._lock:
                self._nodes[name] = _Node(name, ray_node, actor, pid, url)

    def _start(self, ray_node: str) -> tuple[str, str, Any]:
        """A new node's actor on ``ray_node`` (a fresh name: ids of old nodes never match)."""
        name = secrets.token_hex(4)
        options: dict[str, Any] = {
            "num_cpus": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(ray_node, soft=False),
            "name": f"{NODE_ACTOR_PREFIX}{name}",
            "namespace": NAMESPACE,
            "lifetime": "detached",  # it outlives this controller's process (`_adopt`)
            "max_restarts": 0,
        }
        if self.gpus_per_node:
            options["num_gpus"] = self.gpus_per_node
        else:
            options["resources"] = {NODE_RESOURCE: 1}
        actor = (
            ray.remote(NodeServer).options(**options).remote(name, self.serve_args, env=self.env)
        )
        return name, ray_node, actor

    def _collect(self) -> None:
        with self._lock:
            live = [n for n in self._nodes.values() if n.state is not NodeState.GONE]
        calls = {node.actor.report.remote(): node for node in live}
        if not calls:
            return
        ready, _ = ray.wait(list(calls), num_returns=len(calls), timeout=REPORT_TIMEOUT_S)
        for ref in ready:
            node = calls[ref]
            try:
                report: ServerReport = ray.get(ref)
            except RayActorError as exc:  # Ray says the actor (or its machine) is gone
                self._gone(node, f"ray: {type(exc).__name__}")
                continue
            except RayTaskError as exc:  # its report failed: no report this time
                log.warning("node report failed", node=node.name, error=str(exc)[:200])
                continue
            if report.exited is not None:
                self._gone(node, f"server exited ({report.exited})")
                ray.kill(node.actor)
                continue
            with self._lock:
                if report.status in ("ok", "degraded") and node.state is NodeState.STARTING:
                    node.state = NodeState.SERVING
                if report.status:
                    node.live, node.capacity = report.live, report.capacity
                    node.step_load, node.refused = report.step_load, report.refused
                    node.seq += 1

    def _finish_drains(self) -> None:
        now = time.monotonic()
        with self._lock:
            done = [
                node
                for node in self._nodes.values()
                if node.state is NodeState.DRAINING
                and ((node.live == 0 and node.seq > node.drain_seq + 1) or _past(node, now))
            ]
        for node in done:
            self._stop_node(node, "drained" if node.live == 0 else "drain deadline")

    def _stop_node(self, node: _Node, reason: str) -> None:
        """Stop ``node``'s server (1001 to its sockets) and its actor."""
        # already gone, or stuck: the kill below ends it either way
        with contextlib.suppress(RayActorError, GetTimeoutError):
            ray.get(node.actor.stop.remote(self.drain_grace_s), timeout=self.drain_grace_s + 5)
        ray.kill(node.actor)
        self._gone(node, reason)

    def _gone(self, node: _Node, reason: str) -> None:
        with self._lock:
            node.state, node.reason, node.live = NodeState.GONE, reason, 0
            node.seq += 1


def _past(node: _Node, now: float) -> bool:
    """``node``'s drain deadline has passed."""
    return node.drain_deadline is not None and now >= node.drain_deadline
