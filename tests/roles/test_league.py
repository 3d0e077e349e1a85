"""The league role and its client, in-process: matchmaking over the rpc, results into the
payoff, snapshots of the published weights served by id, malformed requests dropped, and the
checkpoint a restarted league resumes from.

Every role runs in a thread over ``inproc://`` (``zrl.testing.inproc.InProc``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.helpers.league import (
    FakeActor,
    W,
    force_snapshot,
    league_rpc,
    make_config,
    publish,
    weights,
)
from zrl.roles.league import LeagueRole
from zrl.roles.league_client import SELF, LeagueClient
from zrl.roles.params import ParameterServer
from zrl.testing.inproc import InProc
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P


def test_matches_results_and_snapshots_served_by_id(inproc: InProc, tmp_path: Path) -> None:
    """MATCH is answered from the population; RESULTS reach the payoff; a snapshot freezes the
    weights published at the time and is served by its id, later weights notwithstanding."""
    inproc.start_broker(make_config(tmp_path, fixed_opponents=["random"], self_play=0.0))
    inproc.start(ParameterServer)
    league = inproc.start(LeagueRole)
    assert isinstance(league, LeagueRole)
    rpc = league_rpc(inproc, league)
    try:
        answer = rpc.request(P.Message(P.MATCH, meta={"count": 20}))
        assert answer.kind == P.MATCHES and answer.meta["opponents"] == ["random"] * 20

        publish(inproc, 1.0)
        wait_for(lambda: league.weights.version == 1)
        force_snapshot(league, "main@1")
        publish(inproc, 2.0)
        wait_for(lambda: league.weights.version == 2)

        served = rpc.request(P.Message(P.GET_SNAPSHOT, meta={"id": "main@1"}))
        assert served.kind == P.WEIGHTS and served.meta == {"id": "main@1", "version": 1}
        np.testing.assert_array_equal(served.arrays[W], weights(1.0)[W])
        missing = rpc.request(P.Message(P.GET_SNAPSHOT, meta={"id": "main@99"}))
        assert missing.kind == P.NO_WEIGHTS

        rpc.send(
            P.Message(
                P.RESULTS, meta={"opponents": ["main@1", "random", "main"], "outcomes": [1, -1, 0]}
            )
        )
        wait_for(lambda: league.league.games == 3)
        assert league.league.payoff.counts("main", "main@1") == (1, 0, 0)
        assert league.league.payoff.counts("main", "random") == (0, 0, 1)
        assert league.league.self_play_games == 1
    finally:
        rpc.close()


MALFORMED = [
    P.Message(P.MATCH, meta={"count": 0}),
    P.Message(P.MATCH, meta={"count": True}),
    P.Message(P.RESULTS, meta={"opponents": ["random"], "outcomes": [2]}),
    P.Message(P.RESULTS, meta={"opponents": ["random", "x"], "outcomes": [1]}),
    P.Message(P.GET_SNAPSHOT, meta={"id": "x" * 500}),
    P.Message(P.GET_WEIGHTS),
]
"""Requests a league must drop: a count of 0 or a bool, an outcome of 2, lists of different
lengths, an over-long id, a kind it does not serve."""


def test_malformed_requests_are_dropped_and_counted(inproc: InProc, tmp_path: Path) -> None:
    """Each malformed request is dropped and counted on the rpc channel; the league goes on
    answering and counts no game."""
    inproc.start_broker(make_config(tmp_path))
    league = inproc.start(LeagueRole)
    assert isinstance(league, LeagueRole)
    rpc = league_rpc(inproc, league)
    try:
        for n, msg in enumerate(MALFORMED, start=1):
            rpc.send(msg)
            wait_for(lambda n=n: league.stats.snapshot().get("rpc", {}).get("dropped", 0) >= n)
            answer = rpc.request(P.Message(P.MATCH, meta={"count": 1}))
            assert answer.kind == P.MATCHES, msg.kind
        assert league.league.games == 0
        assert inproc.alive(league)
    finally:
        rpc.close()


def test_checkpoint_resumes_payoff_elo_and_snapshots(inproc: InProc, tmp_path: Path) -> None:
    """A league restarted on the same checkpoint directory has the same payoff, Elo ratings,
    counters and snapshot weights."""
    inproc.start_broker(make_config(tmp_path, fixed_opponents=["random"]))
    inproc.start(ParameterServer)
    league = inproc.start(LeagueRole)
    assert isinstance(league, LeagueRole)
    publish(inproc, 3.0)
    wait_for(lambda: league.weights.version == 1)
    force_snapshot(league, "main@1")
    rpc = league_rpc(inproc, league)
    try:
        rpc.send(
            P.Message(
                P.RESULTS,
                meta={"opponents": ["main@1"] * 3 + ["random"], "outcomes": [1, 1, 0, -1]},
            )
        )
        wait_for(lambda: league.league.games == 4)
    finally:
        rpc.close()
    state = league.league.state_dict()
    inproc.stop_role(league)

    resumed = inproc.start(LeagueRole)
    assert isinstance(resumed, LeagueRole)
    assert resumed.league.payoff.state_dict() == state["payoff"]
    assert resumed.league.elo.state_dict() == state["elo"]
    assert resumed.league.games == 4 and resumed.league.snapshots == ["main@1"]
    np.testing.assert_array_equal(resumed.snapshots["main@1"][W], weights(3.0)[W])
    assert resumed.versions == {"main@1": 1}


def test_client_chooses_reports_and_fetches_snapshots(inproc: InProc, tmp_path: Path) -> None:
    """The actor's client: opponents from the league ("main" played as the current weights),
    results flushed into the payoff, a snapshot's weights fetched once and kept."""
    inproc.start_broker(make_config(tmp_path, fixed_opponents=["random"], self_play=0.5))
    inproc.start(ParameterServer)
    league = inproc.start(LeagueRole)
    assert isinstance(league, LeagueRole)
    publish(inproc, 4.0)
    wait_for(lambda: league.weights.version == 1)
    force_snapshot(league, "main@1")

    actor = FakeActor(inproc.addr, inproc.ctx)
    client = actor.client = LeagueClient(actor)
    try:
        names = [client.choose() for _ in range(200)]
        assert set(names) <= {SELF, "random", "main@1"} and {SELF, "random", "main@1"} <= set(names)
        assert client.fallbacks == 0
        np.testing.assert_array_equal(client.weights("main@1")[W], weights(4.0)[W])
        for name in names[:50]:
            client.finished(name, 1)
        client._flush(force=True)
        wait_for(lambda: league.league.games == 50)
        assert league.league.self_play_games == names[:50].count(SELF)
    finally:
        client.close()
        actor.close()


def test_client_plays_self_when_no_league_answers(inproc: InProc, tmp_path: Path) -> None:
    """Without a league role the client falls back to self-play (counted), never blocks for
    longer than its wait."""
    inproc.start_broker(make_config(tmp_path))
    params = inproc.start(ParameterServer)
    client = LeagueClient(params)
    try:
        assert client.choose() == SELF
        assert client.fallbacks == 1
    finally:
        client.close()
