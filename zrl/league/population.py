"""The league's population and its rules: whom main plays next, when main is snapshot.

Members: the learning player ``"main"`` (its current weights), frozen snapshots of it named
``"main@<version>"`` (the weights version at snapshot time) and the config's fixed opponents.
Only games of main are recorded: the payoff and Elo rows are main's against each member.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from zrl.league.config import LeagueConfig
from zrl.league.elo import Elo
from zrl.league.payoff import Payoff, check_outcome
from zrl.league.pfsp import pfsp_weights

MAIN = "main"
"""The learning player; also the opponent name of a self-play game."""


def snapshot_id(version: int) -> str:
    """The member name of main's snapshot at weights ``version``."""
    return f"{MAIN}@{int(version)}"


def snapshot_version(name: str) -> int:
    """The weights version a snapshot's name (``snapshot_id``) records."""
    return int(name.rpartition("@")[2])


class League:
    """The population, its payoff and Elo, and the matchmaking and snapshot rules.

    ``choose_opponent`` draws with the league's own seeded generator; ``clock`` (seconds) times
    the snapshot interval, and a fake one makes the time rule testable. Pure logic: nothing
    here knows about weights, sockets or processes."""

    def __init__(
        self, cfg: LeagueConfig, seed: int = 0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cfg = cfg
        self._clock = clock
        self._rng = np.random.default_rng(seed)
        self.payoff = Payoff(cfg.payoff_decay)
        self.elo = Elo(cfg.elo_k, cfg.elo_initial)
        self._snapshots: list[str] = []
        self.games = 0
        self.self_play_games = 0
        self.dropped_games = 0
        self._mark = clock()
        self._elapsed_at_mark = 0.0

    # --- the population ---------------------------------------------------------------

    @property
    def snapshots(self) -> list[str]:
        """Snapshot ids, oldest first (a copy)."""
        return list(self._snapshots)

    @property
    def fixed_opponents(self) -> list[str]:
        return list(self.cfg.fixed_opponents)

    @property
    def pool(self) -> list[str]:
        """The frozen members PFSP picks from: the snapshots, then the fixed opponents."""
        return self._snapshots + self.cfg.fixed_opponents

    def forgotten(self) -> list[str]:
        """Snapshots main's win rate against is below ``forgotten_below``."""
        below = self.cfg.forgotten_below
        return [s for s in self._snapshots if self.payoff.win_rate(MAIN, s) < below]

    # --- matchmaking ---------------------------------------------------------------------

    def choose_opponent(self) -> str:
        """Main's next opponent: ``"main"`` with probability self_play, a fixed opponent
        (uniformly) with probability fixed_share, a forgotten snapshot (PFSP among them) with
        probability verification, otherwise PFSP over the pool; the
        verification share goes to the PFSP branch while nothing is forgotten. ``"main"``
        always while the pool is empty."""
        pool = self.pool
        if not pool:
            return MAIN
        u = self._rng.random()
        if u < self.cfg.self_play:
            return MAIN
        u -= self.cfg.self_play
        fixed = self.cfg.fixed_opponents
        if u < self.cfg.fixed_share and fixed:
            return fixed[int(self._rng.integers(len(fixed)))]
        u -= self.cfg.fixed_share
        if u < self.cfg.verification:
            forgotten = self.forgotten()
            if forgotten:
                return self._pfsp_pick(forgotten)
        return self._pfsp_pick(pool)

    def _pfsp_pick(self, candidates: list[str]) -> str:
        probs = pfsp_weights(self.payoff.win_rates(MAIN, candidates), self.cfg.weighting)
        return candidates[int(self._rng.choice(len(candidates), p=probs))]

    def record(self, opponent: str, outcome: int) -> bool:
        """A finished game of main against ``opponent``, outcome (+1 / 0 / -1) from main's side.

        A self-play game only counts (main against itself has no payoff or Elo). A game
        against a member no longer in the league (a snapshot evicted while the game ran) is
        dropped: counted in ``dropped_games``, and False is returned."""
        check_outcome(outcome)
        if opponent == MAIN:
            self.games += 1
            self.self_play_games += 1
            return True
        if opponent not in self.pool:
            self.dropped_games += 1
            return False
        self.payoff.record(MAIN, opponent, outcome)
        self.elo.record(MAIN, opponent, outcome)
        self.games += 1
        return True

    # --- snapshots -----------------------------------------------------------------------

    def main_win_rate(self) -> float:
        """Mean over the snapshots of main's win rate against each (0.5 with no snapshots,
        and for a snapshot without games); the fixed opponents are not part of it."""
        if not self._snapshots:
            return 0.5
        return float(np.mean(self.payoff.win_rates(MAIN, self._snapshots)))

    def since_snapshot_s(self) -> float:
        """Seconds since the last snapshot (or since the league started)."""
        return self._elapsed_at_mark + (self._clock() - self._mark)

    def snapshot_reason(self) -> str | None:
        """Why main should be snapshot now: ``"win_rate"`` (its mean win rate over the
        snapshots reached snapshot_win_rate, each with at least min_games games), ``"time"``
        (snapshot_interval_s passed), or None."""
        if self._snapshots and self._win_rate_reached():
            return "win_rate"
        if self.since_snapshot_s() >= self.cfg.snapshot_interval_s:
            return "time"
        return None

    def _win_rate_reached(self) -> bool:
        enough = all(self.payoff.games(MAIN, s) >= self.cfg.min_games for s in self._snapshots)
        return enough and self.main_win_rate() >= self.cfg.snapshot_win_rate

    def should_snapshot(self) -> bool:
        """Whether main should be snapshot now (see ``snapshot_reason``)."""
        return self.snapshot_reason() is not None

    def add_snapshot(self, version: int) -> str:
        """Freeze main at weights ``version``: returns the new member's id. The snapshot
        starts at main's Elo and without games; the interval clock restarts; beyond
        max_snapshots the oldest snapshot leaves, with its payoff and Elo. A version already
        snapshot (the weights did not move since) only restarts the clock."""
        name = snapshot_id(version)
        self._mark, self._elapsed_at_mark = self._clock(), 0.0
        if name in self._snapshots:
            return name
        self._snapshots.append(name)
        self.elo.set_rating(name, self.elo.rating(MAIN))
        while len(self._snapshots) > self.cfg.max_snapshots:
            self._evict(self._snapshots[0])
        return name

    def _evict(self, name: str) -> None:
        self._snapshots.remove(name)
        self.payoff.forget(name)
        self.elo.forget(name)

    # --- reporting and state ---------------------------------------------------------------

    def info(self) -> dict[str, float]:
        """Figures for the metrics: game counts, population, main's win rate and Elo ratings."""
        figures = {
            "games": float(self.games),
            "self_play_games": float(self.self_play_games),
            "dropped_games": float(self.dropped_games),
            "snapshots": float(len(self._snapshots)),
            "forgotten": float(len(self.forgotten())),
            "main_win_rate": self.main_win_rate(),
            "since_snapshot_s": self.since_snapshot_s(),
            "elo_main": self.elo.rating(MAIN),
        }
        for name in self.cfg.fixed_opponents:
            figures[f"elo_{name}"] = self.elo.rating(name)
        return figures

    def state_dict(self) -> dict[str, Any]:
        """Everything but the config, as JSON-able data (the generator's 128-bit integers as
        strings, so msgpack can carry them too)."""
        return {
            "payoff": self.payoff.state_dict(),
            "elo": self.elo.state_dict(),
            "snapshots": list(self._snapshots),
            "games": self.games,
            "self_play_games": self.self_play_games,
            "dropped_games": self.dropped_games,
            "since_snapshot_s": self.since_snapshot_s(),
            "rng": _rng_state_to_json(self._rng.bit_generator.state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``'s output; the interval clock goes on from where it was."""
        self.payoff.load_state_dict(state["payoff"])
        self.elo.load_state_dict(state["elo"])
        self._snapshots = [str(s) for s in state["snapshots"]]
        self.games = int(state["games"])
        self.self_play_games = int(state["self_play_games"])
        self.dropped_games = int(state["dropped_games"])
        self._mark, self._elapsed_at_mark = self._clock(), float(state["since_snapshot_s"])
        self._rng.bit_generator.state = _rng_state_from_json(state["rng"])


def _rng_state_to_json(state: Mapping[str, Any]) -> dict[str, Any]:
    inner = {key: str(value) for key, value in state["state"].items()}
    return {**state, "state": inner}


def _rng_state_from_json(state: Mapping[str, Any]) -> dict[str, Any]:
    inner = {key: int(value) for key, value in state["state"].items()}
    return {**state, "state": inner}


__all__ = ["MAIN", "League", "snapshot_id", "snapshot_version"]
