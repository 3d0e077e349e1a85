"""``CreditWindow``: exact acks, expiry as loss, late acks, and a ledger that adds up."""

from __future__ import annotations

from zrl.transport.credit import (
    INCARNATIONS_REMEMBERED,
    LATENCY_FACTOR,
    MAX_EXPIRED_REMEMBERED,
    MAX_PEERS,
    MAX_TIMEOUT_S,
    AckLatency,
    CreditWindow,
    Incarnations,
)


def balanced(w: CreditWindow) -> bool:
    led = w.ledger
    return led.sent == led.delivered + led.lost - led.late + w.in_flight


def test_an_ack_releases_exactly_the_message_it_names():
    w = CreditWindow(limit=3, timeout_s=10.0)
    for seq, steps in enumerate((5, 6, 7)):
        w.sent(seq, steps, now=0.0)
    assert w.full and w.in_flight == 3
    assert w.ack(2)  # a later ack does not release the earlier ones
    assert w.in_flight == 2 and not w.full
    assert not w.ack(2)  # duplicate
    assert not w.ack(9)  # never sent
    assert w.ledger.delivered == 1 and w.ledger.delivered_weight == 7
    assert balanced(w)


def test_expiry_counts_loss_and_a_late_ack_is_a_delivery():
    w = CreditWindow(limit=4, timeout_s=1.0)
    w.sent(0, 10, now=0.0)
    w.sent(1, 20, now=0.5)
    w.sent(2, 30, now=2.0)
    assert w.expire(now=1.0) == 1 and w.timeouts == 1
    assert w.expire(now=1.6) == 1 and w.timeouts == 2
    assert w.expire(now=2.5) == 0 and w.in_flight == 1
    assert (w.ledger.lost, w.ledger.lost_weight) == (2, 30)
    assert balanced(w)
    assert w.ack(1)  # the slow shard did insert it
    assert (w.ledger.late, w.ledger.late_weight, w.ledger.delivered) == (1, 20, 1)
    assert not w.ack(1)
    assert w.lose_all() == 1
    assert w.ledger.lost == 3 and w.in_flight == 0
    assert balanced(w)
    r = w.report()
    assert r["trajectories_sent"] == 3 and r["steps_sent"] == 60
    assert r["trajectories_lost"] - r["trajectories_late"] == 2


def test_a_slow_consumer_lengthens_the_timeout_and_is_not_taken_for_loss():
    """A loaded shard acks late but acks: after one late ack reveals how slow it is, the
    window waits three times that long before counting loss, so the producer does not run
    ahead of a consumer that is only slow."""
    w = CreditWindow(limit=2, timeout_s=10.0)
    w.sent(0, 1, now=0.0)
    assert w.expire(now=10.0) == 1  # the first slow ack still costs one timeout
    assert w.ack(0, now=25.0) and w.ledger.late == 1  # it came, 25 s after the send
    assert w.timeout_s == LATENCY_FACTOR * 25.0
    w.sent(1, 1, now=30.0)
    assert w.expire(now=30.0 + 70.0) == 0  # slow, not lost
    assert w.ack(1, now=100.0) and w.ledger.late == 1
    assert balanced(w)


def test_the_timeout_has_a_floor_and_a_cap_and_falls_with_the_load():
    latency = AckLatency(floor_s=10.0)
    assert latency.timeout_s == 10.0
    latency.observe(1.0)  # fast acks: the floor
    assert latency.timeout_s == 10.0
    latency.observe(1000.0)  # a consumer that slow is taken for gone all the same
    assert latency.timeout_s == MAX_TIMEOUT_S
    for _ in range(100):  # the load is gone: fast acks again
        latency.observe(0.1)
    assert latency.timeout_s == 10.0


def test_remembered_expired_messages_are_bounded():
    w = CreditWindow(limit=10**6, timeout_s=0.0)
    n = MAX_EXPIRED_REMEMBERED + 10
    for seq in range(n):
        w.sent(seq, 1, now=0.0)
    assert w.expire(now=1.0) == n
    assert not w.ack(0)  # forgotten: too old to be told apart from a forgery
    assert w.ack(n - 1)
    assert balanced(w)


def test_lose_before_counts_only_what_was_sent_before():
    w = CreditWindow(limit=5, timeout_s=10.0)
    for seq in range(5):
        w.sent(seq, seq + 1, now=0.0)
    assert w.ack(3)
    assert w.lose_before(3) == 3  # 0, 1, 2; 4 was sent after 3 and stays
    assert w.in_flight == 1 and (w.ledger.lost, w.ledger.lost_weight) == (3, 6)
    assert w.timeouts == 0  # a restart is no timeout
    assert w.ack(1) and w.ledger.late == 1  # it waited at another shard after all
    assert w.lose_before(None) == 1 and w.in_flight == 0
    assert balanced(w)


def test_incarnations_tell_a_restart_from_a_first_contact_and_a_straggler():
    seen = Incarnations()
    assert not seen.restarted("replay-0", 7)  # first heard of: nothing to compare with
    assert not seen.restarted("replay-0", 7)
    assert not seen.restarted("replay-1", 7)  # another shard, on its own
    assert seen.restarted("replay-0", 8)
    assert not seen.restarted("replay-0", 7)  # an ack of the old one still in transit
    assert not seen.restarted("replay-0", 8)
    for n in range(9, 9 + INCARNATIONS_REMEMBERED):
        assert seen.restarted("replay-0", n)
    assert seen.restarted("replay-0", 7)  # long forgotten: taken for a new one


def test_incarnations_remember_a_bounded_number_of_peers():
    seen = Incarnations()
    for i in range(MAX_PEERS + 1):
        seen.restarted(f"replay-{i}", 1)
    assert not seen.restarted("replay-0", 2)  # forgotten, the oldest: a first contact again
    assert seen.restarted(f"replay-{MAX_PEERS}", 2)
