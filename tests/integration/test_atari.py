"""Atari through the generic roles, in one process: frames stay uint8 at every hop.

Pong via ale-py's AtariVectorEnv -> actor (Nature CNN Q-network) -> ``frame_transitions`` on the
experience stream -> a replay shard's FrameTable -> uint8 stacks in the batches -> the learner,
which trains on them and publishes weights that the actor adopts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from zrl.algos.apex_dqn.update import ApexDQNUpdate
from zrl.codecs.frames import stacks_from_frames
from zrl.config.experiment import ExperimentConfig
from zrl.replay.frames import FrameTable
from zrl.roles.actor import Actor
from zrl.roles.learner import Learner
from zrl.roles.params import ParameterServer
from zrl.roles.replay import ReplayServer
from zrl.testing.inproc import collect
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P

pytest.importorskip("ale_py")
torch.set_num_threads(1)


def atari_config(**sections: Any) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "atari-test",
            "seed": 3,
            "algo": "apex_dqn",
            "env": {"id": "ALE/Pong-v5", "num_envs": 2},
            "model": {"encoder": "nature_cnn"},
            "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 10.0, "setup_grace": 30.0},
            "roles": {"actors": 1, "replay": 1, "params": 1, "learners": 1, "evaluator": 0},
            "actor": {"trajectory_length": 16, "max_in_flight": 2},
            "replay": {
                "table": "prioritized",
                "capacity": 4000,
                "n_step": 3,
                "batch_size": 16,
                "min_size": 64,
                "samples_per_insert": 0,
                "prefetch": 2,
            },
            "learner": {"publish_interval": 2, "device": "cpu"},
            **sections,
        }
    )


def test_pong_frames_stay_uint8_from_env_to_learner(inproc, monkeypatch):
    seen: list[tuple[str, Any, tuple[int, ...]]] = []
    receive = ApexDQNUpdate.receive

    def spy(self: ApexDQNUpdate, msg: P.Message, version: int) -> None:
        seen.extend((k, v.dtype, v.shape) for k, v in msg.arrays.items() if "obs" in k)
        receive(self, msg, version)

    monkeypatch.setattr(ApexDQNUpdate, "receive", spy)
    inproc.start_broker(atari_config())
    inproc.start(ParameterServer)
    replay = inproc.start(ReplayServer, index=0)
    learner = inproc.start(Learner, index=0)
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor) and isinstance(learner, Learner)
    assert isinstance(replay, ReplayServer)
    assert actor.obs.dtype == np.uint8 and actor.obs.shape == (2, 4, 84, 84)

    wait_for(lambda: learner.updates >= 4, timeout=120, interval=0.2)
    # The shard stores single frames, one per step plus k per trajectory row.
    table = replay.table
    assert isinstance(table, FrameTable) and table.stack == 4 and table.frame_shape == (84, 84)
    assert table.frame_inserts == replay.trajectories * 2 * (16 + 4)
    # Every batch the learner took held uint8 stacks, never a float copy.
    assert seen and {(k, d, s[1:]) for k, d, s in seen} == {
        ("obs", np.dtype(np.uint8), (4, 84, 84)),
        ("next_obs", np.dtype(np.uint8), (4, 84, 84)),
    }
    wait_for(lambda: actor.weights.version >= 1, timeout=60, interval=0.2)
    info = learner.heartbeat_info()
    assert info["updates"] >= 4
    # Each update trained one batch of 16 distinct transitions (progress.csv sums this).
    assert info["samples_trained"] >= 16 * 4 and info["samples_trained"] % 16 == 0


def test_pong_unrolls_carry_each_frame_once_and_appo_rebuilds_the_stacks(inproc, monkeypatch):
    """``frame_unroll`` from the actor, each env's frames ``[T + 4, 84, 84]`` in the FIFO,
    ``frame_unroll_batch`` to the learner, which rebuilds the actor's uint8 stacks exactly."""
    from zrl.algos.appo.update import AppoUpdate
    from zrl.algos.kernel.sampling import CategoricalPolicy
    from zrl.algos.kernel.unrolls import UnrollUpdate

    sent: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}  # logp row -> (obs, bootstrap obs)
    seen: list[tuple[str, Any, tuple[int, ...]]] = []
    trained: list[dict[str, torch.Tensor]] = []
    finish, receive, train_unrolls = (
        CategoricalPolicy.finish,
        UnrollUpdate.receive,
        AppoUpdate.train_unrolls,
    )

    def spy_finish(self: CategoricalPolicy, trajectory: Any) -> Any:
        for e, logp in enumerate(trajectory.extras["logp"]):
            sent[logp.tobytes()] = (trajectory.obs[e].copy(), trajectory.final_obs[e].copy())
        return finish(self, trajectory)

    def spy_receive(self: UnrollUpdate, msg: P.Message, version: int) -> None:
        seen.extend((k, v.dtype, v.shape) for k, v in msg.arrays.items())
        receive(self, msg, version)

    def spy_train(self: AppoUpdate, batch: dict[str, torch.Tensor]) -> Any:
        trained.append({k: v.clone() for k, v in batch.items()})
        return train_unrolls(self, batch)

    monkeypatch.setattr(CategoricalPolicy, "finish", spy_finish)
    monkeypatch.setattr(UnrollUpdate, "receive", spy_receive)
    monkeypatch.setattr(AppoUpdate, "train_unrolls", spy_train)
    cfg = atari_config(
        algo="appo",
        replay={
            "table": "fifo",
            "capacity": 8,
            "batch_size": 4,
            "min_size": 4,
            "samples_per_insert": 0,
            "prefetch": 1,
        },
        appo={"epochs": 1, "minibatches": 2},
    )
    inproc.start_broker(cfg)
    inproc.start(ParameterServer)
    replay = inproc.start(ReplayServer, index=0)
    learner = inproc.start(Learner, index=0)
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor) and isinstance(learner, Learner)
    assert isinstance(replay, ReplayServer) and replay.layout.schema.name == "frame_unroll"
    wait_for(lambda: learner.updates >= 4, timeout=120, interval=0.2)
    arrays = {k: (d, s) for k, d, s in seen}
    assert "obs" not in arrays and "bootstrap_obs" not in arrays
    assert {s for k, d, s in seen if k == "frames"} == {(4, 16 + 4, 84, 84)}  # 4 unrolls
    assert arrays["frames"][0] == np.dtype(np.uint8)
    assert replay.table.column("frames").shape[1:] == (16 + 4, 84, 84)
    # The learner trained on the stacks the actor's env gave, rebuilt on its device.
    assert trained
    for batch in trained:
        assert batch["obs"].dtype == torch.uint8 and batch["obs"].shape == (4, 16, 4, 84, 84)
        for b, logp in enumerate(batch["logp"].numpy()):
            obs, bootstrap = sent[logp.tobytes()]
            np.testing.assert_array_equal(batch["obs"][b].numpy(), obs)
            np.testing.assert_array_equal(batch["bootstrap_obs"][b].numpy(), bootstrap)
    # A CPU learner trains its CNN channels-last (learner.memory_format: auto); the actor
    # below still loads the weights it publishes.
    conv = next(m for m in learner.online.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    wait_for(lambda: actor.weights.version >= 1, timeout=60, interval=0.2)
    # Each batch's valid steps count once, whatever the minibatches (progress.csv sums this).
    assert learner.heartbeat_info()["samples_trained"] >= 64


def test_pong_with_two_env_groups_sends_uint8_unrolls_of_every_env(inproc):
    """actor.env_groups: 2 over 4 Pong envs: two AtariVectorEnvs of 2 (send/recv), one
    [4, T] uint8 unroll per trajectory; group 1's rows are what its envs give alone."""
    from zrl.envs.vector import EnvGroups, make_vector_env

    cfg = atari_config(
        algo="appo",
        env={"id": "ALE/Pong-v5", "num_envs": 4},
        actor={"trajectory_length": 16, "max_in_flight": 2, "env_groups": 2},
        replay={"table": "fifo", "capacity": 8, "batch_size": 4, "min_size": 4},
        roles={"actors": 1, "replay": 1, "params": 0, "learners": 0, "evaluator": 0},
    )
    inproc.start_broker(cfg)
    experience = inproc.pull("experience")
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor) and isinstance(actor.envs, EnvGroups)
    assert [g.mode for g in actor.envs.groups] == ["send", "send"]
    msgs = collect(experience, until=2, timeout=60)
    assert [m.seq for m in msgs] == [0, 1]
    for m in msgs:
        a = m.arrays
        assert a["frames"].dtype == np.uint8 and a["frames"].shape == (4, 16 + 4, 84, 84)
        assert a["valid"].shape == a["logp"].shape == a["action"].shape == (4, 16)
        assert np.isfinite(a["logp"]).all()
    assert inproc.error_of(actor) is None
    # Group 1 (rows 2, 3), stepped alone from its seed with the same actions, gives the same.
    first = dict(msgs[0].arrays)
    first["obs"] = stacks_from_frames(
        torch.from_numpy(np.array(first["frames"])), torch.from_numpy(np.array(first["valid"]))
    )[0].numpy()
    alone = make_vector_env(cfg.env, num_envs=2)
    obs, _ = alone.reset(seed=actor.seed + 2)
    np.testing.assert_array_equal(first["obs"][2:, 0], obs)
    for t in range(15):
        obs, r, *_ = alone.step(first["action"][2:, t])
        np.testing.assert_array_equal(first["obs"][2:, t + 1], obs)
        np.testing.assert_array_equal(first["reward"][2:, t], r)
    alone.close()
