"""``benchmarks/mujoco_vs_sb3.py``: its command line (``--algo``), and the zrl configs it trains
agreeing with the rl-baselines3-zoo settings it gives SB3. Nothing is trained here."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest

from tests.helpers.benchmarks import load_benchmark
from zrl.algos.sac.config import SACConfig
from zrl.config.experiment import load_config


def load_bench() -> ModuleType:
    return load_benchmark("mujoco_vs_sb3")


def test_algo_defaults_to_ppo_and_takes_sac() -> None:
    bench = load_bench()
    args = bench.parse_args([])
    assert (args.algo, args.envs) == ("ppo", ["halfcheetah", "hopper"])
    args = bench.parse_args(["--algo", "sac", "--envs", " hopper,", "--seconds", "300"])
    assert (args.algo, args.envs, args.seconds) == ("sac", ["hopper"], 300.0)


@pytest.mark.parametrize("argv", [["--algo", "td3"], ["--envs", "hopper,ant"]])
def test_an_unknown_algo_or_env_is_refused(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        load_bench().parse_args(argv)
    assert exc.value.code == 2
    assert argv[1].split(",")[-1] in capsys.readouterr().err  # names what it refused


@pytest.mark.parametrize("algo", ["ppo", "sac"])
@pytest.mark.parametrize("env", ["halfcheetah", "hopper"])
def test_each_algo_and_env_has_its_shipped_config(algo: str, env: str) -> None:
    bench = load_bench()
    cfg = load_config(bench.config_for(algo, env))
    assert (cfg.algo, cfg.env.id) == (algo, bench.ENVS[env])


@pytest.mark.parametrize("env", ["halfcheetah", "hopper"])
def test_the_sac_configs_carry_the_zoo_settings_sb3_gets(env: str) -> None:
    bench = load_bench()
    zoo = bench.ZOO_SAC[env]
    cfg = load_config(bench.config_for("sac", env))
    sac, replay = cfg.section(SACConfig), cfg.replay
    assert sac.actor_lr == sac.critic_lr == sac.alpha_lr == zoo["learning_rate"]
    assert (sac.tau, replay.gamma, replay.batch_size) == (zoo["tau"], zoo["gamma"], 256)
    assert replay.batch_size == zoo["batch_size"] and replay.capacity == zoo["buffer_size"]
    # learning_starts: 10k random steps (one actor), and no update before them.
    assert cfg.roles.actors * sac.warmup_steps == zoo["learning_starts"] == replay.min_size
    # train_freq 1, gradient_steps 1: one batch sampled per env step.
    assert zoo["train_freq"] == zoo["gradient_steps"] == 1
    assert replay.samples_per_insert == replay.batch_size
    assert list(cfg.model.hidden) == [256, 256]
    sb3 = pytest.importorskip("stable_baselines3", reason='pip install -e ".[bench]"')
    assert set(zoo) <= set(inspect.signature(sb3.SAC.__init__).parameters)
