"""The ``pbt:`` section and the rules a population's config must follow: each error names
its key."""

from __future__ import annotations

from typing import Any

import pytest

from zrl.config.experiment import ConfigError, config_from_dict


def population(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "algo": "ppo",
        "env": {"id": "CartPole-v1"},
        "roles": {"actors": 4, "replay": 0, "learners": 2, "evaluator": 0, "pbt": 1},
        "pbt": {"members": 2, "ready_interval_s": 10},
        "checkpoint": {"interval": 5},
    }
    for key, value in changes.items():
        section, field = key.split("__")
        data.setdefault(section, {})[field] = value
    return data


def test_a_population_is_its_members_each_with_a_learner_and_round_robin_actors():
    cfg = config_from_dict(population())
    assert cfg.policies == ["member_0", "member_1"]
    assert [cfg.learner_policy(i) for i in range(2)] == ["member_0", "member_1"]
    assert [cfg.actor_policy(i) for i in range(4)] == ["member_0", "member_1"] * 2
    assert cfg.learners_per_policy() == 1 and cfg.learner_rank(1) == 0
    assert cfg.hyperparameter("learner.lr") == cfg.learner.lr


def test_a_member_may_train_with_a_dd_ppo_group_of_learners():
    cfg = config_from_dict(population(roles__learners=4, ppo__minibatch_size=64))
    assert cfg.learners_per_policy() == 2
    assert [cfg.learner_policy(i) for i in range(4)] == ["member_0"] * 2 + ["member_1"] * 2
    assert [cfg.learner_rank(i) for i in range(4)] == [0, 1, 0, 1]


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"pbt__members": 1}, "pbt.members"),
        ({"algo__": None}, "PBT is implemented for ppo only"),
        ({"roles__learners": 3}, "roles.learners (3) must be a multiple of it"),
        ({"roles__learners": 1}, "roles.learners (1) must be a multiple of it"),
        ({"roles__actors": 1}, "roles.actors (1)"),
        ({"roles__league": 1}, "roles.league"),
        ({"roles__evaluator": 1}, "roles.evaluator (1): with pbt.fitness: training"),
        ({"pbt__fitness": "evaluation"}, "roles.evaluator (0) must equal it"),
        ({"pbt__fitness": "evaluation", "roles__evaluator": 3}, "roles.evaluator (3) must"),
        (
            {"pbt__fitness": "evaluation", "roles__evaluator": 2, "evaluator__interval": 10},
            "evaluator.interval (10.0) must be below pbt.ready_interval_s (10.0)",
        ),
        ({"pbt__fitness": "returns"}, "pbt.fitness"),
        ({"roles__pbt": 0}, "set roles.pbt: 1"),
        ({"checkpoint__interval": 30}, "checkpoint.interval (30.0)"),
        ({"pbt__perturb": [0.8, -1.0]}, "perturb"),
        ({"pbt__exploit_fraction": 0.7}, "pbt.exploit_fraction"),
        (
            {"pbt__hyperparameters": {"learner.gamma": {"low": 0.9, "high": 1}}},
            "pbt.hyperparameters: unknown hyperparameter(s) ['learner.gamma']: PBT changes "
            "learner.lr, ppo.entropy_coef",
        ),
        ({"pbt__hyperparameters": {"learner.lr": {"low": 1, "high": 0.1}}}, "low (1.0)"),
        (
            {"pbt__hyperparameters": {"ppo.entropy_coef": {"low": 1e-4, "high": 0.1}}},
            "pbt.hyperparameters.ppo.entropy_coef: the config's ppo.entropy_coef (0.0)",
        ),
    ],
)
def test_config_errors_name_the_key(changes, named):
    data = population(**{k: v for k, v in changes.items() if k != "algo__"})
    if "algo__" in changes:
        data.update(algo="appo", replay={"table": "fifo"})
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert named in str(info.value), str(info.value)


def test_ranked_by_evaluations_evaluator_i_evaluates_member_i():
    cfg = config_from_dict(population(pbt__fitness="evaluation", roles__evaluator=2))
    assert [cfg.evaluator_policy(i) for i in range(2)] == ["member_0", "member_1"]
    assert config_from_dict(population()).evaluator_policy(0) == "main"  # ranked by training
    assert config_from_dict({}).evaluator_policy(0) == "main"


def test_roles_pbt_without_members_is_refused_and_no_members_is_no_population():
    data = population(pbt__members=0)
    with pytest.raises(ConfigError, match="roles.pbt: 1 needs a population"):
        config_from_dict(data)
    data["roles"].update(pbt=0, learners=1)
    assert config_from_dict(data).policies == ["main"]


def test_several_evaluators_are_a_populations_ranked_by_evaluations():
    with pytest.raises(ConfigError, match=r"roles.evaluator \(2\): one evaluator evaluates"):
        config_from_dict({"roles": {"evaluator": 2}})
    with pytest.raises(ConfigError, match=r"roles.evaluator \(2\): one evaluator evaluates"):
        config_from_dict(population(roles__evaluator=2))  # ranked by training returns
