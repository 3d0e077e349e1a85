"""The ``league:`` section of an experiment config (self-play league, as in AlphaStar).

Pydantic only (no torch, no numpy): ``zrl.config.experiment`` may import it, and the CLI stays fast.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from zrl.config.base import Section
from zrl.config.multiagent import REFERENCE_PLAYERS

MAIN = "main"
"""The main agent: the learning player every run has (the default weights stream)."""
MAIN_EXPLOITER = "main_exploiter"
LEAGUE_EXPLOITER = "league_exploiter"
KINDS = (MAIN, MAIN_EXPLOITER, LEAGUE_EXPLOITER)
"""The kinds of learning player (AlphaStar): the main agent, main exploiters (they hunt the
main agent's weaknesses) and league exploiters (they hunt the whole population's)."""

RESERVED_NAMES = ("main", "self")
"""Names the league and actors give themselves: the learning players are ``main``,
``main_exploiter_<i>`` and ``league_exploiter_<j>``, snapshots ``<player>@<version>``."""


class LeagueConfig(Section):
    """A self-play league: the learning players (the main agent, optionally main and league
    exploiters), frozen snapshots of them, and fixed opponents. Each main-agent episode's
    opponent is drawn from three branches: self-play (the learning policy's current weights),
    verification (snapshots that main has "forgotten" how to beat) and prioritized fictitious
    self-play (PFSP) over all snapshots and fixed opponents, weighted by main's win rate against
    each (Vinyals et al. 2019)."""

    self_play: float = Field(0.35, ge=0, le=1)
    """Share of episodes against the learning policy's current weights."""
    verification: float = Field(0.15, ge=0, le=1)
    """Share of episodes against forgotten snapshots (main's win rate against them is below
    forgotten_below), PFSP-weighted among them; the PFSP branch over the whole pool when none
    is forgotten. The rest, 1 - self_play - verification, is PFSP over the whole pool."""
    fixed_share: float = Field(0.0, ge=0, le=1)
    """Share of episodes against a fixed opponent drawn uniformly (an anchor: the learning
    policy keeps meeting the fixed players however well PFSP says it beats them); they also
    stay in the PFSP pool."""
    forgotten_below: float = Field(0.3, ge=0, le=1)
    """A snapshot is forgotten while main's win rate against it is below this."""
    weighting: Literal["squared", "variance", "linear", "uniform"] = "squared"
    """PFSP weight of an opponent given main's win rate p against it: squared (1-p)^2 (the
    hardest first), variance p(1-p) (the closest matches first), linear 1-p, uniform 1."""
    payoff_decay: float = Field(0.99, gt=0, le=1)
    """Each result of a pair first multiplies that pair's counts by this, so win rates follow a
    learning player (1: every game counts forever)."""
    snapshot_win_rate: float = Field(0.7, ge=0, le=1)
    """Snapshot main once its mean win rate over the snapshots reaches this, every snapshot
    having at least min_games games against it."""
    min_games: int = Field(20, ge=1)
    """Games (decayed) main needs against every snapshot before the win-rate rule counts."""
    snapshot_interval_s: float = Field(120.0, gt=0)
    """Or snapshot main once this long has passed since the last snapshot."""
    max_snapshots: int = Field(50, ge=1)
    """Beyond this many snapshots of one learning player its oldest is dropped (never the
    newest), with its payoff and Elo. Per player, so exploiters that snapshot and reset
    often never push the main agent's history out."""
    main_exploiters: int = Field(0, ge=0, le=16)
    """Main exploiters, each a learning player with its own learner and weights stream
    (``main_exploiter_<i>``): they play the main agent (its snapshots, PFSP-weighted by
    variance, while they beat it less than exploiter_min_win_rate), snapshot on the rules
    above against the main agent and then restart from their initial weights."""
    league_exploiters: int = Field(0, ge=0, le=16)
    """League exploiters (``league_exploiter_<j>``): PFSP over every snapshot and fixed
    player; they snapshot on the rules above against those, and restart from their initial
    weights with probability league_exploiter_reset after each snapshot."""
    exploiter_min_win_rate: float = Field(0.1, ge=0, le=1)
    """A main exploiter plays the main agent's current weights while its win rate against
    them is above this (AlphaStar 0.1), else the main agent's snapshots."""
    league_exploiter_reset: float = Field(0.25, ge=0, le=1)
    """Chance that a league exploiter restarts from its initial weights after a snapshot
    (AlphaStar 0.25)."""
    elo_k: float = Field(16.0, ge=0)
    """Elo K factor: the most one game moves a rating."""
    elo_initial: float = 1000.0
    """Elo rating of a new member; a snapshot starts from main's rating at snapshot time."""
    fixed_opponents: list[str] = ["random"]
    """Non-learning opponents (``random``, ``scripted``, the search players ``perfect``,
    ``alphabeta2``, ``alphabeta4``, and ``best_response``: the best response to the player's own
    current greedy policy, tic-tac-toe): members of the pool like snapshots (PFSP picks them
    too, besides fixed_share), rated by Elo, never forgotten or evicted."""

    @property
    def players(self) -> list[str]:
        """The learning players: main, then the main exploiters, then the league exploiters
        (learner i trains players[i])."""
        return (
            [MAIN]
            + [f"{MAIN_EXPLOITER}_{i}" for i in range(self.main_exploiters)]
            + [f"{LEAGUE_EXPLOITER}_{j}" for j in range(self.league_exploiters)]
        )

    @model_validator(mode="after")
    def _rules_hold(self) -> LeagueConfig:
        """Each method raises ValueError if its rule is broken, in this order."""
        self._shares_fit()
        self._min_games_reachable()
        self._fixed_names()
        return self

    def _shares_fit(self) -> None:
        if self.self_play + self.verification + self.fixed_share > 1:
            raise ValueError(
                f"self_play ({self.self_play}) + verification ({self.verification}) + "
                f"fixed_share ({self.fixed_share}) must be at most 1 (the rest is the PFSP share)"
            )

    def _min_games_reachable(self) -> None:
        # n decayed games count (1 - d^n) / (1 - d) < 1 / (1 - d): a larger min_games never
        # comes (the 1e-9 absorbs rounding in 1 - d).
        if self.payoff_decay < 1 and self.min_games * (1 - self.payoff_decay) >= 1 - 1e-9:
            raise ValueError(
                f"min_games ({self.min_games}) is never reached with payoff_decay "
                f"({self.payoff_decay}): decayed games stay below {1 / (1 - self.payoff_decay):g}"
            )

    def _fixed_names(self) -> None:
        names = self.fixed_opponents
        if len(set(names)) != len(names):
            raise ValueError(f"fixed_opponents has duplicates: {names}")
        for name in names:
            if not name or name in RESERVED_NAMES or "@" in name:
                raise ValueError(
                    f"fixed_opponents: {name!r} is not a usable name (empty, 'main' or "
                    "containing '@' are the league's own)"
                )
            if name not in REFERENCE_PLAYERS:  # the actors would fail on the first such match
                raise ValueError(
                    f"fixed_opponents: {name!r} is not one of the players actors have "
                    f"({', '.join(REFERENCE_PLAYERS)})"
                )


def player_kind(player: str) -> str:
    """The kind (``KINDS``) of a learning player's name."""
    if player == MAIN:
        return MAIN
    kind, _, index = player.rpartition("_")
    if kind in (MAIN_EXPLOITER, LEAGUE_EXPLOITER) and index.isdigit():
        return kind
    raise ValueError(f"{player!r} is not a learning player's name")


__all__ = ["KINDS", "LEAGUE_EXPLOITER", "MAIN", "MAIN_EXPLOITER", "LeagueConfig", "player_kind"]
