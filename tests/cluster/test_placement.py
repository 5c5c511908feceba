"""The cluster's placement and routing: decided on numbers (hypothesis for its rules)."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from duplex.cluster import (
    Expired,
    Full,
    NodeReport,
    NodeState,
    Placed,
    Placement,
    node_object_id,
    node_of_object,
    object_id_on,
)
from duplex.cluster._placement import PENDING_REPORTS
from duplex.sessions import new_session_id, node_of, shard_of

SERVING = NodeState.SERVING


def report(
    name: str, live: int = 0, capacity: int = 10, *, seq: int = 1, **kw: object
) -> NodeReport:
    return NodeReport(
        name, f"http://{name}", kw.pop("state", SERVING), live, capacity, seq=seq, **kw
    )  # type: ignore[arg-type]


# -- ids -----------------------------------------------------------------------


@given(
    st.from_regex(r"[a-z0-9]{1,16}", fullmatch=True),
    st.none() | st.integers(0, 63),
    st.binary(min_size=16, max_size=16),
)
def test_a_session_id_names_its_node_and_its_shard(
    node: str, shard: int | None, raw: bytes
) -> None:
    made = new_session_id(lambda n: raw, shard, node)
    assert node_of(made) == node_of_object(made) == node
    assert shard_of(made) == shard
    assert made.endswith(raw.hex())


def test_ids_without_a_node_name_none() -> None:
    texts = ["duplex-" + os.urandom(16).hex(), "duplex-s1-" + "0" * 32, "", "duplex-n"]
    texts += ["duplex-nA1-x", "video_abc", "video_nabc", "xduplex-na1-abc"]
    texts += ["video_n" + "a" * 17 + "-x"]
    for text in texts:
        assert node_of_object(text) is None, text


@given(
    st.from_regex(r"[a-z0-9]{1,16}", fullmatch=True), st.from_regex(r"[0-9a-f]{24}", fullmatch=True)
)
def test_a_video_id_is_named_for_its_node_and_unwrapped_for_it(node: str, token: str) -> None:
    theirs = f"video_{token}"
    ours = object_id_on(node, theirs)
    assert ours.startswith("video_") and node_of_object(ours) == node
    assert node_object_id(ours) == theirs


# -- placement -----------------------------------------------------------------


def test_a_new_session_goes_to_the_most_room_then_the_lower_step_load() -> None:
    placement = Placement()
    placement.update([report("a", 5, 10), report("b", 2, 10), report("c", 2, 4)])
    assert placement.place() == Placed("b", "http://b")  # 80% free
    # room is the share of its capacity free: nodes of any size fill alike
    placement.update([report("a", 50, 100, seq=2), report("c", 1, 4, seq=2)])
    assert placement.place() == Placed("c", "http://c")  # 75% free beats 50% (50 slots)
    placement.update([report("a", 0, 10, step_load=0.9), report("b", 0, 10, step_load=0.2)])
    assert placement.place() == Placed("b", "http://b")


def test_ingress_copies_break_ties_each_their_own_way() -> None:
    table = [report(name, 0, 10) for name in "abcdefgh"]
    firsts = set()
    for salt in range(1, 40):
        placement = Placement(salt=salt)
        placement.update(table)
        first = placement.place()
        assert isinstance(first, Placed)
        firsts.add(first.node)
    assert len(firsts) > 3  # copies that saw one report do not all pick one node


def test_placements_between_reports_are_counted_until_a_report_shows_them() -> None:
    placement = Placement()
    placement.update([report("a", 0, 2), report("b", 0, 2)])
    got = [placement.place() for _ in range(5)]
    assert [p.node for p in got if isinstance(p, Placed)] == ["a", "b", "a", "b"]
    assert isinstance(got[4], Full)
    # a report that shows one of a's sessions frees nothing: it is the one placed
    placement.update([report("a", 1, 2, seq=2), report("b", 0, 2)])
    assert placement.room("a") == 0 and placement.room("b") == 0
    # placements no report ever shows stop counting after PENDING_REPORTS reports
    placement.update(
        [report("a", 1, 2, seq=1 + PENDING_REPORTS), report("b", 0, 2, seq=1 + PENDING_REPORTS)]
    )
    assert placement.room("a") == 1 and placement.room("b") == 2


def test_a_full_cluster_refuses_and_room_that_comes_back_is_used() -> None:
    placement = Placement()
    placement.update([report("a", 3, 3), report("b", 3, 3)])
    assert isinstance(placement.place(), Full)
    assert placement.statistics().refused_full == 1
    placement.update([report("a", 2, 3, seq=2), report("b", 3, 3, seq=2)])
    assert placement.place() == Placed("a", "http://a")


def test_only_serving_nodes_take_new_sessions_and_draining_ones_keep_their_own() -> None:
    placement = Placement()
    placement.update(
        [report("a", 0, 9, state=NodeState.DRAINING), report("b", 0, 9, state=NodeState.STARTING)]
    )
    assert isinstance(placement.place(), Full)
    sid = new_session_id(os.urandom, None, "a")
    assert placement.route(sid) == Placed("a", "http://a")
    assert isinstance(placement.route(new_session_id(os.urandom, None, "b")), Expired)


def test_a_resume_of_a_gone_or_unknown_node_expires() -> None:
    placement = Placement()
    placement.update([report("a"), report("b", state=NodeState.GONE)])
    assert isinstance(placement.route(new_session_id(os.urandom, None, "b")), Expired)
    assert isinstance(placement.route(new_session_id(os.urandom, None, "zz")), Expired)
    assert isinstance(placement.route(new_session_id(os.urandom)), Expired)  # no node in it
    placement.update([report("a")])  # b left the table: still expired, never elsewhere
    assert isinstance(placement.route(new_session_id(os.urandom, 1, "b")), Expired)
    assert placement.statistics().expired == 4


class PlacementMachine(RuleBasedStateMachine):
    """Nodes join, fill, report, drain and die in any order: a resume never lands on a node
    its id does not name, and no node is sent more sessions than its room."""

    def __init__(self) -> None:
        super().__init__()
        self.placement = Placement()
        self.nodes: dict[str, NodeReport] = {}
        self.owned: dict[str, str] = {}  # session id -> node that admitted it
        self.seq = 0

    def publish(self) -> None:
        self.seq += 1
        self.nodes = {
            n: NodeReport(r.name, r.url, r.state, r.live, r.capacity, seq=self.seq)
            for n, r in self.nodes.items()
        }
        self.placement.update(self.nodes.values())

    @rule(name=st.sampled_from(["a", "b", "c", "d"]), capacity=st.integers(0, 5))
    def join(self, name: str, capacity: int) -> None:
        if name not in self.nodes:
            self.nodes[name] = report(name, 0, capacity)
            self.publish()

    @rule()
    def new_session(self) -> None:
        decision = self.placement.place()
        if isinstance(decision, Placed):
            node = self.nodes[decision.node]
            assert node.state is SERVING and node.live < node.capacity
            if node.live < node.capacity:
                self.nodes[node.name] = NodeReport(
                    node.name, node.url, node.state, node.live + 1, node.capacity, seq=node.seq
                )
                self.owned[new_session_id(os.urandom, None, node.name)] = node.name
        else:
            free = [n for n in self.nodes.values() if n.state is SERVING and n.live < n.capacity]
            assert not free or any(self.placement.room(n.name) == 0 for n in free)

    @rule()
    def report_all(self) -> None:
        self.publish()

    @rule(
        name=st.sampled_from(["a", "b", "c", "d"]),
        state=st.sampled_from([NodeState.DRAINING, NodeState.GONE]),
    )
    def change(self, name: str, state: NodeState) -> None:
        if name in self.nodes:
            r = self.nodes[name]
            self.nodes[name] = NodeReport(name, r.url, state, r.live, r.capacity, seq=r.seq)
            self.publish()

    @invariant()
    def resumes_reach_their_owner_or_expire(self) -> None:
        for sid, owner in self.owned.items():
            decision = self.placement.route(sid)
            if isinstance(decision, Placed):
                assert decision.node == owner
            else:
                assert self.nodes[owner].state is NodeState.GONE


TestPlacementMachine = PlacementMachine.TestCase


def test_each_copy_places_only_its_share_of_a_node_between_reports() -> None:
    copies = [Placement(salt=n + 1, copies=4) for n in range(4)]
    table = [report("old", 8, 10), report("new", 0, 8)]  # "new" just joined: all free
    for placement in copies:
        placement.update(table)
    sent = [p.place() for p in copies for _ in range(3)]
    to_new = sum(isinstance(d, Placed) and d.node == "new" for d in sent)
    assert to_new <= 8  # 2 each (8 / 4 copies), never 4 copies x its whole room
    assert all(p.room("new") == 0 for p in copies)


def _best_by_walking(placement: Placement, exclude: frozenset[str]) -> str | None:
    """The rule `Placement.place` keeps in a heap, read off every node (the oracle)."""
    best, best_key = None, None
    for node in placement.nodes():
        room = placement.room(node.name)
        if room <= 0 or node.name in exclude:
            continue
        tie = placement._ties[node.name]
        key = (room / node.capacity, -node.step_load, -tie, [-ord(c) for c in node.name])
        if best_key is None or key > best_key:
            best, best_key = node.name, key
    return best


@given(
    st.lists(
        st.tuples(st.integers(0, 12), st.integers(1, 12), st.sampled_from([0.0, 0.3, 0.6])),
        min_size=1,
        max_size=12,
    ),
    st.integers(0, 3),
    st.integers(1, 3),
    st.lists(st.tuples(st.booleans(), st.sets(st.integers(0, 11), max_size=3)), max_size=40),
)
def test_the_heap_places_as_a_walk_over_every_node_would(
    nodes: list[tuple[int, int, float]],
    salt: int,
    copies: int,
    steps: list[tuple[bool, set[int]]],
) -> None:
    """Placements between two reports (the heap's only changes) pick, each time, the node a
    walk over every node picks: the most free share, then the lower load, the tie, the name."""
    names = [f"n{i:02d}" for i in range(len(nodes))]
    placement = Placement(salt=salt, copies=copies)
    placement.update(
        [
            report(name, min(live, cap), cap, step_load=load)
            for name, (live, cap, load) in zip(names, nodes, strict=True)
        ]
    )
    for count, excluded in steps:
        exclude = frozenset(names[i] for i in excluded if i < len(names))
        want = _best_by_walking(placement, exclude)
        got = placement.place(exclude=exclude, count=count)
        assert (got.node if isinstance(got, Placed) else None) == want
