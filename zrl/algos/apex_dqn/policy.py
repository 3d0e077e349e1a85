"""The Ape-X DQN actor policy: epsilon-greedy over the Q-network, with actor-side priorities.

Env slot k of all N = actors x envs slots uses the Ape-X epsilon
``base ** (1 + alpha * k / (N - 1))`` (``zrl.algos.kernel.exploration.apex_epsilons``): a few
slots explore widely, most act nearly greedily. Each trajectory becomes a ``transitions``
TRAJECTORY whose ``priority`` holds the initial priority
``|R + discount * max_a Q(s', a) - Q(s, a)|`` of every n-step transition's first step (zeros
elsewhere), from this actor's own copy of the network. Frame stacks (uint8 ``[k, H, W]``
observations, Atari) go as ``frame_transitions``: each frame once instead of two stacks per
step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from zrl.algos.apex_dqn.losses import initial_priorities
from zrl.algos.api.actor import ActorSetup, Outgoing, Trajectory
from zrl.algos.kernel.exploration import EpsilonGreedyPolicy
from zrl.codecs.frames import frames_of, is_frame_space, is_frame_stack
from zrl.codecs.nstep import nstep_transitions
from zrl.transport import protocol as P


class ApexDQNPolicy(EpsilonGreedyPolicy):
    records_next_obs = True

    def __init__(self, setup: ActorSetup) -> None:
        super().__init__(setup)
        cfg = setup.config
        self.model: Any = setup.model
        self.n_step, self.gamma = cfg.replay.n_step, cfg.replay.gamma
        self.env_index = np.arange(setup.num_envs)
        self.frames = is_frame_space(setup.observation_space)  # stacks, not RGB images
        setup.log_start(
            f"epsilons {float(self.epsilons.max()):.3g}..{float(self.epsilons.min()):.3g}"
        )

    @torch.no_grad()
    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self.model(torch.from_numpy(obs)).numpy()  # type: ignore[no-any-return]

    def act(
        self, obs: np.ndarray, t: int, rows: slice | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        q = self.q_values(obs)
        a = self.epsilon_greedy(q, t, rows)
        return a, {"q_taken": q[self.env_index[: len(a)], a]}

    def finish(self, trajectory: Trajectory) -> Outgoing:
        tr = trajectory
        assert tr.next_obs is not None
        ns = nstep_transitions(
            tr.reward, tr.terminated, tr.truncated, tr.valid, self.n_step, self.gamma
        )
        next_q = self.q_values(tr.next_obs[ns.env, ns.end])
        priority = np.zeros(tr.reward.shape, np.float32)
        priority[ns.env, ns.start] = initial_priorities(
            tr.extras["q_taken"][ns.env, ns.start], ns.returns, ns.discounts, next_q
        )
        arrays = tr.transitions(priority)
        if self.frames and is_frame_stack(tr.obs):
            # Each frame once: the replay server rebuilds the stacks (1/8 of the bytes).
            del arrays["obs"], arrays["next_obs"]
            arrays["frames"] = frames_of(tr.obs, tr.final_obs)
        return Outgoing(P.TRAJECTORY, arrays)
