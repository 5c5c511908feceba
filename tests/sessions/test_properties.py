"""Hypothesis: random event sequences never raise and keep the session invariants."""

from collections import defaultdict

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex.sessions import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    AudioDelta,
    Capabilities,
    ConnectionAttached,
    ConnectionDetached,
    EventAck,
    ModelFailed,
    ModelFrame,
    ModelReset,
    PlaybackAck,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    Send,
    SessionClose,
    SessionConfig,
    SessionCreated,
    SessionMachine,
    SessionOptions,
    SessionResume,
    SessionResumed,
    SessionState,
    SessionUpdate,
    SpeechStarted,
    SpeechStopped,
    Tick,
    TranscriptDelta,
    TurnSignal,
    VideoAppend,
)

from .sessionkit import counter_random

OUTPUT = (ResponseCreated, AudioDelta, TranscriptDelta)

steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 400), st.sampled_from([0.0, 0.001, 0.3])),
        st.tuples(
            st.just("frame"),
            st.booleans(),
            st.sampled_from(["", "a", "bc"]),
            st.booleans(),
            st.sampled_from([0, 0, 0, -1, 1]),
        ),
        st.tuples(st.just("speech"), st.booleans(), st.integers(0, 3000)),
        st.tuples(st.just("tick"), st.floats(0.0, 5.0)),
        st.tuples(st.just("resume"), st.booleans(), st.integers(-2, 50)),
        st.tuples(st.just("ack"), st.integers(0, 3), st.integers(0, 2000)),
        st.tuples(st.just("update"), st.sampled_from(["model", "barge_in_on_speech", "ignore"])),
        st.sampled_from(
            [
                ("commit",),
                ("clear",),
                ("signal",),
                ("rcreate",),
                ("rcancel",),
                ("eack",),
                ("detach",),
                ("failed",),
                ("video",),
                ("close",),
            ]
        ),
    ),
    max_size=60,
)


def same_event(a: object, b: object) -> bool:
    """The same event: a replay rebuilds it from the journal, equal field by field."""
    slots = type(a).__slots__  # type: ignore[attr-defined]
    return type(a) is type(b) and all(getattr(a, n) == getattr(b, n) for n in slots)


class Run:
    """Drives a machine and checks every effect list as it comes back."""

    def __init__(self, ack_only: bool) -> None:
        policy = "ack_only" if ack_only else "commit_all_on_done"
        config = SessionConfig(
            vad="external" if ack_only else "energy",
            playback_commit_policy=policy,
            journal_max_bytes=20_000,
            journal_ttl_s=10.0,
            idle_ttl_s=60.0,
            disconnect_grace_s=8.0,
            max_pending_input_bytes=200_000,
        )
        caps = Capabilities(supports_video_input=ack_only)
        self.m = SessionMachine(config, caps, random_bytes=counter_random())
        self.now = 0.0
        self.gen = 1
        self.token = ""
        self.last_seen = 0
        self.max_seq = 0
        self.responses: list[str] = []
        self.truth: list[object] = []
        self._append = self.m._journal.append
        self.m._journal.append = self._record  # type: ignore[method-assign]
        self.apply(ConnectionAttached(1))

    def _record(self, event, now):
        """Spy on the journal: the full truth of what the session said, in seq order."""
        seq = self._append(event, now)
        assert seq == len(self.truth) + 1, "journal seq must grow by one from 1"
        self.truth.append(event)
        if isinstance(event, OUTPUT):  # never old-epoch output
            assert event.epoch == self.m.epoch
        if isinstance(event, TranscriptDelta):  # ...and no frame of another epoch inside it
            assert event.delta.endswith(f"<{event.epoch}>")
        return seq

    def apply(self, event, generation=None):
        effects = self.m.handle(event, self.now, generation=generation)
        epoch, replaying, floor = None, False, 0
        for effect in effects:
            if isinstance(effect, ModelReset):
                assert epoch is None or effect.epoch == epoch + 1
                epoch = effect.epoch
            if not isinstance(effect, Send):
                continue
            ev, seq = effect.event, effect.seq
            if isinstance(ev, SessionCreated | SessionResumed):
                self.token = ev.resume_token
                replaying = isinstance(ev, SessionResumed)
            if seq is None:
                continue
            assert same_event(self.truth[seq - 1], ev), "a sent seq names exactly that event"
            assert seq > floor, "seqs go out in increasing order"
            floor = seq
            if not replaying:
                assert seq > self.max_seq
            self.max_seq = max(self.max_seq, seq)
            if isinstance(ev, ResponseCreated):
                self.responses.append(ev.response_id)
        self.last_seen = self.max_seq
        return effects

    def step(self, op: tuple) -> None:
        m, kind = self.m, op[0]
        if kind == "append":
            n = op[1] * 24
            pcm = (op[2] * np.sin(np.arange(n) * 0.3)).astype(np.float32)
            self.apply(AudioAppend(pcm))
        elif kind == "frame":
            pcm = np.full(1920, 0.1, np.float32)
            epoch = max(0, m.epoch + op[4])
            text = f"{op[2]}<{epoch}>" if op[2] else ""  # the text mark names its epoch
            self.apply(ModelFrame(epoch, pcm, text, op[1], op[3], consumed_input_samples=1920))
        elif kind == "speech":
            self.apply(SpeechStarted(float(op[2])) if op[1] else SpeechStopped(float(op[2])))
        elif kind == "tick":
            self.now += op[1]
            self.apply(Tick())
        elif kind == "resume":
            self.gen += 1
            token = self.token if op[1] else "not-the-token"
            cursor = max(0, self.last_seen + op[2]) if op[2] < 50 else 0
            self.apply(ConnectionAttached(self.gen, SessionResume(m.session_id, token, cursor)))
        elif kind == "ack" and self.responses:
            rid = self.responses[min(op[1], len(self.responses) - 1)]
            self.apply(PlaybackAck(rid, op[2], None, "pa"))
        elif kind == "update":
            self.apply(SessionUpdate(SessionOptions(overlap_policy=op[1])))
        elif kind == "eack":
            self.apply(EventAck(self.max_seq))
        elif kind == "detach":
            self.apply(ConnectionDetached(m.generation or 0))
        else:
            simple = {
                "commit": AudioCommit("c"),
                "clear": AudioClear("x"),
                "signal": TurnSignal(),
                "rcreate": ResponseCreate(),
                "rcancel": ResponseCancel(),
                "failed": ModelFailed(),
                "video": VideoAppend(b"\xff", "f", 1),
                "close": SessionClose(),
                "ack": Tick(),
            }
            self.apply(simple[kind])
        self.now += 0.01

    def check_stream(self) -> None:
        created: dict[str, int] = {}
        done: dict[str, ResponseDone] = {}
        text: dict[str, list[str]] = defaultdict(list)
        for ev in self.truth:
            if isinstance(ev, ResponseCreated):
                assert ev.response_id not in created
                created[ev.response_id] = ev.epoch
            elif isinstance(ev, AudioDelta | TranscriptDelta):
                assert ev.response_id in created and ev.response_id not in done
                assert ev.epoch == created[ev.response_id]
                if isinstance(ev, TranscriptDelta):
                    text[ev.response_id].append(ev.delta)
            elif isinstance(ev, ResponseDone):
                assert ev.response_id in created and ev.response_id not in done
                done[ev.response_id] = ev
                assert ev.transcript == "".join(text[ev.response_id])
        open_ids = set(created) - set(done)
        assert len(open_ids) <= 1
        if self.m.state is SessionState.CLOSED:
            assert not open_ids
        assert (self.m.active_response_id is None) == (not open_ids) or self.m.state is (
            SessionState.CLOSED
        )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=steps, ack_only=st.booleans())
def test_random_sequences_keep_invariants(ops, ack_only):
    run = Run(ack_only)
    for op in ops:
        run.step(op)
    run.check_stream()
    stats = run.m.statistics()
    assert stats.journal.last_seq == len(run.truth) >= run.max_seq
    assert stats.responses_done <= stats.responses_created <= stats.responses_done + 1
