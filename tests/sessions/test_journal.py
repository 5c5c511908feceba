from duplex.sessions import InputAudioCleared, Journal, Replay, ReplayGap
from duplex.sessions._journal import EXPIRY_BATCH_S


def _ev(i: int) -> InputAudioCleared:
    return InputAudioCleared(i)


def test_seq_starts_at_one_and_replays_in_order():
    j = Journal(ttl_s=60, max_bytes=1 << 20)
    assert [j.append(_ev(i), 0.0) for i in range(5)] == [1, 2, 3, 4, 5]
    replay = j.replay_after(2)
    assert isinstance(replay, Replay)
    assert [seq for seq, _ in replay.events] == [3, 4, 5]
    assert [e.epoch for _, e in replay.events] == [2, 3, 4]
    assert j.replay_after(5) == Replay(())


def test_ack_trims_and_acked_cursor_is_a_gap():
    j = Journal(ttl_s=60, max_bytes=1 << 20)
    for i in range(5):
        j.append(_ev(i), 0.0)
    j.ack(3)
    stats = j.statistics()
    assert (stats.entries, stats.first_seq, stats.trimmed_by_ack) == (2, 4, 3)
    assert [s for s, _ in j.replay_after(3).events] == [4, 5]
    assert j.replay_after(1) == ReplayGap("journal_gap")


def test_ttl_expiry_makes_a_gap_and_sets_the_deadline():
    j = Journal(ttl_s=10, max_bytes=1 << 20)
    j.append(_ev(0), 0.0)
    j.append(_ev(1), 5.0)
    assert j.next_deadline() == 10.0 + EXPIRY_BATCH_S
    j.expire(10.0)  # exact, whenever it runs
    assert j.statistics().expired == 1 and j.next_deadline() == 15.0 + EXPIRY_BATCH_S
    assert j.replay_after(0) == ReplayGap("journal_gap")
    assert [s for s, _ in j.replay_after(1).events] == [2]


def test_byte_bound_drops_oldest_as_overflow():
    j = Journal(ttl_s=60, max_bytes=1000)
    for i in range(20):
        j.append(_ev(i), 0.0)
    stats = j.statistics()
    assert stats.bytes <= 1000 and stats.overflowed > 0
    assert stats.last_seq == 20 and stats.peak_bytes > 1000
    assert j.replay_after(0) == ReplayGap("journal_overflow")
    assert isinstance(j.replay_after(stats.first_seq - 1), Replay)


def test_cursor_beyond_last_is_a_gap():
    j = Journal(ttl_s=60, max_bytes=1000)
    j.append(_ev(0), 0.0)
    assert j.replay_after(2) == ReplayGap("journal_gap")
