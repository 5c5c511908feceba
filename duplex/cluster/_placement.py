"""Where a request goes in a duplex cluster: decided on numbers, sans I/O.

An ingress holds a ``Placement``: the nodes' last capacity reports (from the
cluster's controller, through Ray) plus what it placed since each report. A new
session goes to the node with the most room; anything that names an object (a
session id, a video id) goes to the node the id names, or is told it expired when
that node is gone. No time is read here and nothing is asked of anyone: a placement
that no report has shown yet is counted as taken, so sessions arriving between
reports spread instead of all landing on the node that looked emptiest. A report
whose ``live`` grew shows that many of them; whatever ``PENDING_REPORTS`` newer
reports have not shown is dropped (the session failed to open, or ended at once).
"""

from __future__ import annotations

import enum
import heapq
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import final

from duplex.sessions import node_of

__all__ = [
    "Expired",
    "Full",
    "NodeReport",
    "NodeState",
    "Placed",
    "Placement",
    "PlacementStatistics",
    "node_object_id",
    "node_of_object",
    "object_id_on",
]


class NodeState(enum.Enum):
    """A node's life: only ``serving`` takes new sessions; ``draining`` keeps its own."""

    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    GONE = "gone"


@final
@dataclass(frozen=True, slots=True)
class NodeReport:
    """One node as the controller last saw it.

    Args:
        name: the node's name, as its ids carry it.
        url: its server's base URL (``http://host:port``).
        state: where it is in its life.
        live: sessions live on it at the report.
        capacity: sessions its admission allows now (slots, lowered by the measured
            step time: its ``/health`` ``sessions.capacity``).
        step_load: its engine's step time p99 over the frame budget (0: idle or not
            measured; 1: at the deadline); breaks ties between equal room.
        seq: the report's number for this node; a new one confirms what was placed.
        refused: sessions its own admission refused so far (the node's counter).
    """

    name: str
    url: str
    state: NodeState
    live: int
    capacity: int
    step_load: float = 0.0
    seq: int = 0
    refused: int = 0

    @property
    def free(self) -> int:
        return max(self.capacity - self.live, 0)


@final
@dataclass(frozen=True, slots=True)
class Placed:
    """Send it to ``node`` at ``url``."""

    node: str
    url: str


@final
@dataclass(frozen=True, slots=True)
class Full:
    """No node has room: refuse as one full server does (``resource_exhausted``, 1013)."""

    reason: str


@final
@dataclass(frozen=True, slots=True)
class Expired:
    """The id names no node that serves: a resume gets ``session_resume_expired``."""

    reason: str


@final
@dataclass(frozen=True, slots=True)
class PlacementStatistics:
    """What this ingress placed and refused (``/metrics``)."""

    placed: dict[str, int]
    refused_full: int
    routed: dict[str, int]
    expired: int


PENDING_REPORTS = 4
"""Reports of a node after which a placement it never showed is no longer counted."""

_Entry = tuple[float, float, int, str]
"""A serving node in `Placement`'s heap: (minus its free share, step load, tie, name)."""


@dataclass
class _Node:
    report: NodeReport
    pending: list[int] = field(default_factory=list)
    """The report ``seq`` at each placement not shown by a report yet, oldest first."""
    placed: int = 0
    routed: int = 0

    def seen(self, report: NodeReport) -> None:
        """A newer report: the placements it shows (``live`` grew) and old ones dropped."""
        shown = max(report.live - self.report.live, 0)
        kept = self.pending[shown:]
        self.pending = [seq for seq in kept if report.seq - seq < PENDING_REPORTS]
        self.report = report


@final
@dataclass
class Placement:
    """One ingress's view of the nodes: reports in, decisions out.

    Args:
        salt: breaks ties between equally roomy nodes (each ingress copy its own, so
            copies that saw the same report do not all pick the same node before the
            next one; 0: by name).
        copies: ingress copies placing at once: each counts only its share of a node's
            free slots (rounded up) until the next report, so a node that just joined
            (all of it free) is not sent its room once per copy.
    """

    salt: int = 0
    copies: int = 1
    _nodes: dict[str, _Node] = field(default_factory=dict)
    _serving: list[_Node] = field(default_factory=list)
    _ties: dict[str, int] = field(default_factory=dict)
    _refused_full: int = 0
    _expired: int = 0
    _placed_gone: dict[str, int] = field(default_factory=dict)
    _heap: list[_Entry] = field(default_factory=list)
    """The serving nodes with room, best first (`_entry`): a placement takes the top and
    puts it back with its new room, O(log nodes), not a walk over every node."""

    def update(self, reports: Iterable[NodeReport]) -> None:
        """The controller's latest table: nodes not in it are gone (their counts are kept)."""
        fresh: dict[str, _Node] = {}
        for report in reports:
            node = self._nodes.get(report.name)
            if node is None:
                node = _Node(report)
            elif report.seq > node.report.seq:
                node.seen(report)
            fresh[report.name] = node
        for name, old in self._nodes.items():
            if name not in fresh and old.placed:
                self._placed_gone[name] = old.placed
        self._nodes = fresh
        self._serving = [n for n in fresh.values() if n.report.state is NodeState.SERVING]
        for name in fresh.keys() - self._ties.keys():
            self._ties[name] = zlib.crc32(name.encode(), self.salt) if self.salt else 0
        self._heap = [entry for node in self._serving if (entry := self._entry(node))]
        heapq.heapify(self._heap)

    def _entry(self, node: _Node) -> _Entry | None:
        """``node``'s place in the heap: the largest share of its capacity free first, then
        the lower step load, the tie-breaker, the name; ``None`` without room."""
        report = node.report
        free = -(-report.free // self.copies) - len(node.pending)
        if free <= 0:
            return None
        return (-(free / report.capacity), report.step_load, self._ties[report.name], report.name)

    def nodes(self) -> list[NodeReport]:
        """The reports held, by name."""
        return [self._nodes[name].report for name in sorted(self._nodes)]

    def room(self, name: str) -> int:
        """Free slots of ``name`` as this ingress counts them (its report, less what it
        placed since); 0 for a node not serving."""
        node = self._nodes.get(name)
        if node is None or node.report.state is not NodeState.SERVING:
            return 0
        return max(-(-node.report.free // self.copies) - len(node.pending), 0)

    def place(self, *, exclude: frozenset[str] = frozenset(), count: bool = True) -> Placed | Full:
        """The node for a new session: the largest share of its capacity free (so nodes of
        any size fill alike), then the lower step load, then the tie-breaker (``salt``),
        then the name; counted as taken there.

        ``exclude``: nodes that just failed to answer (tried next: another);
        ``count=False``: a request that holds no session (HTTP), sent where there is room.
        """
        heap = self._heap
        best: _Node | None = None
        skipped: list[_Entry] = []
        while heap:
            entry = heap[0]
            node = self._nodes[entry[3]]
            current = self._entry(node)
            if current != entry:  # its room changed since it was pushed: its new place
                if current is None:
                    heapq.heappop(heap)
                else:
                    heapq.heapreplace(heap, current)
            elif exclude and entry[3] in exclude:
                skipped.append(heapq.heappop(heap))
            else:
                best = node
                break
        if best is not None and count:  # (still the top: the skipped are not back yet)
            best.pending.append(best.report.seq)
            best.placed += 1
            moved = self._entry(best)
            if moved is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, moved)
        for entry in skipped:
            heapq.heappush(heap, entry)
        if best is None:
            self._refused_full += count
            return Full(
                f"every node is full ({len(self._serving)} serving, {len(self._nodes)} known)"
            )
        return Placed(best.report.name, best.report.url)

    def route(self, object_id: str) -> Placed | Expired:
        """The node an id names, while it serves or drains (a draining node keeps its own
        sessions); ``Expired`` when the id names none, or a node that is gone."""
        name = node_of_object(object_id)
        node = self._nodes.get(name) if name is not None else None
        if node is None or node.report.state not in (NodeState.SERVING, NodeState.DRAINING):
            self._expired += 1
            why = "names no cluster node" if name is None else f"names node {name}, not serving"
            return Expired(f"the id {why}")
        node.routed += 1
        return Placed(node.report.name, node.report.url)

    def statistics(self) -> PlacementStatistics:
        placed = dict(self._placed_gone)
        placed.update({name: node.placed for name, node in self._nodes.items()})
        routed = {name: node.routed for name, node in self._nodes.items()}
        return PlacementStatistics(placed, self._refused_full, routed, self._expired)


def object_id_on(node: str, object_id: str) -> str:
    """A node's object id (``video_<hex>``) as the cluster hands it out: ``video_n<node>-<hex>``,
    so a later request that names it reaches its node without a lookup."""
    kind, sep, rest = object_id.partition("_")
    return f"{kind}{sep}n{node}-{rest}" if sep else f"n{node}-{object_id}"


def node_of_object(object_id: str) -> str | None:
    """The node an id names: a session id (``duplex-n<node>-...``) or an object id made by
    ``object_id_on``; ``None`` for any other string."""
    if object_id.startswith("duplex-"):
        return node_of(object_id)
    _, sep, rest = object_id.partition("_")
    tail = rest if sep else object_id
    name, dash, token = tail.partition("-")
    if not (dash and token and name.startswith("n") and 2 <= len(name) <= 17):
        return None
    node = name[1:]
    return node if node.isascii() and node.isalnum() and node == node.lower() else None


def node_object_id(object_id: str) -> str:
    """What the node itself calls an object that ``object_id_on`` named (the id unwrapped)."""
    kind, sep, rest = object_id.partition("_")
    tail = rest if sep else object_id
    _, _, token = tail.partition("-")
    return f"{kind}{sep}{token}" if sep else token
