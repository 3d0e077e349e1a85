"""PBT on the learner's side and the pbt role's pure parts: an exploit copies the source
member's weights and optimizer state exactly and sets the hyperparameters; instructions are
checked against the config; fitness comes from the planned actors' heartbeats."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

from zrl.config.experiment import ExperimentConfig
from zrl.roles.learner import Learner
from zrl.roles.params import ParameterServer
from zrl.roles.pbt import evaluated_fitness, exploit_instruction, member_fitness
from zrl.testing.fakes import Rpc, model_weights
from zrl.testing.inproc import InProc
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P

torch.set_num_threads(1)
BOUNDS = {"learner.lr": {"low": 1e-5, "high": 1e-2}, "ppo.entropy_coef": {"low": 1e-4, "high": 0.1}}


def config(tmp_path: Path) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "algo": "ppo",
            "seed": 1,
            "env": {"id": "CartPole-v1", "num_envs": 1},
            "model": {"hidden": [16]},
            "roles": {"actors": 4, "replay": 0, "learners": 2, "evaluator": 0, "pbt": 1},
            "ppo": {"entropy_coef": 0.01},
            "pbt": {"members": 2, "ready_interval_s": 10, "hyperparameters": BOUNDS},
            "checkpoint": {"dir": str(tmp_path), "interval": 5},
            "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0},
        }
    )


def learner(cfg: ExperimentConfig, index: int) -> Learner:
    """Learner ``index`` of the population without sockets, its update built."""
    role = Learner("inproc://unused", index=index)
    role.config = cfg
    role.id = f"learner-{index}"
    role.policy = cfg.learner_policy(index)
    probe = gym.make("CartPole-v1")
    role.update = role.make_update((probe.observation_space, probe.action_space))
    probe.close()
    role.checkpoint = role.checkpoint_path()
    return role


def adam_steps(role: Learner, steps: int, seed: int) -> None:
    """Gradient steps on a made-up loss: weights and Adam's moments away from the start."""
    update: Any = role.update
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        update.optimizer.zero_grad()
        params = update.model.parameters()
        loss = sum((p * torch.randn(p.shape, generator=gen)).sum() for p in params)
        loss.backward()
        update.optimizer.step()


def equal_states(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal_states(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(equal_states(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_exploit_copies_weights_and_optimizer_state_exactly_and_sets_hyperparameters(tmp_path):
    cfg = config(tmp_path)
    source, target = learner(cfg, 0), learner(cfg, 1)
    adam_steps(source, 5, seed=1)
    adam_steps(target, 3, seed=2)
    source.save_checkpoint()  # <dir>/learner-0.pt, as the running learner writes it
    assert (tmp_path / "learner-0.pt").is_file()
    target.update.rounds = 7  # type: ignore[attr-defined]
    saved = copy.deepcopy({k: v for k, v in source.update.state_dict().items() if k != "rounds"})
    adam_steps(source, 2, seed=3)  # the source goes on: the target takes what was saved
    new = {"learner.lr": 2e-3, "ppo.entropy_coef": 0.02}
    assert target.exploit("member_0", new)
    got: Any = target.update.state_dict()
    assert equal_states(got["online"], saved["online"])
    assert equal_states(got["optimizer"]["state"], saved["optimizer"]["state"])
    assert got["rounds"] == 7  # the target's own counters stay
    assert target.update.hyperparameters() == new  # type: ignore[attr-defined]
    groups = target.update.optimizer.param_groups  # type: ignore[attr-defined]
    assert all(g["lr"] == 2e-3 for g in groups)
    assert target.pbt_exploits == 1
    # Trained on from here, both go the same way: the copied Adam moments are the source's.
    twin = learner(cfg, 1)
    twin.update.load_state_dict({**saved, "rounds": 0})
    twin.update.set_hyperparameters(new)  # type: ignore[attr-defined]
    adam_steps(target, 2, seed=9)
    adam_steps(twin, 2, seed=9)
    assert equal_states(target.update.model.state_dict(), twin.update.model.state_dict())


def test_an_exploit_without_the_source_checkpoint_changes_nothing(tmp_path):
    cfg = config(tmp_path)
    target = learner(cfg, 1)
    before = target.update.state_dict()
    assert not target.exploit("member_0", {"learner.lr": 2e-3, "ppo.entropy_coef": 0.02})
    assert equal_states(target.update.state_dict(), before) and target.pbt_exploits == 0


def test_the_learner_applies_an_instruction_once_per_seq_and_only_its_own(tmp_path):
    cfg = config(tmp_path)
    source, target = learner(cfg, 0), learner(cfg, 1)
    adam_steps(source, 2, seed=1)
    source.save_checkpoint()
    sent: list[str] = []
    target.send_weights = lambda: sent.append("weights")  # type: ignore[method-assign]
    hp = {"learner.lr": 2e-3, "ppo.entropy_coef": 0.02}
    instruction = {"policy": "member_1", "source": "member_0", "seq": 3, "hyperparameters": hp}
    target.on_exploit(instruction)
    target.on_exploit(instruction)  # the same seq, in the next ACK: not again
    target.on_exploit({**instruction, "seq": 2})
    assert (target.pbt_exploits, target.pbt_seq, sent) == (1, 3, ["weights"])
    target.on_exploit({**instruction, "policy": "member_0", "source": "member_1", "seq": 4})
    bad = {**hp, "learner.lr": 1.0}  # outside the bounds: refused whoever sent it
    target.on_exploit({**instruction, "seq": 5, "hyperparameters": bad})
    assert (target.pbt_exploits, target.pbt_seq) == (1, 3)
    target.save_checkpoint()
    resumed = learner(cfg, 1)
    resumed.load_checkpoint()
    assert resumed.pbt_seq == 3
    assert resumed.update.hyperparameters() == hp  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "change, why",
    [
        ({"policy": "main"}, "not two of"),
        ({"source": "member_1"}, "not two of"),
        ({"seq": 0}, "seq"),
        ({"seq": True}, "seq"),
        ({"hyperparameters": {"learner.lr": 1e-3}}, "hyperparameters are not"),
        ({"hyperparameters": {"learner.lr": float("nan"), "ppo.entropy_coef": 0.01}}, "lr nan"),
        ({"hyperparameters": {"learner.lr": 1e-3, "ppo.entropy_coef": 0.5}}, "entropy_coef 0.5"),
    ],
)
def test_exploit_instructions_are_checked_against_the_config(tmp_path, change, why):
    cfg = config(tmp_path)
    good = {
        "policy": "member_1",
        "source": "member_0",
        "seq": 1,
        "hyperparameters": {"learner.lr": 1e-3, "ppo.entropy_coef": 0.01},
    }
    assert exploit_instruction(good, cfg) == good
    with pytest.raises(P.ProtocolError, match=why):
        exploit_instruction({**good, **change}, cfg)


def test_fitness_is_the_mean_return_of_each_members_planned_live_actors(tmp_path):
    cfg = config(tmp_path)

    def row(i: int, ret: Any, episodes: int = 3, state: str = "alive", **info: Any) -> dict:
        info = {"episode_return": ret, "episodes": episodes, **info}
        return {"id": f"actor-{i}", "role": "actor", "state": state, "info": info}

    rows = [
        row(0, 10.0),
        row(2, 30.0, policy="member_1"),  # actor 2 acts for member_0 (config), whatever it says
        row(1, 5.0, episodes=1),
        row(3, 7.0, state="dead"),
        row(9, 1000.0),  # not a planned actor
        row(1, float("inf")),
    ]
    assert member_fitness(rows, cfg, min_episodes=3) == {"member_0": 20.0, "member_1": 5.0}
    assert member_fitness(rows, cfg, min_episodes=5) == {"member_0": 20.0}  # 6 and 4 episodes


def test_evaluated_fitness_is_each_members_latest_evaluation_of_weights_newer_than_its_floor(
    tmp_path,
):
    """``pbt.fitness: evaluation``: evaluator i's latest mean ranks member i (the config's
    ``evaluator_policy``, whatever the row says), once it evaluated weights newer than the
    member's floor (the version its learner held when it confirmed its last exploit)."""
    data = config(tmp_path).model_dump()
    data["roles"]["evaluator"] = 2
    data["pbt"]["fitness"] = "evaluation"
    cfg = ExperimentConfig.model_validate(data)

    def row(i: int, ret: Any, version: Any = 5, state: str = "alive", **info: Any) -> dict:
        info = {"eval_return": ret, "evaluated_version": version, **info}
        return {"id": f"evaluator-{i}", "role": "evaluator", "state": state, "info": info}

    rows = [row(0, 40.0, policy="member_1"), row(1, 12.5, version=3), row(7, 500.0)]
    assert evaluated_fitness(rows, cfg, {}) == {"member_0": 40.0, "member_1": 12.5}
    floors = {"member_1": 3}  # member_1 was exploited at v3: its v3 evaluation is stale
    assert evaluated_fitness(rows, cfg, floors) == {"member_0": 40.0}
    odd = [row(0, float("nan")), row(1, 9.0, version=True), row(0, 1.0, state="dead")]
    assert evaluated_fitness(odd, cfg, {}) == {}


def test_params_takes_exploit_only_from_the_pbt_role_and_hands_it_to_that_members_learner(
    zmq_ctx, tmp_path
):
    cfg = config(tmp_path)
    inproc = InProc(zmq_ctx, "pbt-params")
    peers: list[Rpc] = []
    try:
        inproc.start_broker(cfg)
        params = inproc.start(ParameterServer, index=0)
        assert isinstance(params, ParameterServer)

        def rpc(sender: str | None) -> Rpc:
            peer = Rpc(
                zmq_ctx,
                params.rpc_endpoint,
                sender=sender or "learner-0",
                broker=inproc.addr if sender else None,
            )
            peers.append(peer)
            return peer

        hp = {"learner.lr": 2e-3, "ppo.entropy_coef": 0.02}
        instruction = {"policy": "member_1", "source": "member_0", "seq": 1, "hyperparameters": hp}
        for sender in (None, "actor-0", "learner-0", "league-0"):
            rpc(sender).send(P.Message(P.EXPLOIT, meta=instruction))
        wait_for(lambda: params.weights_refused == 4, timeout=10)
        assert params.streams["member_1"].exploit is None
        pbt = rpc("pbt-0")
        pbt.send(P.Message(P.EXPLOIT, meta={**instruction, "seq": 2, "source": "member_9"}))
        pbt.send(P.Message(P.EXPLOIT, meta={**instruction, "seq": 3}))
        wait_for(lambda: params.streams["member_1"].exploit is not None, timeout=10)
        pbt.send(P.Message(P.EXPLOIT, meta={**instruction, "seq": 2}))  # older: kept newest
        learner = rpc("learner-1")
        meta = {"policy": "member_1", "updates": 1, "min_version": 1}
        ack = learner.request(P.Message(P.WEIGHTS, meta=meta, arrays=model_weights(cfg, 1)))
        assert ack.kind == P.ACK and "exploit" not in ack.meta
        control = learner.request(P.Message(P.GET_CONTROL, meta={"policy": "member_1"}))
        assert control.kind == P.CONTROL and control.meta["exploit"] == {**instruction, "seq": 3}
        assert params.weights_refused == 4
        assert params.stats.snapshot()["rpc"]["dropped"] == 5  # the unknown source too
    finally:
        for peer in peers:
            peer.close()
        inproc.close()
