"""Did-you-mean for a mistyped config key (``zrl.config.help``), from ``--set`` and from YAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from zrl.config.experiment import ConfigError, config_schema, load_config
from zrl.config.help import suggest_key
from zrl.config.sections import LearnerConfig
from zrl.testing.processes import REPO

CARTPOLE = REPO / "configs" / "cartpole_ppo.yaml"


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("learning_rate", "learner.lr"),  # another library's name for the key
        ("lerning_rate", "learner.lr"),  # a typo of that name
        ("lrr", "learner.lr"),  # a typo of the key itself
    ],
)
def test_a_mistyped_set_key_names_itself_and_the_key_meant(key: str, meant: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(CARTPOLE, [f"learner.{key}=0.001"])
    assert f"learner.{key}: unknown key (did you mean {meant}?)" in str(info.value)


def test_a_mistyped_yaml_key_names_itself_and_the_key_meant(tmp_path: Path) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text("algo: ppo\nroles: {replay: 0}\nlearner:\n  lerning_rate: 0.001\n")
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert "learner.lerning_rate: unknown key (did you mean learner.lr?)" in str(info.value)


def test_a_typo_of_an_alias_gets_the_algorithms_key() -> None:
    schema = config_schema()
    assert suggest_key(("learner", "lerning_rate"), schema, "a3c") == "a3c.lr"
    assert suggest_key(("lerning_rate",), schema, "sac") == "sac.actor_lr or sac.critic_lr"


def test_an_unknown_key_like_none_of_its_section_lists_the_sections_keys() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(CARTPOLE, ["learner.zzz=1"])
    listed = str(info.value).split("learner.zzz: unknown key (learner has ", 1)[1]
    assert listed.rstrip(")").split(", ") == list(LearnerConfig.model_fields)
