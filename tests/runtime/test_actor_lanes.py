"""The session actor's mailbox: wire order on one lane, video on its own drop-oldest lane."""

from __future__ import annotations

import numpy as np

from duplex.actors import Mailbox, Overflow
from duplex.runtime._actor import Detach, FromClient, LeaseTimer, SessionActor
from duplex.sessions import AudioAppend, AudioCommit, SessionClose, SessionConfig, VideoAppend


def video(i: int) -> FromClient:
    return FromClient(1, VideoAppend(frame=b"\xff\xd8jpeg", frame_id=f"f{i}", pts_ms=40 * i))


def test_routes_keep_wire_order_and_split_video() -> None:
    audio = FromClient(1, AudioAppend(pcm=np.zeros(1920, np.float32)))
    for message in (audio, FromClient(1, AudioCommit()), FromClient(1, SessionClose()), Detach(1)):
        assert SessionActor.route(message) == "client"
    assert SessionActor.route(video(0)) == "video"
    assert SessionActor.route(LeaseTimer()) == "control"


def test_video_lane_is_sized_from_config_and_drops_oldest_counted() -> None:
    lanes = SessionActor.lanes_for(SessionConfig(video_lane_size=3))
    spec = {lane.name: lane for lane in lanes}["video"]
    assert spec.capacity == 3 and spec.overflow is Overflow.DROP_OLDEST
    dropped: list[object] = []
    box: Mailbox[FromClient] = Mailbox(lanes, on_drop=lambda lane, why, m: dropped.append(m))
    for i in range(5):
        box.put_nowait("video", video(i))
    kept = [box.get_nowait().event.frame_id for _ in range(3)]
    assert kept == ["f2", "f3", "f4"]
    assert [m.event.frame_id for m in dropped] == ["f0", "f1"]
    assert box.statistics().lane("video").dropped == 2
