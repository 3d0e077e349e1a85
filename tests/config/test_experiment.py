"""Config loading, validation messages and ``--set`` overrides."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from zrl.algos.apex_ddpg.config import DDPGConfig
from zrl.algos.ppo.config import PPOConfig
from zrl.config.experiment import (
    ConfigError,
    ExperimentConfig,
    config_from_dict,
    config_schema,
    config_to_yaml,
    load_config,
    parse_override,
)
from zrl.config.sections import DEFAULT_STREAMS
from zrl.testing.fakes import welcome_message
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
    assert cfg.broker.heartbeat_timeout == 10.0


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


@pytest.mark.parametrize(
    "config",
    [
        "cartpole_apex_dqn.yaml",
        "cartpole_novel_r2d2.yaml",
        "pendulum_sac.yaml",
        "pendulum_apex_ddpg.yaml",
        "simple_spread_qmix.yaml",
        "cartpole_ppo.yaml",
        "cartpole_impala.yaml",
        "cartpole_appo.yaml",
    ],
)
def test_every_built_in_algorithm_trains_one_policy_with_several_learners(config):
    cfg = load_config(REPO / "configs" / config, ["roles.learners=2"])
    assert cfg.roles.learners == 2 and cfg.learners_per_policy() == 2


def _no_pieces() -> Any:
    raise AssertionError("validating a config never imports an algorithm's pieces")


def test_several_learners_of_one_policy_need_an_algorithm_that_trains_it_together():
    # A plug-in algorithm without data_parallel: each learner would train and publish a model
    # of its own.
    from zrl.algos.api.algorithm import Algorithm, Wiring
    from zrl.algos.registry import register, unregister

    solo = Algorithm(
        name="solo",
        summary="",
        wiring=Wiring.off_policy("discrete"),
        pieces=_no_pieces,
        sections=("replay", "learner"),
    )
    register(solo)
    try:
        with pytest.raises(
            ConfigError,
            match=r"roles\.learners: 2 for 1 learning policy: .* set roles\.learners: 1",
        ):
            config_from_dict({"algo": "solo", "roles": {"learners": 2}})
        assert config_from_dict({"algo": "solo"}).roles.learners == 1
    finally:
        unregister("solo")


def test_several_learners_of_replays_batches_need_a_batch_in_flight_each():
    with pytest.raises(
        ConfigError,
        match=r"roles.learners \(3\): apex_dqn's learners .* roles.replay \(1\) x "
        r"replay.prefetch \(2\) = 2 are in flight",
    ):
        load_config(
            REPO / "configs" / "cartpole_apex_dqn.yaml",
            ["roles.learners=3", "roles.replay=1", "replay.prefetch=2"],
        )


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
    from zrl.algos.api.algorithm import Algorithm, Wiring
    from zrl.algos.registry import register, unregister
    from zrl.config.sections import ReplayConfig

    clash = Algorithm(
        name="clash",
        summary="",
        wiring=Wiring.off_policy("discrete"),
        pieces=_no_pieces,
        config={"replay": ReplayConfig},
    )
    register(clash)
    try:
        with pytest.raises(ConfigError, match=r"section\(s\) \['replay'\]"):
            config_from_dict({})
    finally:
        unregister("clash")
    twice = Algorithm(
        name="twice",
        summary="",
        wiring=Wiring.off_policy("discrete"),
        pieces=_no_pieces,
        config={"ppo": ReplayConfig},
    )
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
    from zrl.config.experiment import algo_sections
    from zrl.config.help import key_aliases

    cfg = ExperimentConfig().model_dump()
    for name, targets in key_aliases().items():
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
    from zrl.algos.registry import BUILT_IN
    from zrl.config.experiment import algo_sections

    sections_by_algo = algo_sections()
    assert set(sections_by_algo) == set(BUILT_IN)
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
    from zrl.config.experiment import sections_used

    used = set(sections_used(algo))
    common = {
        "name",
        "algo",
        "seed",
        "env",
        "model",
        "broker",
        "roles",
        "actor",
        "evaluator",
        "stop",
        "checkpoint",
        "limits",
        "hosts",
    }
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
    # may pull in torch; nor may the head (zrl run's supervisor), which leaves torch's import
    # to the zygote and the roles.
    code = (
        "import sys, zrl.cli.main, zrl.config.experiment, zrl.run.supervisor; "
        "zrl.config.experiment.ExperimentConfig(); "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# --- hostile configs (issue 27, observation 13) ------------------------------------------------


def alias_bomb(levels: int = 9) -> str:
    """The 1 KB "billion laughs" as a flow mapping: each anchor a list of ten aliases of the
    one before."""
    items = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        items.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]")
    return "{" + ", ".join(items) + "}"


def merge_bomb(levels: int = 40) -> str:
    """The same with merge keys: each mapping merges the one before twice."""
    items = ["m0: &m0 {a: 1, b: 2}"]
    for i in range(1, levels):
        items.append(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: 1}}")
    return "{" + ", ".join(items) + "}"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (alias_bomb(), "expands to more than 100000 values"),
        (merge_bomb(), "expands to more than 100000 values"),
        ("&k {a: [1, *k]}", "an alias inside the value it names"),
        ("{a: " + "[" * 500 + "]" * 500 + "}", "nested deeper than 64"),
    ],
    ids=["alias-bomb", "merge-bomb", "recursive", "deep"],
)
def test_yaml_bombs_are_refused_in_little_memory(tmp_path, kwargs, match):
    # Memory, not time, is the bound asserted: a bomb that expanded would take gigabytes.
    import tracemalloc

    path = write(tmp_path, f"env:\n  kwargs: {kwargs}\n")
    assert path.stat().st_size < 2048
    load_config(CARTPOLE)  # the imports done, not timed
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=match) as info:
            load_config(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=match):  # the same through --set
        load_config(CARTPOLE, [f"env.kwargs={kwargs}"])


def test_aliases_within_the_bound_still_load(tmp_path):
    cfg = load_config(write(tmp_path, f"env:\n  kwargs: {alias_bomb(4)}\n"))  # 11,110 values
    assert cfg.env.kwargs["l3"][9][9][9] == ["x"] * 10


def test_an_oversized_config_file_is_refused_unread(tmp_path):
    from zrl.config.experiment import MAX_CONFIG_FILE_BYTES

    path = write(tmp_path, "# " + "x" * MAX_CONFIG_FILE_BYTES + "\n")
    with pytest.raises(
        ConfigError, match=f"more than a config may have \\({MAX_CONFIG_FILE_BYTES}"
    ):
        load_config(path)


def float_fields(model: type, prefix: str = "") -> list[str]:
    """The dotted keys of every float field of ``model`` and of the sections inside it."""
    from types import UnionType
    from typing import Union, get_args, get_origin

    from zrl.config.base import Section

    keys = []
    for name, field in model.model_fields.items():
        union = get_origin(field.annotation) in (Union, UnionType)
        types = get_args(field.annotation) if union else (field.annotation,)
        if float in types:
            keys.append(f"{prefix}{name}")
        for t in types:
            if isinstance(t, type) and issubclass(t, Section):
                keys += float_fields(t, f"{prefix}{name}.")
    return keys


FLOAT_KEYS = [
    k
    for section, model in config_schema().items()
    if isinstance(model, type) and hasattr(model, "model_fields")
    for k in float_fields(model, f"{section}.")
]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_every_float_field_must_be_finite(value):
    yaml_value = {"inf": ".inf", "-inf": "-.inf", "nan": ".nan"}[value]
    assert {
        "learner.lr",
        "stop.wall_time",
        "ppo.clip",
        "env.atari.repeat_action_probability",
    } <= set(FLOAT_KEYS)
    for key in FLOAT_KEYS:
        with pytest.raises(ConfigError) as info:
            load_config(CARTPOLE, [f"{key}={yaml_value}"])
        assert f"{key}: Input should be a finite number" in str(info.value), key


@pytest.mark.parametrize("value", [".inf", ".nan"])
def test_a_stop_bound_must_be_finite(value):
    with pytest.raises(ConfigError, match="stop.eval_at_most.x: Input should be a finite"):
        load_config(CARTPOLE, [f"stop.eval_at_most={{x: {value}}}"])


def test_learner_lr_inf_in_a_file_names_the_key_and_value(tmp_path):
    with pytest.raises(
        ConfigError, match=r"learner\.lr: Input should be a finite number \(got inf\)"
    ):
        load_config(write(tmp_path, "learner:\n  lr: .inf\n"))
    cfg = ExperimentConfig()
    with pytest.raises(ValueError, match="finite"):
        cfg.learner.lr = float("nan")  # assignment too


@pytest.mark.parametrize(
    "name", ["../../x", "/tmp/x", "a/b", "..", ".", "", ".hidden", "-rf", "a\x00b", "x" * 101, " a"]
)
def test_name_must_be_one_path_component(name):
    from zrl.run.experiment import Experiment

    with pytest.raises(ConfigError, match=r"name: .*is not one path component") as info:
        config_from_dict({"name": name})
    assert repr(name) in str(info.value)
    with pytest.raises(ConfigError, match="is not one path component"):
        Experiment(config={"name": name}).resolved_config()
    with pytest.raises(ValueError, match="is not one path component"):
        ExperimentConfig().name = name


@pytest.mark.parametrize("name", ["cartpole_apex_dqn", "my run", "run.v2+seed-3", "_x"])
def test_plain_names_are_kept(name):
    assert config_from_dict({"name": name}).name == name


@pytest.mark.parametrize(
    ("override", "key", "bound"),
    [
        ("roles.actors=100000", "roles.actors", "16384"),
        ("env.num_envs=1000000000000", "env.num_envs", "16384"),
        ("replay.capacity=1000000000000", "replay.capacity", str(2**32)),
        ("replay.batch_size=1000000000", "replay.batch_size", str(2**20)),
        ("model.hidden=[64, 1000000000]", "model.hidden.1", "65536"),
        ("actor.trajectory_length=10000000", "actor.trajectory_length", "65536"),
        ("evaluator.episodes=10000000", "evaluator.episodes", "100000"),
    ],
)
def test_sizes_have_ceilings_naming_key_value_and_bound(override, key, bound):
    value = override.split("=", 1)[1].split(", ")[-1].rstrip("]")
    with pytest.raises(ConfigError) as info:
        load_config(CARTPOLE, [override])
    msg = str(info.value)
    assert f"{key}: Input should be less than or equal to {bound} (got {value})" in msg, msg


def test_planned_roles_must_fit_the_registry():
    with pytest.raises(
        ConfigError, match=r"3004 roles planned .*roles\.actors: 3000.*max_roles: 2048"
    ):
        config_from_dict({"roles": {"actors": 3000}})
    assert config_from_dict({"roles": {"actors": 3000}, "broker": {"max_roles": 4096}})


def test_the_roles_of_this_host_must_fit_its_cores_and_memory():
    from zrl.config.experiment import check_fits_machine

    gib = 2**30
    cfg = config_from_dict({"roles": {"actors": 100}})
    with pytest.raises(ConfigError, match=r"104 role processes on this host \(roles\.actors: 100"):
        check_fits_machine(cfg, cores=2, memory_bytes=64 * gib)
    check_fits_machine(cfg, cores=16, memory_bytes=64 * gib)  # 128 fit 16 cores
    with pytest.raises(ConfigError, match=r"exceed 13, what this host's 16 cores and 2\.0 GiB"):
        check_fits_machine(cfg, cores=16, memory_bytes=2 * gib)  # but not 2 GiB
    # Roles placed on other hosts do not count here.
    placed = config_from_dict(
        {"roles": {"actors": 100}, "hosts": [{"name": "big", "roles": {"actors": 96}}]}
    )
    check_fits_machine(placed, cores=2, memory_bytes=64 * gib)
    envs = config_from_dict({"env": {"num_envs": 4096}})
    with pytest.raises(
        ConfigError, match=r"env\.num_envs: 4096 x 2 actors on this host = 8192 envs exceed 2048"
    ):
        check_fits_machine(envs, cores=2, memory_bytes=64 * gib)
    big = config_from_dict({"replay": {"capacity_bytes": 100 * gib}})
    with pytest.raises(
        ConfigError, match=r"replay\.capacity_bytes: 107374182400 x 1 replay shards"
    ):
        check_fits_machine(big, cores=2, memory_bytes=64 * gib)


def test_the_preflight_refuses_what_does_not_fit_this_machine():
    from zrl.config.experiment import machine_size
    from zrl.run.preflight import check_env

    cores, _ = machine_size()
    cfg = config_from_dict({"env": {"num_envs": 8192}, "roles": {"actors": cores}})
    with pytest.raises(ConfigError, match=r"env\.num_envs: 8192 x"):
        check_env(cfg)


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_fit_a_small_machine(path):
    from zrl.config.experiment import check_fits_machine

    check_fits_machine(load_config(path), cores=2, memory_bytes=8 * 2**30)


def test_a_role_refuses_a_forged_spec_past_a_ceiling(zmq_ctx):
    """What a rogue broker's WELCOME could send: env.num_envs 10**12 was a MemoryError crash
    loop in every actor; now the spec does not validate, naming the key and the value."""
    from pydantic import ValidationError

    from zrl.roles.actor import Actor

    spec = ExperimentConfig().model_dump(mode="json")
    spec["env"]["num_envs"] = 10**12
    welcome = welcome_message(spec, "actor-0")
    actor = Actor("tcp://127.0.0.1:1", index=0, ctx=zmq_ctx)
    try:
        with pytest.raises(ValidationError, match=r"env\.num_envs[\s\S]*1000000000000"):
            actor._on_welcome(welcome)
    finally:
        actor.close()
    assert actor.config.env.num_envs == ExperimentConfig().env.num_envs


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"algo": "ppo"}, r"roles.inference: 1: ppo's actors need the weights in their own"),
        ({"algo": "a3c", "roles": {"replay": 0, "learners": 0}}, r"a3c's actors need the weights"),
        ({"algo": "sac", "env": {"id": "Pendulum-v1"}}, r"sac's actors need the weights"),
        (
            {"algo": "ppo", "env": {"id": "pettingzoo/tictactoe_v3"}, "roles": {"league": 1}},
            r"roles.inference: 1: the actors of multi-agent games play their opponents",
        ),
        (
            {"algo": "appo", "replay": {"table": "fifo"}, "actor": {"random_policy": True}},
            r"roles.inference: 1: actor.random_policy never runs the model",
        ),
    ],
)
def test_inference_roles_serve_only_actors_that_can_act_through_them(data, match):
    roles = {"inference": 1, **data.pop("roles", {})}
    with pytest.raises(ConfigError, match=match):
        config_from_dict({**data, "roles": roles})


@pytest.mark.parametrize("algo", ["apex_dqn", "r2d2", "impala", "appo"])
def test_the_algorithms_whose_actors_act_through_inference_roles(algo):
    table = {"impala": "fifo", "appo": "fifo"}.get(algo, "prioritized")
    cfg = config_from_dict({"algo": algo, "roles": {"inference": 2}, "replay": {"table": table}})
    assert cfg.roles.counts()["inference"] == 2


def test_alphazero_self_play_may_act_through_inference_roles_other_games_may_not():
    """AlphaZero's actors move for both seats (no opponent model of their own): an inference
    role may run their searches' forwards. A game against an opponent still may not."""
    cfg = load_config(REPO / "configs" / "tictactoe_alphazero.yaml", ["roles.inference=1"])
    assert cfg.roles.counts()["inference"] == 1
    with pytest.raises(ConfigError, match="play their opponents with models of their own"):
        load_config(REPO / "configs" / "tictactoe_impala.yaml", ["roles.inference=1"])
    # A policy mapping gives seats to an opponent again: its slot no longer plays every move.
    ma = cfg.env.multiagent
    assert ma.plays_every_move
    assert not ma.model_copy(update={"policy_mapping": {"player_2": "opponent"}}).plays_every_move
    assert not ma.model_copy(update={"self_play_seats": "learning"}).plays_every_move
