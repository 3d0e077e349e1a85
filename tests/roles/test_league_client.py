"""``LeagueClient`` against a league it cannot hurry: a league that does not answer costs the
actor one wait of ``WAIT_S``, not one per episode (the episodes fall back to self-play at once
until it answers again), and a queued snapshot's weights are asked for before the episode that
meets it.

The league here is a bare ROUTER the test answers by hand (or not at all); the client's clock
is a stand-in that moves a little at each reading, so the time it spends waiting is counted,
not timed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from tests.helpers.league import FakeActor, W, make_config, weights
from zrl.roles import league_client
from zrl.roles.league_client import SELF, LeagueClient
from zrl.testing.inproc import InProc
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel, TransportStats, make_socket

ENDPOINT = "inproc://quiet-league"


class TickingClock:
    """``time`` for the client: each ``monotonic()`` reading moves it on by ``tick`` seconds,
    so a loop that waits until a deadline ends after a bounded number of readings."""

    def __init__(self, tick: float = 0.02) -> None:
        self.t = 0.0
        self.tick = tick

    def monotonic(self) -> float:
        self.t += self.tick
        return self.t


@pytest.fixture
def setup(zmq_ctx: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A registered actor's client whose LOOKUP "league" finds a ROUTER the test holds."""
    h = InProc(zmq_ctx, "league-client")
    h.start_broker(make_config(tmp_path))
    router = make_socket(h.ctx, zmq.ROUTER, server=True, rcvtimeo_ms=2000)
    router.bind(ENDPOINT)
    league = Channel(router, "league", "league-0", TransportStats(), envelope=True)
    actor = FakeActor(h.addr, h.ctx)
    monkeypatch.setattr(actor, "lookup", lambda *a, **kw: [{"id": "league-0", "rpc": ENDPOINT}])
    clock = TickingClock()
    monkeypatch.setattr(league_client, "time", clock)
    client = actor.client = LeagueClient(actor)
    try:
        yield client, league, clock
    finally:
        client.close()
        actor.close()
        league.close()
        h.close()


def requests(league: Channel) -> list[tuple[bytes, P.Message]]:
    """What the client sent the league so far."""
    out = []
    while (got := league.recv(block=False)) is not None:
        assert got[0] is not None
        out.append((got[0], got[1]))
    return out


def received(league: Channel, count: int) -> list[tuple[bytes, P.Message]]:
    """The client's next ``count`` requests, waited for."""
    out: list[tuple[bytes, P.Message]] = []
    wait_for(lambda: len(out.extend(requests(league)) or out) >= count)
    return out


def test_a_quiet_league_costs_one_wait_not_one_per_episode(setup: Any) -> None:
    client, league, clock = setup
    names = [client.choose() for _ in range(10)]
    assert names == [SELF] * 10
    assert client.fallbacks == 10
    # The first episode waited; the others fell back at once (ten waits: 10 * WAIT_S).
    assert clock.t < 3 * league_client.WAIT_S
    assert client.timeouts == 1
    [(first, match)] = requests(league)
    assert match.kind == P.MATCH  # still in flight: not asked again
    assert client.heartbeat_info()["league_timeouts"] == 1

    # Unanswered for RECONNECT_S: looked up again, asked again on a new connection, no wait.
    clock.t += league_client.RECONNECT_S
    assert client.choose() == SELF
    [(again, match)] = received(league, 1)
    assert match.kind == P.MATCH and again != first
    assert client.timeouts == 1 and client.fallbacks == 11


def test_an_answer_ends_the_quiet_and_queued_snapshots_are_fetched_ahead(setup: Any) -> None:
    client, league, _ = setup
    assert client.choose() == SELF
    assert client.quiet
    [(ident, match)] = requests(league)
    assert match.kind == P.MATCH
    league.send(P.Message(P.MATCHES, meta={"opponents": ["random", "main@1"]}), to=ident)

    wait_for(lambda: client._receive(wait_s=0.05) is not None)
    assert not client.quiet  # it answered: the next empty queue is waited for again
    assert client.choose() == "random"
    # The snapshot queued behind "random" was asked for before the episode that meets it.
    sent = received(league, 2)
    kinds = [(m.kind, m.meta.get("id")) for _, m in sent]
    assert kinds == [(P.GET_SNAPSHOT, "main@1"), (P.MATCH, None)]  # the queue ran low too
    arrays = weights(1.0)
    league.send(P.Message(P.WEIGHTS, meta={"id": "main@1", "version": 1}, arrays=arrays), to=ident)

    assert client.choose() == "main@1"
    np.testing.assert_array_equal(client.weights("main@1")[W], arrays[W])
    assert client.fallbacks == 1 and client.timeouts == 1
