"""A self-play league (AlphaStar, DI-engine): the learning players (the main agent, main
exploiters, league exploiters), their snapshots and fixed opponents, and the rules that pick
opponents, take snapshots and reset exploiters.

Pure logic (numpy, stdlib, pydantic): no sockets, no torch.

- ``config``: the ``league:`` section (``LeagueConfig``).
- ``payoff``: decayed win/draw/loss counts per pair (``Payoff``).
- ``pfsp``: prioritized fictitious self-play weights (``pfsp_weights``).
- ``elo``: Elo ratings (``Elo``).
- ``population``: the population and its rules (``League``).
"""

from __future__ import annotations

from zrl.config.league import KINDS, LEAGUE_EXPLOITER, MAIN_EXPLOITER, LeagueConfig, player_kind
from zrl.league.elo import Elo
from zrl.league.payoff import Payoff, check_outcome
from zrl.league.pfsp import WEIGHTINGS, pfsp_weights
from zrl.league.population import MAIN, League, snapshot_id, snapshot_parent, snapshot_version

__all__ = [
    "KINDS",
    "LEAGUE_EXPLOITER",
    "MAIN",
    "MAIN_EXPLOITER",
    "WEIGHTINGS",
    "Elo",
    "League",
    "LeagueConfig",
    "Payoff",
    "check_outcome",
    "pfsp_weights",
    "player_kind",
    "snapshot_id",
    "snapshot_parent",
    "snapshot_version",
]
