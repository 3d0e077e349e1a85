"""``env.multiagent``: policy mappings name only known policies, evaluation opponents are
fixed players, and the defaults (auto API, self-play opponent, random evaluation)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from zrl.config.experiment import ExperimentConfig
from zrl.config.multiagent import MultiAgentConfig


def test_defaults():
    cfg = MultiAgentConfig()
    assert (cfg.api, cfg.opponent, cfg.central_value) == ("auto", "self", False)
    assert cfg.policy_mapping == {} and cfg.eval_opponents == ["random"]


def test_policy_mapping_values():
    mapping = {"player_1": "main", "player_2": "scripted", "*": "random"}
    assert MultiAgentConfig(policy_mapping=mapping).policy_mapping == mapping
    with pytest.raises(ValidationError, match="policy_mapping\\['player_2'\\]: 'self'"):
        MultiAgentConfig(policy_mapping={"player_1": "main", "player_2": "self"})


def test_eval_opponents_are_fixed_players():
    assert MultiAgentConfig(eval_opponents=["scripted", "random"]).eval_opponents == [
        "scripted",
        "random",
    ]
    with pytest.raises(ValidationError, match="'self' is not one of random, scripted, perfect"):
        MultiAgentConfig(eval_opponents=["self"])
    with pytest.raises(ValidationError, match="at least one"):
        MultiAgentConfig(eval_opponents=[])
    with pytest.raises(ValidationError):
        MultiAgentConfig(opponent="main@3")


def test_both_seats_needs_an_algorithm_that_learns_from_both_and_a_feed_forward_model():
    base = {
        "env": {"id": "pettingzoo/tictactoe_v3", "multiagent": {"self_play_seats": "both"}},
        "roles": {"replay": 0},
    }
    assert ExperimentConfig.model_validate({**base, "algo": "ppo"}).env.multiagent
    with pytest.raises(ValidationError, match="algo 'impala' learns from one seat"):
        ExperimentConfig.model_validate({**base, "algo": "impala", "roles": {"replay": 1}})
    with pytest.raises(ValidationError, match="recurrent model"):
        ExperimentConfig.model_validate({**base, "algo": "ppo", "model": {"core": "lstm"}})
    with pytest.raises(ValidationError, match="self_play_seats"):
        MultiAgentConfig.model_validate({"self_play_seats": "all"})
