"""``roles.actors: auto``: the rule of ``zrl.run.sizing``, its validation, and a head that
resolves it before config.yaml, the roster and the broker's spec see it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from zrl.config.experiment import ConfigError, ExperimentConfig, config_from_dict
from zrl.run import sizing
from zrl.run.sizing import resolve_auto_roles, size_actors
from zrl.run.supervisor import Supervisor
from zrl.testing.fakes import welcome_message


def auto(**sections) -> ExperimentConfig:
    roles = {"actors": "auto", **sections.pop("roles", {})}
    return config_from_dict({"roles": roles, **sections})


@pytest.mark.parametrize(
    ("cores", "gpu", "actors"),
    [
        (2, False, 1),  # 2.5 cores reserved, rounded up to 3: at least one actor all the same
        (2, True, 1),
        (16, False, 13),  # broker .5 + CPU learner 1 + replay .5 + params, evaluator .25 each
        (16, True, 14),  # a learner on the GPU takes half a core
        (64, False, 61),
        (64, True, 62),
    ],
)
def test_auto_fills_the_cores_left_by_the_other_roles(cores, gpu, actors):
    cfg, chosen = resolve_auto_roles(auto(), cores=cores, gpu=gpu)
    assert chosen is not None
    assert cfg.roles.actors == chosen.actors == actors
    assert chosen.learner_on_gpu is gpu
    assert cfg.model_dump(mode="json")["roles"]["actors"] == actors  # the spec: a number


def test_the_rule_counts_the_learners_threads_and_the_learners_device():
    cpu = auto(learner={"device": "cpu", "torch_threads": 4})
    assert size_actors(cpu, cores=16, gpu=True).actors == 16 - 6  # .5 + 4 + .5 + .5 -> 6
    cuda = auto(learner={"device": "cuda", "torch_threads": 4})
    assert size_actors(cuda, cores=16, gpu=False).actors == 14  # cuda: on a GPU whatever
    two = auto(  # two learners of one policy: a data-parallel group (appo)
        algo="appo",
        roles={"learners": 2, "replay": 2},
        replay={"table": "fifo"},
        learner={"device": "cuda"},
    )
    assert size_actors(two, cores=16).actors == 16 - 3  # .5 + 2 x .5 + 2 x .5 + .5 -> 3


def test_auto_sizes_this_host_and_adds_the_actors_placed_elsewhere():
    cfg = auto(
        hosts=[{"name": "b", "roles": {"actors": 6, "replay": 1}}],
        roles={"replay": 2},
        learner={"device": "cpu"},
    )
    chosen = size_actors(cfg, cores=8)
    assert (chosen.actors_here, chosen.actors_elsewhere, chosen.actors) == (5, 6, 11)
    line = chosen.describe()
    assert line.startswith("roles.actors: auto -> 11: 5 here + 6 placed on other hosts")
    assert "8 cores less 3 for the broker, 1 learner on the CPU, 1 replay shard" in line


def test_a_number_is_kept_and_the_line_says_nothing():
    cfg = config_from_dict({"roles": {"actors": 3}})
    assert resolve_auto_roles(cfg, cores=64) == (cfg, None)


@pytest.mark.parametrize("value", ["many", "", -1, 2.5, True])
def test_roles_actors_is_a_number_within_bounds_or_auto(value):
    with pytest.raises(
        ConfigError, match=r"roles\.actors: Input should be a number from 0 to 16384, or auto"
    ):
        config_from_dict({"roles": {"actors": value}})
    with pytest.raises(
        ConfigError,
        match=r"roles\.actors: Input should be less than or equal to 16384 \(got 20000\)",
    ):
        config_from_dict({"roles": {"actors": 20_000}})
    assert config_from_dict({"roles": {"actors": "16"}}).roles.actors == 16  # --set gives text


def test_an_unresolved_auto_is_no_count_for_a_role():
    cfg = auto()
    assert cfg.roles.actors == "auto"
    assert cfg.roles.count("learners") == 1
    with pytest.raises(ValueError, match="resolved by the head"):
        cfg.roles.count("actors")


def test_a_resolved_count_is_checked_again(monkeypatch):
    """Exploiters need an actor each: a host too small for them fails as a number would."""
    cfg = auto(
        env={"id": "pettingzoo/tictactoe_v3"},
        algo="ppo",
        roles={"league": 1, "learners": 3, "replay": 0},
        league={"main_exploiters": 1, "league_exploiters": 1},
        learner={"device": "cpu"},
    )
    with pytest.raises(ConfigError, match=r"roles\.actors \(1\) must be at least"):
        resolve_auto_roles(cfg, cores=2)
    assert resolve_auto_roles(cfg, cores=16)[0].roles.actors == 16 - 5


def test_zrl_run_resolves_auto_prints_it_and_reports_its_wire_bytes(
    tmp_path: Path, monkeypatch, capsys
):
    """A short in-process run with ``roles.actors: auto`` on a 5-core host: two actors run,
    config.yaml carries the number, the head prints its choice, and summary.json says what
    each experience path carried per env step."""
    monkeypatch.setattr(sizing, "machine_size", lambda: (5, 2**34))
    cfg = auto(
        name="auto-actors",
        algo="appo",
        env={"num_envs": 4},
        model={"hidden": [16]},
        learner={"device": "cpu"},
        replay={"table": "fifo", "capacity": 8, "batch_size": 2, "min_size": 2},
        logging={"backends": ["csv"]},
        stop={"eval_return": None, "env_steps": 3000, "wall_time": 120},
    )
    sup = Supervisor(cfg, run_dir=tmp_path / "run", inproc=True, show_status=True)
    assert sup.cfg.roles.actors == 2
    assert {rid for rid in sup.roster.planned if rid.startswith("actor-")} == {
        "actor-0",
        "actor-1",
    }
    summary = sup.run()
    assert not summary["failed"], summary["error"]
    printed = capsys.readouterr().out
    assert "roles.actors: auto -> 2: 2 here (5 cores less 3 for the broker" in printed
    stored = yaml.safe_load((sup.run_dir / "config.yaml").read_text())
    assert stored["roles"]["actors"] == 2
    wire = json.loads((sup.run_dir / "summary.json").read_text())["wire"]
    assert set(wire) == {"trajectories", "batches"}
    for path in wire.values():
        # CartPole: 4 float32 of observation and a few figures per step, plus the headers.
        assert 16 < path["bytes_per_env_step"] < 400
        assert path["bytes_per_env_step"] == round(path["bytes"] / path["env_steps"], 1)


def test_a_role_refuses_a_spec_with_an_unresolved_auto(zmq_ctx):
    """The head resolves auto before the broker serves the spec: a WELCOME that still says
    auto (a broker started some other way) stops the role, saying so."""
    from zrl.roles.actor import Actor
    from zrl.roles.errors import RoleError

    spec = auto().model_dump(mode="json")
    welcome = welcome_message(spec, "actor-0")
    actor = Actor("tcp://127.0.0.1:1", index=0, ctx=zmq_ctx)
    try:
        with pytest.raises(RoleError, match=r"roles\.actors: auto, not a number"):
            actor._on_welcome(welcome)
    finally:
        actor.close()


def test_inference_roles_take_their_share_of_the_cores():
    gpu = auto(roles={"inference": 1}, algo="appo", replay={"table": "fifo"})
    gpu = gpu.model_copy(update={"learner": gpu.learner.model_copy(update={"device": "cuda"})})
    chosen = size_actors(gpu, cores=16, gpu=True)
    assert chosen.actors == 16 - 3  # .5 + .5 + .5 + .25 + .25 + 1 (inference on the GPU) -> 3
    assert "1 inference role on the GPU" in chosen.describe()
    cpu = auto(
        roles={"inference": 2},
        algo="appo",
        replay={"table": "fifo"},
        inference={"device": "cpu", "torch_threads": 2},
    )
    assert size_actors(cpu, cores=16, gpu=True).actors == 16 - 6  # 2 x 2 threads on the CPU
