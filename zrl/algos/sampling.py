"""The actor policy of the actor-critics (IMPALA, PPO, A3C): sample the categorical policy.

Actions are drawn with the Gumbel-max trick from noise drawn once per trajectory (``rng``,
seeded by the actor index: the actors differ only by their seeds), and their behaviour
log-probabilities are recorded. Each trajectory becomes an ``unroll`` TRAJECTORY
(``zrl.transport.messages.UNROLL``): the steps plus the observation to bootstrap from.
With ``actor.random_policy`` the actions are uniform and the model is never run (their
log-probability is ``-log(num_actions)``): what the pipeline costs without inference.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from zrl.algos.api import ActorSetup, BasePolicy, Outgoing, Trajectory
from zrl.models import policy_logits, sample_categorical
from zrl.transport import protocol as P


class CategoricalPolicy(BasePolicy):
    records_next_obs = False
    action_dtype = np.int64
    action_shape: tuple[int, ...] = ()

    def __init__(self, setup: ActorSetup) -> None:
        self.config = setup.config
        self.model: Any = setup.model
        self.rng = setup.rng
        self.num_actions = int(setup.action_space.n)
        self.gumbel = np.zeros((0, setup.num_envs, self.num_actions))
        self.random = setup.config.actor.random_policy
        setup.log.info(
            "actor %d (%s): %d x %s, seed %d",
            setup.actor_index, setup.config.algo, setup.num_envs, setup.config.env.id, setup.seed,
        )  # fmt: skip

    def begin(self, steps: int, env_steps: int) -> None:
        if self.random:
            return
        self.gumbel = self.rng.gumbel(size=(steps, self.gumbel.shape[1], self.num_actions))

    @torch.no_grad()
    def act(
        self, obs: np.ndarray, t: int, rows: slice | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions sampled under the current weights (with this step's Gumbel noise) and
        their log-probabilities (of the envs ``rows``, or all)."""
        rows = slice(None) if rows is None else rows
        if self.random:
            n = len(obs)
            actions = self.rng.integers(0, self.num_actions, n)
            return actions, {"logp": np.full(n, -math.log(self.num_actions), np.float32)}
        logp = torch.log_softmax(policy_logits(self.model, torch.from_numpy(obs)), dim=1)
        actions, taken_logp = sample_categorical(logp.numpy(), self.gumbel[t, rows])
        return actions, {"logp": taken_logp.astype(np.float32, copy=False)}

    def finish(self, trajectory: Trajectory) -> Outgoing:
        return Outgoing(P.TRAJECTORY, trajectory.unroll())
