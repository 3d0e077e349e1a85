"""A self-play league (AlphaStar, DI-engine): the population of the learning player, its
snapshots and fixed opponents, and the rules that pick opponents and take snapshots.

Pure logic (numpy, stdlib, pydantic): no sockets, no torch.

- ``config``: the ``league:`` section (``LeagueConfig``).
- ``payoff``: decayed win/draw/loss counts per pair (``Payoff``).
- ``pfsp``: prioritized fictitious self-play weights (``pfsp_weights``).
- ``elo``: Elo ratings (``Elo``).
- ``population``: the population and its rules (``League``).
"""

from __future__ import annotations

from zrl.league.config import LeagueConfig
from zrl.league.elo import Elo
from zrl.league.payoff import Payoff, check_outcome
from zrl.league.pfsp import WEIGHTINGS, pfsp_weights
from zrl.league.population import MAIN, League, snapshot_id, snapshot_version

__all__ = [
    "MAIN",
    "WEIGHTINGS",
    "Elo",
    "League",
    "LeagueConfig",
    "Payoff",
    "check_outcome",
    "pfsp_weights",
    "snapshot_id",
    "snapshot_version",
]
