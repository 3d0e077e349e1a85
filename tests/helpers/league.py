"""The league role under test in-process: its config (tictactoe PPO), weights of a value, a
registered fake actor for ``LeagueClient``, publishing weights, forcing a snapshot, the league's
rpc. Shared by ``tests/roles/test_league*.py`` and ``test_hostile_league.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from zrl.config.experiment import ExperimentConfig
from zrl.roles.base import Role
from zrl.roles.league import LeagueRole
from zrl.roles.league_client import LeagueClient
from zrl.roles.params import ParameterServer
from zrl.testing.fakes import Rpc, model_weights
from zrl.testing.inproc import InProc
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P

FAST_BROKER = {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0}


def make_config(tmp: Path, **league: Any) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "league-test",
            "algo": "ppo",
            "seed": 5,
            "env": {"id": "pettingzoo/tictactoe_v3", "num_envs": 2},
            # One planned learner (its weights reach params) and actor (its results count).
            "roles": {"actors": 1, "replay": 0, "learners": 1, "evaluator": 0, "league": 1},
            "broker": FAST_BROKER,
            "league": {"snapshot_interval_s": 1e6, **league},
            "checkpoint": {"dir": str(tmp), "interval": 1e6},
        }
    )


def weights(value: float) -> dict[str, np.ndarray]:
    """Weights in the layout of the config's model (tictactoe's PPO), every value ``value``."""
    layout = model_weights(make_config(Path("unused")), 0)
    return {k: np.full(a.shape, value, a.dtype) for k, a in layout.items()}


W = "policy_head.weight"  # the parameter the tests compare


class FakeActor(Role):
    """A registered actor lending its context to a ``LeagueClient``, heartbeating its key."""

    role = "actor"

    def __init__(self, broker: str, ctx: Any, index: int = 0) -> None:
        super().__init__(broker, index=index, ctx=ctx, connect_timeout=10)
        self.client: LeagueClient | None = None
        self.connect()

    def heartbeat_info(self) -> dict[str, Any]:
        return self.client.heartbeat_info() if self.client is not None else {}


def publish(h: InProc, value: float) -> None:
    params = next(r for r, _, _ in h.roles if isinstance(r, ParameterServer))
    rpc = Rpc(h.ctx, params.rpc_endpoint, broker=h.addr)
    try:
        assert rpc.request(P.Message(P.WEIGHTS, arrays=weights(value))).kind == P.ACK
    finally:
        rpc.close()


def force_snapshot(league: LeagueRole, name: str) -> None:
    """Let the time rule fire once (interval 0) until ``name`` is frozen, then hold it off."""
    league.league.cfg = league.league.cfg.model_copy(update={"snapshot_interval_s": 0.0})
    wait_for(lambda: name in league.snapshots)
    league.league.cfg = league.league.cfg.model_copy(update={"snapshot_interval_s": 1e6})


def league_rpc(h: InProc, league: LeagueRole) -> Rpc:
    return Rpc(h.ctx, league.rpc_endpoint, sender="actor-0", broker=h.addr, server="league")
