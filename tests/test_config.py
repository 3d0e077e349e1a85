"""Config loading, validation messages and ``--set`` overrides."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zrl.algos.apex_ddpg.config import DDPGConfig
from zrl.algos.ppo.config import PPOConfig
from zrl.config import (
    ConfigError,
    ExperimentConfig,
    config_from_dict,
    config_schema,
    config_to_yaml,
    load_config,
    parse_override,
)
from zrl.config_sections import DEFAULT_STREAMS
from zrl.testing.processes import REPO

CARTPOLE = REPO / "configs" / "cartpole_apex_dqn.yaml"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return p


def test_load_cartpole_config():
    cfg = load_config(CARTPOLE)
    raw = yaml.safe_load(CARTPOLE.read_text())
    assert cfg.name == "cartpole_apex_dqn" == raw["name"]
    assert cfg.env.id == "CartPole-v1"
    assert cfg.replay.capacity == raw["replay"]["capacity"] == 100_000
    assert cfg.replay.samples_per_insert_tolerance == 4096.0
    assert isinstance(cfg.replay.samples_per_insert_tolerance, float)
    assert cfg.model.hidden == [64, 64]
    assert cfg.stop.eval_return == 475 and cfg.stop.wall_time == 600
    # Sections the file leaves out get their defaults.
    assert cfg.broker.streams == list(DEFAULT_STREAMS)
    assert cfg.broker.heartbeat_timeout == 3.0


def test_config_survives_yaml_and_spec_round_trips():
    cfg = load_config(CARTPOLE, ["replay.capacity=5000", "model.hidden=[8, 16]"])
    again = ExperimentConfig.model_validate(yaml.safe_load(config_to_yaml(cfg)))
    assert again == cfg
    # What the broker sends every role as the experiment spec.
    assert ExperimentConfig.model_validate(cfg.model_dump(mode="json")) == cfg


def test_config_to_yaml_keeps_field_order():
    text = config_to_yaml(load_config(CARTPOLE))
    top = [line.split(":")[0] for line in text.splitlines() if line and not line[0].isspace()]
    assert top == list(config_schema())


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("replay:\n  capacityy: 5\n", "replay.capacityy"),
        ("replayy:\n  capacity: 5\n", "replayy"),
        ("broker:\n  heartbeat: 1.0\n", "broker.heartbeat"),
    ],
)
def test_unknown_key_names_its_path(tmp_path, text, path):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    msg = str(info.value)
    assert f"{path}: unknown key" in msg
    assert str(tmp_path / "cfg.yaml") in msg


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("replay:\n  capacity: lots\n", "replay.capacity", "'lots'"),
        ("env:\n  num_envs: 0\n", "env.num_envs", "0"),
        ("replay:\n  table: heap\n", "replay.table", "'heap'"),
        ("learner:\n  lr: -1\n", "learner.lr", "-1"),
        ("model:\n  hidden: [64, x]\n", "model.hidden.1", "'x'"),
        ("replay: 5\n", "replay", "5"),
    ],
)
def test_wrong_type_names_path_and_value(tmp_path, text, path, value):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    msg = str(info.value)
    assert f"{path}: " in msg
    assert f"(got {value})" in msg


def test_several_errors_reported_together():
    with pytest.raises(ConfigError) as info:
        config_from_dict({"replay": {"capacityy": 1}, "env": {"num_envs": "many"}})
    msg = str(info.value)
    assert "replay.capacityy: unknown key" in msg
    assert "env.num_envs:" in msg and "'many'" in msg


def test_stop_needs_a_condition():
    with pytest.raises(ConfigError, match="at least one of eval_return"):
        config_from_dict({"stop": {"eval_return": None, "wall_time": None}})
    cfg = config_from_dict({"stop": {"eval_return": None, "wall_time": None, "env_steps": 10}})
    assert cfg.stop.env_steps == 10


def test_overrides_are_typed():
    cfg = load_config(
        CARTPOLE,
        [
            "replay.capacity=5000",
            "learner.double=false",
            "model.hidden=[32, 16]",
            "stop.eval_return=null",
            "name=my run",
            "learner.lr=1e-4",  # YAML 1.1 reads this as a string; the schema makes it a float
            "env.kwargs.max_episode_steps=100",  # kwargs is a free-form mapping
        ],
    )
    assert cfg.replay.capacity == 5000 and isinstance(cfg.replay.capacity, int)
    assert cfg.learner.double is False
    assert cfg.model.hidden == [32, 16]
    assert cfg.stop.eval_return is None
    assert cfg.name == "my run"
    assert cfg.learner.lr == 1e-4
    assert cfg.env.kwargs == {"max_episode_steps": 100}
    # Later overrides win.
    assert load_config(CARTPOLE, ["seed=1", "seed=2"]).seed == 2


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("replay.capacity=abc", r"replay\.capacity: .*\(got 'abc'\)"),
        ("replay.capacity=0", r"replay\.capacity: .*greater than or equal to 1 \(got 0\)"),
        ("replay.capacityy=5", r"replay\.capacityy: unknown key"),
        ("replay.foo.bar=1", r"replay\.foo: unknown key"),  # no new nested sections
        ("newsection.key=1", r"newsection: unknown key"),
        ("replay.capacity.x=1", r"override 'replay\.capacity\.x=1': replay\.capacity is not a"),
        ("replay.capacity", r"override 'replay\.capacity' is not of the form key\.path=value"),
        ("=5", r"override '=5' has an empty key"),
        ("seed=[1", r"override 'seed=\[1': value is not valid YAML"),
        ("roles.params=2", r"roles\.params: .*(got 2)"),
    ],
)
def test_bad_overrides(override, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_config(CARTPOLE, [override])
    assert str(CARTPOLE) in str(info.value)


def test_parse_override():
    assert parse_override("a.b.c=1") == (["a", "b", "c"], 1)
    assert parse_override(" a.b =x=y") == (["a", "b"], "x=y")  # only the first '=' splits
    assert parse_override("a=") == (["a"], "")
    assert parse_override("a='007'") == (["a"], "007")
    assert parse_override("a=1.5") == (["a"], 1.5)
    assert parse_override("a=[1, {b: 2}]") == (["a"], [1, {"b": 2}])


def test_non_mapping_yaml(tmp_path):
    for text, kind in (("- a\n- b\n", "list"), ("just a string\n", "str"), ("42\n", "int")):
        with pytest.raises(ConfigError, match=f"top level must be a mapping, got {kind}"):
            load_config(write(tmp_path, text))


def test_empty_file_gives_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == ExperimentConfig()


def test_invalid_yaml_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "replay: [1, 2\n"))


@pytest.mark.parametrize("where", ["override", "file"])
def test_yaml_errors_are_one_line(tmp_path, where):
    with pytest.raises(ConfigError) as info:
        if where == "override":
            load_config(CARTPOLE, ["seed=[1"])
        else:
            load_config(write(tmp_path, "replay: [1, 2\n"))
    assert "not valid YAML" in str(info.value)
    assert "\n" not in str(info.value)


def test_other_config_errors_are_one_line(tmp_path):
    for overrides in (["replay.capacity=abc", "seed=x"], ["replay.capacity.x=1"], ["=1"]):
        with pytest.raises(ConfigError) as info:
            load_config(CARTPOLE, overrides)
        assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"config file not found: {missing}"):
        load_config(missing)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path)  # a directory is not a config file


def test_config_error_is_value_error():
    # The CLI turns ValueErrors into one-line errors; ConfigError must be one of them.
    assert issubclass(ConfigError, ValueError)


def test_sections_validate_assignment():
    cfg = ExperimentConfig()
    with pytest.raises(ValueError):
        cfg.replay.capacity = "abc"  # type: ignore[assignment]
    with pytest.raises(ValueError):
        cfg.replay.capacityy = 3  # type: ignore[attr-defined]


def test_algorithm_sections_are_typed_validated_and_kept():
    cfg = config_from_dict({"algo": "ppo", "roles": {"replay": 0}, "ppo": {"epochs": 7}})
    assert cfg.section(PPOConfig).epochs == 7 and cfg.section(PPOConfig).clip == 0.2
    assert cfg.section(DDPGConfig) == DDPGConfig()  # every known section, whatever runs
    again = ExperimentConfig.model_validate(cfg.model_dump(mode="json"))
    assert again == cfg and again.section(PPOConfig).epochs == 7
    with pytest.raises(ValueError):
        cfg.section(PPOConfig).epochs = 0  # sections validate assignment as fields do
    with pytest.raises(ConfigError, match=r"ppo\.epochs: Input should be greater"):
        config_from_dict({"ppo": {"epochs": 0}, "lerner": {}})
    with pytest.raises(ConfigError, match=r"lerner: unknown key"):  # both errors, together
        config_from_dict({"ppo": {"epochs": 0}, "lerner": {}})


def test_assigning_a_field_runs_the_algorithms_checks():
    cfg = config_from_dict({"algo": "apex_dqn"})
    with pytest.raises(ValueError, match="set roles.replay: 0"):
        cfg.algo = "ppo"  # ppo has no replay server; roles.replay is 1


def test_an_algorithm_section_may_not_shadow_a_common_one():
    from zrl.algos import register, unregister
    from zrl.algos.api import Algorithm, Wiring
    from zrl.config_sections import ReplayConfig

    clash = Algorithm(
        name="clash", summary="", wiring=Wiring.off_policy("discrete"), policy="", update="",
        model="", config={"replay": ReplayConfig},
    )  # fmt: skip
    register(clash)
    try:
        with pytest.raises(ConfigError, match=r"section\(s\) \['replay'\]"):
            config_from_dict({})
    finally:
        unregister("clash")
    twice = Algorithm(
        name="twice", summary="", wiring=Wiring.off_policy("discrete"), policy="", update="",
        model="", config={"ppo": ReplayConfig},
    )  # fmt: skip
    register(twice)
    try:
        with pytest.raises(ValueError, match="'ppo' is already PPOConfig, not ReplayConfig"):
            config_from_dict({})
    finally:
        unregister("twice")
    with pytest.raises(KeyError, match="ReplayConfig"):
        ExperimentConfig().section(ReplayConfig)


@pytest.mark.parametrize(
    ("algo", "override", "expected"),
    [
        (
            "apex_dqn",
            "replay.capacityy=5",
            "replay.capacityy: unknown key (did you mean replay.capacity?)",
        ),
        ("apex_dqn", "replay.n_steps=3", "(did you mean replay.n_step?)"),  # a typo beats an alias
        ("apex_dqn", "envv.id=x", "envv: unknown key (did you mean env?)"),
        (
            "ppo",
            "ppo.learning_rate=0.1",
            "ppo.learning_rate: unknown key (did you mean learner.lr?)",
        ),
        ("a3c", "a3c.learning_rate=0.1", "(did you mean a3c.lr?)"),
        ("sac", "learning_rate=0.1", "(did you mean sac.actor_lr or sac.critic_lr?)"),
        ("ppo", "ppo.batch_size=64", "(did you mean ppo.minibatch_size?)"),
        ("apex_dqn", "replay.buffer_size=10", "(did you mean replay.capacity?)"),
        ("ppo", "ppo.n_steps=128", "(did you mean actor.trajectory_length?)"),
        ("ppo", "ppo.ent_coef=0.01", "(did you mean ppo.entropy_coef?)"),
        ("ppo", "ppo.clip_range=0.1", "(did you mean ppo.clip?)"),
        ("impala", "learner.gamma=0.9", "(did you mean impala.gamma?)"),
        ("appo", "appo.ppo_clip_ratio=0.2", "(did you mean appo.clip?)"),
        ("appo", "appo.num_batches_per_epoch=4", "(did you mean appo.minibatches?)"),
        (
            "apex_dqn",
            "stop.lr=0.1",
            "stop.lr: unknown key (did you mean learner.lr?)",
        ),  # other section
        ("apex_dqn", "total_timesteps=1000", "(did you mean stop.env_steps?)"),
        ("apex_dqn", "evaluator.eval_episodes=5", "(did you mean evaluator.episodes?)"),
    ],
)
def test_unknown_key_suggests_the_key_meant(algo, override, expected):
    roles = {"ppo": {"replay": 0}, "a3c": {"replay": 0, "learners": 0}}.get(algo, {})
    table = {"impala": {"table": "fifo"}, "appo": {"table": "fifo"}, "sac": {"table": "uniform"}}
    table = table.get(algo, {})
    with pytest.raises(ConfigError) as info:
        config_from_dict({"algo": algo, "roles": roles, "replay": table}, [override])
    assert expected in str(info.value)


def test_unknown_key_in_a_list_item_suggests_its_path():
    with pytest.raises(
        ConfigError, match=r"hosts\.0\.rolez: unknown key \(did you mean hosts\.0\.roles\?\)"
    ):
        config_from_dict({"hosts": [{"name": "a", "rolez": {"actors": 1}}]})


def test_unknown_key_without_a_near_name_gets_no_guess():
    with pytest.raises(ConfigError) as info:
        config_from_dict({}, ["newsection.key=1"])
    assert str(info.value).endswith("newsection: unknown key")


def test_every_alias_names_a_real_key():
    from zrl.config import algo_sections
    from zrl.config_help import KEY_ALIASES

    cfg = ExperimentConfig().model_dump()
    for name, targets in KEY_ALIASES.items():
        assert set(targets) <= {"*", *algo_sections()}, name
        for target in targets.values():
            for path in target.split(" or "):
                node = cfg
                for part in path.split("."):
                    if node == {}:  # env.kwargs: free-form
                        break
                    assert isinstance(node, dict) and part in node, f"{name} -> {path}"
                    node = node[part]


def test_algo_sections_cover_every_algo():
    from zrl.algos import ALGORITHMS
    from zrl.config import algo_sections

    sections_by_algo = algo_sections()
    assert set(sections_by_algo) == set(ALGORITHMS)
    for sections in sections_by_algo.values():
        assert set(sections) <= set(config_schema())


@pytest.mark.parametrize(
    ("algo", "present", "absent"),
    [
        ("apex_dqn", {"replay", "learner"}, {"impala", "appo", "ppo", "a3c", "ddpg", "sac"}),
        ("ppo", {"learner", "ppo"}, {"replay", "impala", "appo", "a3c", "ddpg", "sac"}),
        ("impala", {"replay", "learner", "impala"}, {"appo", "ppo", "a3c", "ddpg", "sac"}),
        ("appo", {"replay", "learner", "appo"}, {"impala", "ppo", "a3c", "ddpg", "sac"}),
        ("a3c", {"a3c"}, {"replay", "impala", "appo", "ppo", "ddpg", "sac"}),
        ("apex_ddpg", {"replay", "ddpg"}, {"impala", "appo", "ppo", "a3c", "sac"}),
        ("sac", {"replay", "sac"}, {"impala", "appo", "ppo", "a3c", "ddpg"}),
    ],
)
def test_sections_used_per_algo(algo, present, absent):
    from zrl.config import sections_used

    used = set(sections_used(algo))
    common = {"name", "algo", "seed", "env", "model", "broker", "roles", "actor", "evaluator",
              "stop", "checkpoint", "limits", "hosts"}  # fmt: skip
    assert common | present <= used
    assert not used & absent
    cfg = ExperimentConfig.model_validate(
        {"algo": algo, "roles": {"replay": 0, "learners": 0, "actors": 0}}
    )
    shown = yaml.safe_load(config_to_yaml(cfg, all_sections=False))
    assert list(shown) == sections_used(algo)  # schema order kept
    assert f"# not used by {algo}: " in config_to_yaml(cfg, all_sections=False)
    assert list(yaml.safe_load(config_to_yaml(cfg))) == list(config_schema())


def test_the_config_and_the_cli_import_no_torch():
    # Validating a config imports every algorithm package for its config sections
    # (zrl/algos/<name>/__init__.py and config.py), and `zrl --help` imports the CLI: neither
    # may pull in torch.
    code = (
        "import sys, zrl.cli, zrl.config; zrl.config.ExperimentConfig(); "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
