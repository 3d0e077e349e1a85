"""The league section's validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from zrl.config.league import LeagueConfig


def test_defaults_validate() -> None:
    cfg = LeagueConfig()
    assert cfg.fixed_opponents == ["random"]
    assert cfg.weighting == "squared"


def test_shares_over_one_name_both_keys() -> None:
    with pytest.raises(ValidationError, match=r"self_play.*verification"):
        LeagueConfig(self_play=0.9, verification=0.2)
    LeagueConfig(self_play=0.85, verification=0.15)  # exactly 1: no PFSP share, allowed


def test_unreachable_min_games_is_refused() -> None:
    # decayed games stay below 1 / (1 - 0.9) = 10
    with pytest.raises(ValidationError, match="min_games"):
        LeagueConfig(payoff_decay=0.9, min_games=10)
    LeagueConfig(payoff_decay=0.9, min_games=9)
    LeagueConfig(payoff_decay=1.0, min_games=1000)


@pytest.mark.parametrize("names", [["random", "random"], ["main"], ["main@3"], [""], ["greedy"]])
def test_fixed_opponent_names(names: list[str]) -> None:
    with pytest.raises(ValidationError, match="fixed_opponents"):
        LeagueConfig(fixed_opponents=names)


@pytest.mark.parametrize(
    "bad", [{"weighting": "cubic"}, {"payoff_decay": 0.0}, {"max_snapshots": 0}, {"typo": 1}]
)
def test_bad_values_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        LeagueConfig(**bad)
