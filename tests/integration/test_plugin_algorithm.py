"""The plug-in surface: an algorithm defined here, registered, trains CartPole through the
real generic roles (broker, actor, replay, params, learner, evaluator as threads).

``tiny_q`` is one-step Q-learning with a target network: an epsilon-greedy actor policy and a
learner update of a dozen lines each, and its own config section ``tiny_q:``. Nothing in
``zrl/roles`` or ``zrl/config/experiment.py`` knows it exists.
docs/adding_an_algorithm.md walks through the same code.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import Field

import zrl
from zrl.algos.api import (
    ActorSetup,
    Algorithm,
    BasePolicy,
    BaseUpdate,
    LearnerSetup,
    Outgoing,
    Pieces,
    Trajectory,
    UpdateResult,
    Wiring,
)
from zrl.algos.kernel.optim import checked_step, make_adam
from zrl.algos.registry import register, unregister
from zrl.config.base import Section
from zrl.config.experiment import ConfigError, config_from_dict, config_to_yaml
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import validate


class TinyQConfig(Section):
    """The ``tiny_q:`` section of an experiment config."""

    epsilon: float = Field(0.1, ge=0, le=1)
    """Chance of a uniform random action."""
    target_every: int = Field(200, ge=1)
    """Updates between copies of the model into the target network."""


class TinyQPolicy(BasePolicy):
    """Epsilon-greedy over the Q-network; transitions go to replay with zero priorities."""

    records_next_obs = True
    action_dtype = np.int64
    action_shape: tuple[int, ...] = ()

    def __init__(self, setup: ActorSetup) -> None:
        self.model: Any = setup.model
        self.rng = setup.rng
        self.num_actions = int(setup.action_space.n)
        self.epsilon = setup.config.section(TinyQConfig).epsilon

    @torch.no_grad()
    def act(
        self, obs: np.ndarray, t: int, rows: slice | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        greedy = self.model(torch.from_numpy(obs)).argmax(dim=1).numpy()
        explore = self.rng.random(len(obs)) < self.epsilon
        return np.where(explore, self.rng.integers(0, self.num_actions, len(obs)), greedy), {}

    def finish(self, trajectory: Trajectory) -> Outgoing:
        priority = np.zeros(trajectory.reward.shape, np.float32)
        return Outgoing(P.TRAJECTORY, trajectory.transitions(priority))


class TinyQUpdate(BaseUpdate):
    """``Q(s, a) <- r + discount * max_a' Q_target(s', a')`` by one Adam step per batch; the
    target network is a copy of the model every ``tiny_q.target_every`` updates."""

    def __init__(self, setup: LearnerSetup) -> None:
        self.model = setup.model
        self.target = copy.deepcopy(self.model)
        self.optimizer = make_adam(self.model.parameters(), setup.config.learner.lr)
        self.target_every = setup.config.section(TinyQConfig).target_every
        self.pending: list[P.Message] = []
        self.updates = 0

    def receive(self, msg: P.Message, version: int) -> None:
        validate(msg, M.TRANSITION_BATCH)
        self.pending.append(msg)

    def train(self, version: int) -> UpdateResult | None:
        if not self.pending:
            return None
        b = {k: torch.from_numpy(np.array(v)) for k, v in self.pending.pop(0).arrays.items()}
        q = self.model(b["obs"]).gather(1, b["action"].unsqueeze(1))[:, 0]
        with torch.no_grad():
            target = b["reward"] + b["discount"] * self.target(b["next_obs"]).max(dim=1).values
        loss = torch.nn.functional.smooth_l1_loss(q, target)
        checked_step(self.optimizer, loss, list(self.model.parameters()), grad_clip=10.0)
        self.updates += 1
        if self.updates % self.target_every == 0:
            self.target.load_state_dict(self.model.state_dict())
        return UpdateResult(updates=1, loss=float(loss.detach()))

    def state_dict(self) -> dict[str, Any]:
        return {"online": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["online"])
        self.target.load_state_dict(state["online"])
        self.optimizer.load_state_dict(state["optimizer"])


def tiny_q_pieces() -> Pieces:
    """Its policy, its update and zrl's Q-network (a plug-in may import at the top: the
    function is for zrl's own packages, which keep torch out of the config)."""
    from zrl.nets.discrete import q_network_for

    return Pieces(policy=TinyQPolicy, update=TinyQUpdate, model=q_network_for)


TINY_Q = Algorithm(
    name="tiny_q",
    summary="one-step Q-learning, for the plug-in test",
    wiring=Wiring(
        actions="discrete",
        experience="replay",
        replay_item="transitions",
        replay_tables=("uniform",),
        learner_input="batches",
    ),
    pieces=tiny_q_pieces,
    config={"tiny_q": TinyQConfig},
    sections=("replay", "learner"),
)


@pytest.fixture
def tiny_q():
    register(TINY_Q)
    yield TINY_Q
    unregister("tiny_q")  # the registry is per process: leave it as the other tests expect


def test_a_registered_algorithm_brings_its_config_section(tiny_q):
    base = {"algo": "tiny_q", "replay": {"table": "uniform"}}
    cfg = config_from_dict(base, ["tiny_q.epsilon=0.25"])
    assert cfg.section(TinyQConfig) == TinyQConfig(epsilon=0.25)
    shown = config_to_yaml(cfg, all_sections=False)
    assert "tiny_q:\n  epsilon: 0.25\n" in shown and "\nppo:" not in shown
    with pytest.raises(
        ConfigError, match=r"tiny_q\.epsilonn: unknown key \(did you mean tiny_q\.epsilon\?\)"
    ):
        config_from_dict(base, ["tiny_q.epsilonn=0.2"])
    with pytest.raises(ConfigError, match=r"tiny_q\.target_every: Input should be greater"):
        config_from_dict(base, ["tiny_q.target_every=0"])
    unregister("tiny_q")
    with pytest.raises(ConfigError, match="tiny_q: unknown key"):
        config_from_dict({"tiny_q": {"epsilon": 0.2}})


@pytest.mark.slow
def test_a_registered_algorithm_trains_cartpole_through_the_generic_roles(tiny_q, tmp_path):
    experiment = zrl.Experiment(
        {
            "algo": "tiny_q",
            "env": {"id": "CartPole-v1", "num_envs": 4},
            "roles": {"actors": 1, "replay": 1, "params": 1, "learners": 1, "evaluator": 1},
            "replay": {"table": "uniform", "n_step": 1, "gamma": 0.95, "min_size": 1000},
            "learner": {"lr": 1e-3, "publish_interval": 20},
            "tiny_q": {"epsilon": 0.1, "target_every": 200},
            "evaluator": {"interval": 2.0, "episodes": 5},
            # Bounded by env steps (a CI run met 150 at 31k); the wall time is a guard.
            "stop": {"eval_return": 150, "eval_window": 1, "env_steps": 150000, "wall_time": 600},
        }
    )
    summary = experiment.run(inproc=True, run_dir=tmp_path / "run")
    random_policy_return = 25
    assert summary["best_eval_return"] > 3 * random_policy_return, summary
    assert summary["updates"] > 100, summary
