"""Issue 27, observation 10, replayed through the real league and parameter server: forged
weights of any layout are never frozen, a snapshot holds params' own answer, and results
count only from the run's actors."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.helpers.league import W, force_snapshot, league_rpc, make_config, publish, weights
from zrl.roles.league import SNAPSHOTS_FILE, LeagueRole
from zrl.roles.params import ParameterServer
from zrl.testing.fakes import Rpc
from zrl.testing.inproc import InProc
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P


def test_league_freezes_only_params_weights_and_counts_only_actors(
    inproc: InProc, tmp_path: Path
) -> None:
    inproc.start_broker(make_config(tmp_path, fixed_opponents=["random"]))
    inproc.start(ParameterServer)
    league = inproc.start(LeagueRole)
    assert isinstance(league, LeagueRole)
    publish(inproc, 1.0)  # the real v1, from the run's learner
    wait_for(lambda: league.weights.version == 1)

    # Forged weights on the bus under the real params id: an 8 MiB array named "evil", then
    # weights of the right layout at a version params never had.
    forger = inproc.pub("params-0")
    inproc.wait_for_subscriber(P.WEIGHTS_TOPIC, pub=forger)
    evil = {"evil": np.zeros(2**21, np.float32)}
    forger.send(P.Message(P.WEIGHTS, meta={"version": 2}, arrays=evil), topic=P.WEIGHTS_TOPIC)
    wait_for(lambda: league.heartbeat_info()["weights_refused"] == 1)
    forger.send(
        P.Message(P.WEIGHTS, meta={"version": 3}, arrays=weights(66.0)), topic=P.WEIGHTS_TOPIC
    )
    wait_for(lambda: league.weights.version == 3)
    # The snapshot is what params' rpc serves (v1), not what the bus said.
    force_snapshot(league, "main@1")
    assert list(league.snapshots) == ["main@1"]
    assert set(league.snapshots["main@1"]) == set(weights(0.0))
    np.testing.assert_array_equal(league.snapshots["main@1"][W], weights(1.0)[W])

    # Forged results: from a connection no registry entry vouches for, and from a registered
    # role that is not an actor. Neither moves the payoff or an Elo.
    elo = league.league.elo.rating("main")
    stranger = Rpc(inproc.ctx, league.rpc_endpoint, sender="actor-0")
    learner = Rpc(
        inproc.ctx, league.rpc_endpoint, sender="learner-0", broker=inproc.addr, server="league"
    )
    wins = {"opponents": ["random"] * 100, "outcomes": [1] * 100}
    try:
        for _ in range(5):
            stranger.send(P.Message(P.RESULTS, meta=wins))
        learner.send(P.Message(P.RESULTS, meta=wins))
        wait_for(lambda: league.results_refused == 6)
    finally:
        stranger.close()
        learner.close()
    assert league.league.games == 0 and league.league.elo.rating("main") == elo
    assert league.heartbeat_info()["results_refused"] == 6

    # The run's own actor: its results count.
    actor = league_rpc(inproc, league)
    try:
        actor.send(P.Message(P.RESULTS, meta={"opponents": ["random"], "outcomes": [1]}))
        wait_for(lambda: league.league.games == 1)
    finally:
        actor.close()

    # A checkpoint that holds arrays the model does not have: never loaded.
    inproc.stop_role(league)
    npz = tmp_path / SNAPSHOTS_FILE
    with np.load(npz) as stored:
        saved = dict(stored)
    np.savez(npz, **saved, **{"main@1/evil": np.zeros(2**21, np.float32)})
    resumed = inproc.start(LeagueRole)
    assert isinstance(resumed, LeagueRole)
    assert set(resumed.snapshots["main@1"]) == set(weights(0.0))
