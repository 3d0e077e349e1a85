"""The league's population and its rules: whom each learning player plays next, when it is
snapshot, and when it restarts (AlphaStar's main agent, main exploiters and league exploiters).

Members: the learning players (``"main"``, ``"main_exploiter_<i>"``, ``"league_exploiter_<j>"``,
at their current weights), frozen snapshots of them named ``"<player>@<version>"`` (the
player's weights version at snapshot time) and the config's fixed opponents. Only games of a
learning player are recorded: the payoff and Elo rows are a learning player's against each
member.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from zrl.config.league import LEAGUE_EXPLOITER, MAIN, MAIN_EXPLOITER, LeagueConfig, player_kind
from zrl.league.elo import Elo
from zrl.league.payoff import Payoff, check_outcome
from zrl.league.pfsp import pfsp_weights


def snapshot_id(version: int, player: str = MAIN) -> str:
    """The member name of ``player``'s snapshot at weights ``version``."""
    return f"{player}@{int(version)}"


def snapshot_version(name: str) -> int:
    """The weights version a snapshot's name (``snapshot_id``) records."""
    return int(name.rpartition("@")[2])


def snapshot_parent(name: str) -> str:
    """The learning player a snapshot's name (``snapshot_id``) froze."""
    return name.rpartition("@")[0]


class League:
    """The population, its payoff and Elo, and the matchmaking, snapshot and reset rules.

    Every draw (opponents, resets) comes from the league's own seeded generator; ``clock``
    (seconds) times the snapshot interval, and a fake one makes the time rule testable. Pure
    logic: nothing here knows about weights, sockets or processes."""

    def __init__(
        self, cfg: LeagueConfig, seed: int = 0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cfg = cfg
        self._clock = clock
        self._rng = np.random.default_rng(seed)
        self.payoff = Payoff(cfg.payoff_decay)
        self.elo = Elo(cfg.elo_k, cfg.elo_initial)
        self.players = cfg.players
        self._snapshots: list[str] = []
        self.games = 0
        self.self_play_games = 0
        self.dropped_games = 0
        now = clock()
        # Per learning player: when its snapshot interval started (and how much of it had
        # passed before a resume), its games since its last snapshot, and its resets.
        self._marks = {p: (now, 0.0) for p in self.players}
        self._since_snapshot = dict.fromkeys(self.players, 0)
        self.resets = dict.fromkeys(self.players, 0)
        self.player_games = dict.fromkeys(self.players, 0)  # self-play included

    # --- the population ---------------------------------------------------------------

    @property
    def snapshots(self) -> list[str]:
        """Snapshot ids of every learning player, oldest first (a copy)."""
        return list(self._snapshots)

    def snapshots_of(self, player: str) -> list[str]:
        """``player``'s snapshots, oldest first."""
        return [s for s in self._snapshots if snapshot_parent(s) == player]

    @property
    def fixed_opponents(self) -> list[str]:
        return list(self.cfg.fixed_opponents)

    @property
    def pool(self) -> list[str]:
        """The frozen members PFSP picks from: the snapshots, then the fixed opponents."""
        return self._snapshots + self.cfg.fixed_opponents

    def forgotten(self) -> list[str]:
        """Main's snapshots main's win rate against is below ``forgotten_below``."""
        below = self.cfg.forgotten_below
        return [s for s in self.snapshots_of(MAIN) if self.payoff.win_rate(MAIN, s) < below]

    def exploited(self) -> list[str]:
        """Main exploiters' snapshots main's win rate against is below ``forgotten_below``:
        weaknesses of main that an exploiter found and main has not fixed yet."""
        below = self.cfg.forgotten_below
        return [
            s
            for s in self._snapshots
            if player_kind(snapshot_parent(s)) == MAIN_EXPLOITER
            and self.payoff.win_rate(MAIN, s) < below
        ]

    def _check_player(self, player: str) -> None:
        if player not in self._marks:
            raise ValueError(f"{player!r} is not a learning player of this league {self.players}")

    # --- matchmaking ---------------------------------------------------------------------

    def choose_opponent(self, player: str = MAIN) -> str:
        """``player``'s next opponent, by its kind's rule (``_main_opponent``,
        ``_main_exploiter_opponent``, ``_league_exploiter_opponent``). A learning player's
        own name means self-play."""
        self._check_player(player)
        kind = player_kind(player)
        if kind == MAIN_EXPLOITER:
            return self._main_exploiter_opponent(player)
        if kind == LEAGUE_EXPLOITER:
            return self._league_exploiter_opponent(player)
        return self._main_opponent()

    def _main_opponent(self) -> str:
        """Main's next opponent: ``"main"`` with probability self_play, a fixed opponent
        (uniformly) with probability fixed_share, with probability verification a main
        exploiter's snapshot main does not beat (PFSP among them) or else a forgotten snapshot
        of main, otherwise PFSP over the pool (every snapshot, the exploiters' included, and
        the fixed opponents); the verification share goes to the PFSP branch while nothing is
        exploited or forgotten. ``"main"`` always while the pool is empty."""
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
            candidates = self.exploited() or self.forgotten()
            if candidates:
                return self._pfsp_pick(MAIN, candidates, self.cfg.weighting)
        return self._pfsp_pick(MAIN, pool, self.cfg.weighting)

    def _main_exploiter_opponent(self, player: str) -> str:
        """The main agent at its current weights while ``player`` beats it more than
        exploiter_min_win_rate (0.5 before any game), else one of main's snapshots, PFSP by
        variance (the ones it is closest to beating first); main itself when it has none."""
        if self.payoff.win_rate(player, MAIN) > self.cfg.exploiter_min_win_rate:
            return MAIN
        history = self.snapshots_of(MAIN)
        return self._pfsp_pick(player, history, "variance") if history else MAIN

    def _league_exploiter_opponent(self, player: str) -> str:
        """PFSP over the pool (every snapshot and fixed player); the main agent at its current
        weights while the pool is empty."""
        pool = self.pool
        return self._pfsp_pick(player, pool, self.cfg.weighting) if pool else MAIN

    def _pfsp_pick(self, player: str, candidates: list[str], weighting: str) -> str:
        probs = pfsp_weights(self.payoff.win_rates(player, candidates), weighting)
        return candidates[int(self._rng.choice(len(candidates), p=probs))]

    def record(self, opponent: str, outcome: int, player: str = MAIN) -> bool:
        """A finished game of ``player`` against ``opponent``, outcome (+1 / 0 / -1) from
        player's side.

        A self-play game only counts (a player against itself has no payoff or Elo). A game
        against a member no longer in the league (a snapshot evicted while the game ran) is
        dropped: counted in ``dropped_games``, and False is returned."""
        check_outcome(outcome)
        self._check_player(player)
        if opponent == player:
            self.player_games[player] += 1
            self.games += 1
            self.self_play_games += 1
            return True
        if opponent not in self.pool and opponent not in self._marks:
            self.dropped_games += 1
            return False
        self.payoff.record(player, opponent, outcome)
        self.elo.record(player, opponent, outcome)
        self.games += 1
        self.player_games[player] += 1
        self._since_snapshot[player] += 1
        return True

    # --- snapshots and resets --------------------------------------------------------------

    def win_rate(self, player: str = MAIN) -> float:
        """The win rate ``player``'s snapshot rule looks at: main's mean over its own
        snapshots, a main exploiter's against main's current weights, a league exploiter's mean
        over the pool (0.5 for a member without games, and with nothing to average)."""
        self._check_player(player)
        kind = player_kind(player)
        if kind == MAIN_EXPLOITER:
            return self.payoff.win_rate(player, MAIN)
        against = self.snapshots_of(MAIN) if kind == MAIN else self.pool
        if not against:
            return 0.5
        return float(np.mean(self.payoff.win_rates(player, against)))

    def main_win_rate(self) -> float:
        """Main's mean win rate over its snapshots (0.5 with none, and for a snapshot
        without games); the fixed opponents and the exploiters are not part of it."""
        return self.win_rate(MAIN)

    def since_snapshot_s(self, player: str = MAIN) -> float:
        """Seconds since ``player``'s last snapshot (or since the league started)."""
        mark, elapsed = self._marks[player]
        return elapsed + (self._clock() - mark)

    def snapshot_reason(self, player: str = MAIN) -> str | None:
        """Why ``player`` should be snapshot now: ``"win_rate"`` (its ``win_rate`` reached
        snapshot_win_rate, on enough games), ``"time"`` (snapshot_interval_s passed), or None.

        Enough games: for main, min_games against each of its snapshots (it has some); for an
        exploiter, min_games since its last snapshot (its win rate then is about the weights it
        has now, not those before a reset)."""
        self._check_player(player)
        if self._win_rate_reached(player):
            return "win_rate"
        if self.since_snapshot_s(player) >= self.cfg.snapshot_interval_s:
            return "time"
        return None

    def _win_rate_reached(self, player: str) -> bool:
        if player == MAIN:
            history = self.snapshots_of(MAIN)
            if not history:
                return False
            enough = all(self.payoff.games(MAIN, s) >= self.cfg.min_games for s in history)
        else:
            enough = self._since_snapshot[player] >= self.cfg.min_games
        return enough and self.win_rate(player) >= self.cfg.snapshot_win_rate

    def add_snapshot(self, version: int, player: str = MAIN) -> str:
        """Freeze ``player`` at weights ``version``: returns the new member's id. The snapshot
        starts at the player's Elo and without games; the player's interval clock and games
        count restart; beyond max_snapshots of the player its oldest snapshot leaves, with its
        payoff and Elo. A version already snapshot (the weights did not move since) only
        restarts the clock."""
        self._check_player(player)
        name = snapshot_id(version, player)
        self._marks[player] = (self._clock(), 0.0)
        self._since_snapshot[player] = 0
        if name in self._snapshots:
            return name
        self._snapshots.append(name)
        self.elo.set_rating(name, self.elo.rating(player))
        history = self.snapshots_of(player)
        for oldest in history[: max(0, len(history) - self.cfg.max_snapshots)]:
            self._evict(oldest)
        return name

    def reset_after_snapshot(self, player: str) -> bool:
        """Whether ``player`` restarts from its initial weights after the snapshot just taken
        (AlphaStar): a main exploiter always, a league exploiter with probability
        league_exploiter_reset, the main agent never. A reset is counted in ``resets``, and
        the player's payoff and Elo start again: they were about weights that are gone."""
        kind = player_kind(player)
        if kind == MAIN:
            return False
        if kind == LEAGUE_EXPLOITER and self._rng.random() >= self.cfg.league_exploiter_reset:
            return False
        self.resets[player] += 1
        self.payoff.forget(player)
        self.elo.forget(player)
        self._since_snapshot[player] = 0
        return True

    def _evict(self, name: str) -> None:
        self._snapshots.remove(name)
        self.payoff.forget(name)
        self.elo.forget(name)

    # --- reporting and state ---------------------------------------------------------------

    def info(self) -> dict[str, float]:
        """Figures for the metrics: game counts, population, main's win rate and Elo ratings,
        and each exploiter's win rate, Elo, snapshots and resets."""
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
        for player in self.players[1:]:
            figures[f"{player}_win_rate"] = self.win_rate(player)
            figures[f"elo_{player}"] = self.elo.rating(player)
            figures[f"{player}_snapshots"] = float(len(self.snapshots_of(player)))
            figures[f"{player}_resets"] = float(self.resets[player])
            figures[f"{player}_games"] = float(self.player_games[player])
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
            "players": {
                p: {
                    "since_snapshot_s": self.since_snapshot_s(p),
                    "games_since_snapshot": self._since_snapshot[p],
                    "resets": self.resets[p],
                    "games": self.player_games[p],
                }
                for p in self.players
            },
            "rng": _rng_state_to_json(self._rng.bit_generator.state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``'s output; the interval clocks go on from where they
        were. A player the state does not know (exploiters added since) starts afresh, and
        the snapshots of a player the config no longer has are kept as frozen members."""
        self.payoff.load_state_dict(state["payoff"])
        self.elo.load_state_dict(state["elo"])
        self._snapshots = [str(s) for s in state["snapshots"]]
        self.games = int(state["games"])
        self.self_play_games = int(state["self_play_games"])
        self.dropped_games = int(state["dropped_games"])
        now = self._clock()
        players = state.get("players", {MAIN: {"since_snapshot_s": state["since_snapshot_s"]}})
        for player, saved in players.items():
            if player in self._marks:
                self._marks[player] = (now, float(saved["since_snapshot_s"]))
                self._since_snapshot[player] = int(saved.get("games_since_snapshot", 0))
                self.resets[player] = int(saved.get("resets", 0))
                self.player_games[player] = int(saved.get("games", 0))
        self._rng.bit_generator.state = _rng_state_from_json(state["rng"])


def _rng_state_to_json(state: Mapping[str, Any]) -> dict[str, Any]:
    inner = {key: str(value) for key, value in state["state"].items()}
    return {**state, "state": inner}


def _rng_state_from_json(state: Mapping[str, Any]) -> dict[str, Any]:
    inner = {key: int(value) for key, value in state["state"].items()}
    return {**state, "state": inner}


__all__ = ["MAIN", "League", "snapshot_id", "snapshot_parent", "snapshot_version"]
