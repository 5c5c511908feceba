"""The cluster's real placement and routing code against many simulated nodes.

Each ingress copy is a real ``duplex.cluster.Placement``; the nodes, their sessions
and the controller's table are simulated in steps of one report period. Sessions
arrive (Poisson), live an exponential time, and some drop their socket and resume
through a random ingress copy; nodes fail (their sessions are lost), drain and
join. Reported: how evenly the sessions spread (utilisation per node, relative to
its capacity), how many placements a node refused (the ingress thought it had
room), and resumes routed to a node other than their owner (the goal: 0).

    python bench/cluster_sim.py --nodes 1000 --seconds 120 --seed 1
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from dataclasses import dataclass, field

from duplex.cluster import Expired, NodeReport, NodeState, Placed, Placement
from duplex.sessions import new_session_id, node_of


@dataclass
class SimNode:
    name: str
    capacity: int
    state: NodeState = NodeState.SERVING
    sessions: set[str] = field(default_factory=set)
    seq: int = 0

    def report(self) -> NodeReport:
        return NodeReport(
            self.name,
            f"sim://{self.name}",
            self.state,
            len(self.sessions),
            self.capacity,
            0.0,
            self.seq,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--ingresses", type=int, default=4)
    parser.add_argument("--capacity", default="24,32,48", help="node capacities, drawn evenly")
    parser.add_argument("--load", type=float, default=0.7, help="target live / total capacity")
    parser.add_argument("--lifetime-s", type=float, default=30.0, help="mean session life")
    parser.add_argument("--seconds", type=float, default=120.0, help="simulated time")
    parser.add_argument("--report-s", type=float, default=0.25, help="report and refresh period")
    parser.add_argument(
        "--resume-share", type=float, default=0.02, help="live sessions dropping a second"
    )
    parser.add_argument("--failures", type=int, default=20, help="nodes killed over the run")
    parser.add_argument("--drains", type=int, default=10, help="nodes drained over the run")
    parser.add_argument("--joins", type=int, default=20, help="nodes added over the run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-share", dest="share", action="store_false", help="copies=1: each copy counts all room"
    )
    parser.add_argument("--json", default="", help="write the figures here too")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    caps = [int(c) for c in args.capacity.split(",")]
    counter = iter(range(10**9))

    def new_node() -> SimNode:
        return SimNode(f"{next(counter):x}", rng.choice(caps))

    nodes = {n.name: n for n in (new_node() for _ in range(args.nodes))}
    copies = args.ingresses if args.share else 1
    ingresses = [
        Placement(salt=rng.getrandbits(31) + 1, copies=copies) for _ in range(args.ingresses)
    ]
    lost: list[str] = []  # sessions of nodes that died: their clients try to resume
    owner: dict[str, str] = {}  # live session -> node that admitted it
    ends: dict[str, float] = {}
    total_cap = sum(n.capacity for n in nodes.values())
    rate = args.load * total_cap / args.lifetime_s  # arrivals per second at the target
    steps = int(args.seconds / args.report_s)
    events = sorted(
        [(rng.randrange(steps // 10, steps), "fail") for _ in range(args.failures)]
        + [(rng.randrange(steps // 10, steps), "drain") for _ in range(args.drains)]
        + [(rng.randrange(steps // 10, steps), "join") for _ in range(args.joins)]
    )
    figures = dict(
        placed=0, refused_full=0, refused_by_node=0, resumes=0, resumed_ok=0, misrouted=0,
        expired_dead=0, lost_with_node=0, routed_to_dead=0, resumes_of_lost=0,
        placed_on_gone=0, placed_on_draining=0,
    )  # fmt: skip
    utilisation_samples: list[float] = []
    place_s = 0.0
    started = time.perf_counter()

    def publish() -> None:
        for node in nodes.values():
            node.seq += 1
        table = [node.report() for node in nodes.values()]
        for ingress in ingresses:
            ingress.update(table)

    publish()
    for step in range(steps):
        now = step * args.report_s
        while events and events[0][0] == step:
            _, kind = events.pop(0)
            serving = [n for n in nodes.values() if n.state is NodeState.SERVING]
            if kind == "join":
                node = new_node()
                nodes[node.name] = node
            elif kind == "fail" and serving:
                node = rng.choice(serving)
                node.state = NodeState.GONE  # its sockets break: clients told, sessions lost
                figures["lost_with_node"] += len(node.sessions)
                for sid in node.sessions:
                    owner.pop(sid, None)
                    ends.pop(sid, None)
                    lost.append(sid)
                node.sessions.clear()
            elif kind == "drain" and serving:
                rng.choice(serving).state = NodeState.DRAINING
        # sessions that end
        for sid in [s for s, t in ends.items() if t <= now]:
            nodes[owner.pop(sid)].sessions.discard(sid)
            del ends[sid]
        for node in nodes.values():  # a drained node with no session left stops
            if node.state is NodeState.DRAINING and not node.sessions:
                node.state = NodeState.GONE
        # new sessions, each through a random ingress copy
        for _ in range(_poisson(rng, rate * args.report_s)):
            ingress = rng.choice(ingresses)
            t0 = time.perf_counter()
            decision = ingress.place()
            place_s += time.perf_counter() - t0
            if not isinstance(decision, Placed):
                figures["refused_full"] += 1
                continue
            node = nodes[decision.node]
            if node.state is NodeState.GONE:  # the table is a report old: the real ingress
                figures["placed_on_gone"] += 1  # fails to connect and tries another node
                continue
            if node.state is NodeState.DRAINING:
                figures["placed_on_draining"] += 1  # admitted there: drains take a report
            elif len(node.sessions) >= node.capacity:
                figures["refused_by_node"] += 1  # full: copies raced it within a report
                continue
            sid = new_session_id(rng.randbytes, None, node.name)
            node.sessions.add(sid)
            owner[sid] = node.name
            ends[sid] = now + rng.expovariate(1 / args.lifetime_s)
            figures["placed"] += 1
        # resumes: a share of live sessions drop their socket and come back anywhere
        live_ids = list(owner)
        for sid in rng.sample(
            live_ids,
            min(len(live_ids), _poisson(rng, len(live_ids) * args.resume_share * args.report_s)),
        ):
            figures["resumes"] += 1
            decision = rng.choice(ingresses).route(sid)
            if isinstance(decision, Placed):
                if decision.node != node_of(sid) or decision.node != owner[sid]:
                    figures["misrouted"] += 1
                elif nodes[decision.node].state is NodeState.GONE:
                    figures["routed_to_dead"] += 1
                else:
                    figures["resumed_ok"] += 1
            elif isinstance(decision, Expired):
                figures["expired_dead"] += 1  # its node is gone (never with a live owner here)
        for sid in lost:  # each lost session's client tries once, at once (same table)
            figures["resumes_of_lost"] += 1
            decision = rng.choice(ingresses).route(sid)
            if isinstance(decision, Placed) and nodes[decision.node].state is not NodeState.GONE:
                figures["misrouted"] += 1  # a live node that does not own it
            elif isinstance(decision, Placed):
                figures["routed_to_dead"] += 1  # its socket fails: session_resume_expired
            else:
                figures["expired_dead"] += 1
        lost.clear()
        publish()
        serving = [n for n in nodes.values() if n.state is NodeState.SERVING]
        if step % 20 == 0 and step > steps // 4:
            used = [len(n.sessions) / n.capacity for n in serving]
            utilisation_samples.append(statistics.pstdev(used) / max(statistics.fmean(used), 1e-9))

    serving = [n for n in nodes.values() if n.state is NodeState.SERVING]
    used = [len(n.sessions) / n.capacity for n in serving]
    jain = sum(used) ** 2 / (len(used) * sum(u * u for u in used)) if any(used) else 1.0
    result = {
        "nodes_start": args.nodes,
        "nodes_serving_end": len(serving),
        "ingresses": args.ingresses,
        "copies_counted": copies,
        "simulated_s": args.seconds,
        "live_end": len(owner),
        "capacity_end": sum(n.capacity for n in serving),
        **figures,
        "utilisation_min": round(min(used), 3),
        "utilisation_mean": round(statistics.fmean(used), 3),
        "utilisation_max": round(max(used), 3),
        "utilisation_cv_mean": round(statistics.fmean(utilisation_samples), 4),
        "jain_fairness_end": round(jain, 5),
        "place_us_mean": round(
            1e6 * place_s / max(figures["placed"] + figures["refused_full"], 1), 1
        ),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "result": result}, f, indent=1)


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (normal approximation above 50, exact below)."""
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


if __name__ == "__main__":
    main()
