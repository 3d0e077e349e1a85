"""``PPOUpdate``: the learner side of PPO, built as the generic learner role builds it, fed
rollout messages and trained without sockets (PPO opens none; two DD-PPO learners form their
process group as threads of this process)."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.helpers.frames import SHAPE, Collector, scripted_actions
from tests.helpers.ranks import run_ranks
from zrl.algos.api.actor import Trajectory
from zrl.algos.api.learner import NonFiniteLossError, UpdateResult
from zrl.algos.models import build_model
from zrl.algos.ppo import update as ppo_update
from zrl.algos.ppo.config import PPOConfig
from zrl.algos.ppo.policy import make_policy
from zrl.algos.ppo.rounds import Rollout, round_tensors
from zrl.algos.ppo.update import PPOUpdate
from zrl.config.experiment import ExperimentConfig
from zrl.testing.fakes import actor_setup, as_message, learner_setup
from zrl.testing.probes import wait_for
from zrl.transport import messages as M
from zrl.transport import protocol as P

torch.set_num_threads(1)
OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)  # CartPole's
ACT_SPACE = gym.spaces.Discrete(2)
E, T = 2, 8  # env.num_envs, actor.trajectory_length


class FakeChannel:
    """Enough of a ``Channel`` for a follower's weights SUB: received messages are queued by
    the test (none here)."""

    def __init__(self) -> None:
        self.inbox: list[P.Message] = []

    def recv(self, *, block: bool = True) -> tuple[bytes | None, P.Message] | None:
        return (None, self.inbox.pop(0)) if self.inbox else None


class FakeServices:
    """The role's services: no sockets (PPO opens none of its own); a DD-PPO learner finds
    learner 0's heartbeat info in ``registry`` (the broker's STATUS), and a follower follows
    weights on a ``FakeChannel``."""

    def __init__(self, registry: dict[str, dict[str, Any]] | None = None) -> None:
        self.id = "learner-test"
        self.advertise = "127.0.0.1"
        self.stop_event = threading.Event()
        self.ticks = 0
        self.registry = registry

    def open_publisher(self, name: str = "topics", *, hwm: int = 1000) -> Any:
        raise AssertionError(f"a PPO learner opened a publisher {name!r}")

    def open_subscriber(self, topics: list[str], name: str, *, hwm: int = 1000) -> Any:
        raise AssertionError(f"a PPO learner opened a subscriber {name!r}")

    def tick(self) -> None:
        self.ticks += 1

    def follow_weights(self, model: Any) -> Any:
        if self.registry is None:
            raise AssertionError("the leader follows no weights")
        return SimpleNamespace(sub=FakeChannel(), version=0)

    def role_info(self, role_id: str) -> dict[str, Any] | None:
        if self.registry is None:
            raise AssertionError(f"a single learner asked for {role_id!r}")
        return self.registry.get(role_id)


def make_config(learners: int = 1) -> ExperimentConfig:
    return ExperimentConfig(
        algo="ppo",
        seed=3,
        roles={"actors": 2, "learners": learners, "replay": 0, "params": 1, "evaluator": 0},
        env={"num_envs": E},
        actor={"trajectory_length": T},
        ppo={"epochs": 3, "minibatch_size": 8},
    )


def make_update(
    cfg: ExperimentConfig | None = None, services: FakeServices | None = None, index: int = 0
) -> PPOUpdate:
    cfg = cfg or make_config()
    torch.manual_seed(0)
    model = build_model(OBS_SPACE, ACT_SPACE, cfg.model, "ppo")
    setup = learner_setup(
        cfg, model, OBS_SPACE, ACT_SPACE, index=index, services=services or FakeServices()
    )
    return PPOUpdate(setup)


def rollout_msg(actor: int, version: int = 1, seed: int = 0) -> P.Message:
    """A well-formed ``unroll`` TRAJECTORY: env 0's episode ends at t=3 (t=4 is the reset
    step, invalid), env 1 is truncated at the last step."""
    rng = np.random.default_rng(seed + actor)
    term, trunc, valid = np.zeros((E, T), bool), np.zeros((E, T), bool), np.ones((E, T), bool)
    term[0, 3], valid[0, 4], trunc[1, T - 1] = True, False, True
    arrays: dict[str, np.ndarray] = {
        "obs": rng.normal(size=(E, T, 4)).astype(np.float32),
        "action": rng.integers(2, size=(E, T)).astype(np.int64),
        "logp": np.full((E, T), math.log(0.5), np.float32),
        "reward": np.ones((E, T), np.float32),
        "terminated": term,
        "truncated": trunc,
        "valid": valid,
        "bootstrap_obs": rng.normal(size=(E, 4)).astype(np.float32),
    }
    return P.Message(
        P.TRAJECTORY,
        meta={"weights_version": version, "actor": actor, "env_steps": E * T},
        arrays=arrays,
        sender=f"actor-{actor}",
    )


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_trains_a_round_of_one_rollout_per_actor():
    up = make_update()
    before = params(up.model)
    assert up.may_publish()  # a single learner needs no handshake
    assert up.train(1) is None  # nothing received
    up.receive(rollout_msg(0), 1)
    assert up.train(1) is None  # one actor of two: the round is incomplete
    up.receive(rollout_msg(1), 1)
    result = up.train(1)
    assert isinstance(result, UpdateResult)
    assert result.publish
    per_epoch = 2 * E * T // 8  # round_size * num_envs * trajectory_length // minibatch
    assert result.updates == 3 * per_epoch
    assert math.isfinite(result.loss)
    assert result.priorities is None
    assert any(not torch.equal(before[k], v) for k, v in params(up.model).items())
    assert up.rounds == 1 and up.buffer.trained_version == 1
    assert up.weights_meta() == {"rounds": 1}
    assert up.train(1) is None  # the round was consumed
    info = up.heartbeat_info()
    assert info["rounds"] == 1 and info["round_versions"] == [1] and info["mixed_rounds"] == 0
    assert 0 < info["busy"] <= 1
    assert {"approx_kl", "clip_fraction", "entropy"} <= set(info)
    assert "group_rank" not in info and "weight_drift" not in info
    assert up.train_info() == {"lr": make_config().learner.lr}
    assert up.summary().startswith("1 rounds (sync), 12 updates, mixed-version rounds 0")
    # A rollout of the version just trained is stale in sync mode: counted, not kept.
    up.receive(rollout_msg(0), 1)
    assert up.buffer.stale == 1 and not up.buffer.pending


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_round_on_a_gpu_trains_as_on_the_cpu():
    """``learner.device: cuda``: the round's tensors go to the GPU once and its minibatches
    are cut there; the weights after a round match the CPU learner's (float tolerance)."""
    ups = []
    for device in ("cpu", "cuda"):
        cfg = make_config()
        torch.manual_seed(0)
        model = build_model(OBS_SPACE, ACT_SPACE, cfg.model, "ppo").to(device)
        setup = learner_setup(cfg, model, OBS_SPACE, ACT_SPACE, services=FakeServices())
        setup.device = device
        up = PPOUpdate(setup)
        for actor in (0, 1):
            up.receive(rollout_msg(actor), 1)
        result = up.train(1)
        assert result is not None and result.updates == 3 * (2 * E * T // 8)
        ups.append(up)
    cpu, gpu = (params(up.model) for up in ups)
    assert all(v.device.type == "cuda" for v in gpu.values())
    for k, v in cpu.items():
        torch.testing.assert_close(gpu[k].cpu(), v, rtol=1e-4, atol=1e-5)


def test_ticks_during_a_long_round():
    services = FakeServices()
    up = make_update(services=services)
    up.receive(rollout_msg(0), 1)
    up.receive(rollout_msg(1), 1)
    result = up.train(1)
    assert result is not None
    assert services.ticks == result.updates // 16


def with_array(name: str, value: np.ndarray) -> P.Message:
    msg = rollout_msg(0)
    msg.arrays[name] = value
    return msg


def nan_obs() -> P.Message:
    obs = rollout_msg(0).arrays["obs"].copy()
    obs[1, 2, 3] = np.nan
    return with_array("obs", obs)


def without(array: str = "", meta: str = "") -> P.Message:
    msg = rollout_msg(0)
    msg.arrays.pop(array, None)
    msg.meta.pop(meta, None)
    return msg


def with_meta(**meta: Any) -> P.Message:
    msg = rollout_msg(0)
    msg.meta.update(meta)
    return msg


def empty() -> P.Message:
    msg = rollout_msg(0)
    msg.arrays = {k: v if k == "bootstrap_obs" else v[:, :0] for k, v in msg.arrays.items()}
    return msg


MALFORMED = {
    "wrong dtype": lambda: with_array("obs", np.zeros((E, T, 4), np.float64)),
    "non-finite obs": nan_obs,
    "action out of range": lambda: with_array("action", np.full((E, T), 2, np.int64)),
    "negative action": lambda: with_array("action", np.full((E, T), -1, np.int64)),
    "wrong obs width": lambda: with_array("obs", np.zeros((E, T, 5), np.float32)),
    "missing array": lambda: without(array="logp"),
    "missing actor meta": lambda: without(meta="actor"),
    "non-integer version": lambda: with_meta(weights_version="1"),
    "boolean actor": lambda: with_meta(actor=True),
    "wrong kind": lambda: P.Message(P.BATCH, rollout_msg(0).meta, rollout_msg(0).arrays),
    "empty": empty,
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_rollouts_raise_protocol_error(case: str):
    up = make_update()
    with pytest.raises(P.ProtocolError):
        up.receive(MALFORMED[case](), 1)
    assert not up.buffer.pending


def test_non_finite_loss_names_the_round_and_keeps_the_weights():
    up = make_update()
    up.receive(rollout_msg(0), 1)
    up.receive(rollout_msg(1), 1)
    with torch.no_grad():
        next(up.model.parameters()).fill_(float("nan"))
    before = params(up.model)
    with pytest.raises(NonFiniteLossError) as info:
        up.train(1)
    assert info.value.source == "round 1"
    after = params(up.model)
    assert all(torch.equal(before[k].nan_to_num(7.0), after[k].nan_to_num(7.0)) for k in before)
    assert up.rounds == 0


def test_state_dict_round_trip():
    up = make_update()
    up.receive(rollout_msg(0), 1)
    up.receive(rollout_msg(1), 1)
    assert up.train(1) is not None
    state = up.state_dict()
    assert set(state) == {"online", "optimizer", "rounds", "trained_version", "entropy_coef"}
    other = make_update()
    assert any(not torch.equal(params(up.model)[k], v) for k, v in params(other.model).items())
    other.load_state_dict(state)
    assert all(torch.equal(params(up.model)[k], v) for k, v in params(other.model).items())
    assert other.rounds == 1 and other.buffer.trained_version == 1
    assert other.optimizer.state_dict()["state"].keys() == up.optimizer.state_dict()["state"].keys()
    # Resumed: rollouts of the version already trained are stale, newer ones train.
    other.receive(rollout_msg(0, version=1), 1)
    assert other.buffer.stale == 1
    other.receive(rollout_msg(0, version=2), 2)
    other.receive(rollout_msg(1, version=2), 2)
    result = other.train(2)
    assert result is not None and other.rounds == 2


def test_a_dd_ppo_follower_takes_learner_0s_rounds_and_value_statistics_as_the_group_forms():
    """A follower resumed (or restarted) with other value-normalizer statistics, another
    entropy bonus and round count takes learner 0's as the group forms: otherwise it would
    scale its value targets differently and its weights would part from learner 0's."""
    registry: dict[str, dict[str, Any]] = {}
    cfg = make_config(learners=2).model_copy(deep=True)
    cfg.section(PPOConfig).normalize_returns = True
    leader = make_update(cfg, FakeServices(registry), index=0)
    follower = make_update(cfg, FakeServices(registry), index=1)
    registry["learner-0"] = leader.heartbeat_info()
    assert leader.value_normalizer is not None and follower.value_normalizer is not None
    leader.value_normalizer.update(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    follower.value_normalizer.update(torch.tensor([50.0, -7.0], dtype=torch.float64))
    follower.rounds, follower.entropy_coef = 9, 0.5
    try:
        run_ranks(lambda r: wait_for((leader, follower)[r].members.poll, timeout=120))
        assert follower.value_normalizer.state_dict() == leader.value_normalizer.state_dict()
        assert (follower.rounds, follower.entropy_coef) == (leader.rounds, leader.entropy_coef)
    finally:
        leader.close()
        follower.close()


def test_dd_ppo_learners_form_their_group_and_train_identical_rounds():
    """Two DD-PPO learners (threads of this process, as ``--inproc`` runs them): the leader
    shows its store address, the follower finds it through the "broker", the group forms,
    and a round trained by both on the same rollouts leaves bit-identical weights."""
    registry: dict[str, dict[str, Any]] = {}
    cfg = make_config(learners=2)
    leader = make_update(cfg, FakeServices(registry), index=0)
    follower = make_update(cfg, FakeServices(registry), index=1)
    assert leader.group is not None and follower.group is not None
    assert not leader.may_publish() and not follower.may_publish()
    info = leader.heartbeat_info()
    assert info["group_store"] == leader.group.address and info["group_formed"] is False
    assert "group_store" not in follower.heartbeat_info()
    registry["learner-0"] = info  # what the leader's heartbeat tells the broker
    before = params(leader.model)
    results: dict[int, Any] = {}

    def run(up: PPOUpdate) -> None:
        while not up.group_ready:
            assert up.train(0) is None
        for actor in (0, 1):
            up.receive(rollout_msg(actor, version=1), 1)
        results[up.learner_index] = up.train(1)

    threads = [threading.Thread(target=run, args=(up,)) for up in (leader, follower)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert set(results) == {0, 1} and all(r is not None for r in results.values())
        assert leader.may_publish() and not follower.may_publish()
        assert leader.rounds == follower.rounds == 1
        after, other = params(leader.model), params(follower.model)
        assert all(torch.equal(after[k], other[k]) for k in after)
        assert any(not torch.equal(after[k], before[k]) for k in after)
        assert follower.heartbeat_info()["group_formed"] is True
    finally:
        leader.close()
        follower.close()


def test_a_members_dd_ppo_learners_take_learner_0s_exploit_before_the_next_round():
    """PBT with a DD-PPO group per member: only learner 0 hears an exploit (it loads the
    better member's weights and Adam state and sets the hyperparameters); before the next
    round the group finds it (an all-reduce of the exploit counts) and every learner takes
    learner 0's state, learning rate and entropy bonus: the round leaves them identical."""
    registry: dict[str, dict[str, Any]] = {}
    # Two members, a group of two learners each (learners 0 and 1 train member_0, whose
    # actors are 0 and 2).
    cfg = make_config(learners=4).model_copy(deep=True)
    cfg.roles.actors, cfg.roles.pbt = 4, 1
    cfg.checkpoint.interval = 5
    cfg.pbt.members, cfg.pbt.ready_interval_s = 2, 10
    ups = [make_update(cfg, FakeServices(registry), index=i) for i in (0, 1)]
    leader, follower = ups
    assert cfg.learner_policy(1) == "member_0" and follower.learner_index == 1
    registry["learner-0"] = leader.heartbeat_info()

    def run(rank: int) -> None:
        up = ups[rank]
        while not up.group_ready:
            assert up.train(0) is None
        if rank == 0:  # what Learner.exploit does with the source member's checkpoint
            with torch.no_grad():
                next(up.model.parameters()).add_(0.5)
            up.set_hyperparameters({"learner.lr": 5e-4, "ppo.entropy_coef": 0.02})
        for actor in (0, 2):  # member_0's actors
            up.receive(rollout_msg(actor, version=1), 1)
        assert up.train(1) is not None

    try:
        run_ranks(run)
        after, other = params(leader.model), params(follower.model)
        assert all(torch.equal(after[k], other[k]) for k in after)
        assert follower.hyperparameters() == leader.hyperparameters()
        assert follower.hyperparameters() == {"learner.lr": 5e-4, "ppo.entropy_coef": 0.02}
        assert leader.exploits == follower.exploits == 1
    finally:
        leader.close()
        follower.close()


# ----------------------------------------------------------------------------- frame rollouts

K, FE, FT = 4, 5, 8  # frames per stack, env.num_envs, actor.trajectory_length
FRAME_SPACE = gym.spaces.Box(0, 255, (K, *SHAPE), np.uint8)
FRAME_ACTIONS = gym.spaces.Discrete(3)  # CONTINUE, TERMINATE, TRUNCATE: the scripted envs'


def frame_config(core: str = "none") -> ExperimentConfig:
    return ExperimentConfig(
        algo="ppo",
        seed=3,
        roles={"actors": 3, "learners": 1, "replay": 0, "params": 1, "evaluator": 0},
        env={"num_envs": FE},
        actor={"trajectory_length": FT},
        model={"encoder": "mlp", "hidden": [16], "core": core},
        ppo={"epochs": 1, "minibatch_size": 8},
    )


def frame_update(cfg: ExperimentConfig) -> PPOUpdate:
    torch.manual_seed(0)
    model = build_model(FRAME_SPACE, FRAME_ACTIONS, cfg.model, "ppo")
    return PPOUpdate(learner_setup(cfg, model, FRAME_SPACE, FRAME_ACTIONS))


def frame_rollouts() -> tuple[list[P.Message], list[dict[str, np.ndarray]]]:
    """Three rollouts (actors 0, 1, 2, version 1) of scripted frame-stacked envs with episode
    ends everywhere (``tests.helpers.frames``), as the PPO actor's policy sends them, and the
    collector's trajectories with their log-probabilities."""
    cfg = frame_config()
    model = build_model(FRAME_SPACE, FRAME_ACTIONS, cfg.model, "ppo")
    policy = make_policy(actor_setup(cfg, model, FRAME_SPACE, FRAME_ACTIONS, FE))
    collector = Collector(FE, K)
    rng = np.random.default_rng(5)
    msgs, trajs = [], []
    for actor, actions in enumerate(scripted_actions(FT, FE)):
        traj = collector.collect(actions)
        traj["logp"] = np.log(rng.uniform(0.2, 0.6, (FE, FT))).astype(np.float32)
        out = policy.finish(
            Trajectory(
                obs=traj["obs"],
                next_obs=None,
                action=traj["action"],
                reward=traj["reward"],
                terminated=traj["terminated"],
                truncated=traj["truncated"],
                valid=traj["valid"],
                final_obs=traj["final_obs"],
                extras={"logp": traj["logp"]},
            )
        )
        assert out.kind == P.TRAJECTORY and set(out.arrays) == set(M.FRAME_UNROLL.arrays)
        assert out.arrays["frames"].shape == (FE, FT + K, *SHAPE)
        msgs.append(as_message(out.arrays, weights_version=1, actor=actor))
        trajs.append(traj)
    return msgs, trajs


def stack_arrays(traj: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The full-stack ``unroll`` arrays of a collected trajectory."""
    arrays = {k: traj[k] for k in M.UNROLL.arrays if k in traj}
    return {**arrays, "bootstrap_obs": traj["final_obs"]}


def test_frame_rollouts_train_on_the_stacks_the_envs_produced(monkeypatch):
    """The PPO actor sends each frame once; the learner's round is built from exactly the
    stacks the frame-stacked envs produced, across episode ends: the same samples, values,
    advantages and returns as the round of the full stacks."""
    up = frame_update(frame_config())
    assert up.schema is M.FRAME_UNROLL
    msgs, trajs = frame_rollouts()
    seen: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = []

    def recording(model, rollouts, gamma, lam, frames=False, value_normalizer=None, device="cpu"):
        data = round_tensors(
            model,
            rollouts,
            gamma,
            lam,
            frames=frames,
            value_normalizer=value_normalizer,
            device=device,
        )
        stacks = [Rollout(r.version, r.actor, stack_arrays(trajs[r.actor])) for r in rollouts]
        seen.append((data, round_tensors(model, stacks, gamma, lam)))
        return data

    monkeypatch.setattr(ppo_update, "round_tensors", recording)
    for msg in msgs:
        up.receive(msg, 1)
    result = up.train(1)
    valid = np.concatenate([t["valid"] for t in trajs])
    assert result is not None and result.samples == valid.sum() and len(seen) == 1
    data, reference = seen[0]
    stacks = np.concatenate([t["obs"] for t in trajs])[valid]
    assert data["obs"].dtype == torch.uint8
    np.testing.assert_array_equal(data["obs"].numpy(), stacks)
    assert set(data) == set(reference)
    for name, want in reference.items():
        torch.testing.assert_close(data[name], want, rtol=0, atol=0, msg=name)


def test_frame_learners_refuse_full_stacks_and_forged_frames():
    """The layout comes from the observation space at setup, never from the message: a frame
    learner refuses full stacks and frames that do not make T + k per row; a learner of full
    stacks (float observations, or a recurrent model on frames) refuses frames."""
    up = frame_update(frame_config())
    msgs, trajs = frame_rollouts()
    good = dict(msgs[0].arrays)
    frames = good["frames"]
    forged = {
        "full stacks": stack_arrays(trajs[0]),
        "frames and stacks": {**good, "obs": trajs[0]["obs"]},
        "a frame short": {**good, "frames": frames[:, 1:]},
        "a frame over": {**good, "frames": np.concatenate([frames, frames[:, :1]], axis=1)},
        "narrower frames": {**good, "frames": frames[..., 1:]},
        "float frames": {**good, "frames": frames.astype(np.float32)},
    }
    for name, arrays in forged.items():
        with pytest.raises(P.ProtocolError):
            up.receive(as_message(arrays, weights_version=1, actor=0), 1)
            pytest.fail(f"{name}: accepted")
    assert not up.buffer.pending
    up.receive(msgs[0], 1)
    assert len(up.buffer.pending) == 1
    recurrent = frame_update(frame_config(core="gru"))
    assert recurrent.schema is M.RECURRENT_UNROLL
    for learner in (make_update(), recurrent):
        with pytest.raises(P.ProtocolError, match="lacks array 'obs'"):
            learner.receive(msgs[0], 1)
        assert not learner.buffer.pending
