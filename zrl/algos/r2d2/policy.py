"""The R2D2 actor policy: epsilon-greedy over a recurrent Q-network, its state per env slot.

Env slot k of all N = actors x envs slots explores with the Ape-X epsilon
(``EpsilonGreedyPolicy``, shared with Ape-X DQN). The policy keeps each env's recurrent
state, zeroes it when the actor says an episode starts (``episodes_started``), and records at
every step the state it acted from, whether it was zeroed there, and the Q-values. ``finish``
hands them to the ``SequenceCutter``; the completed sequences go as a ``sequences`` TRAJECTORY
with initial priorities computed from the recorded Q-values (the actor's network as online and
target network: no second forward); on uint8 frame stacks ``[k, H, W]`` (Atari) a
``frame_sequences`` TRAJECTORY, each sequence's frames once (the learner rebuilds the stacks).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from zrl.algos.api.actor import ActorSetup, Outgoing, Trajectory
from zrl.algos.kernel.exploration import EpsilonGreedyPolicy
from zrl.algos.kernel.q_learning import nstep_double_q_targets
from zrl.algos.kernel.sequences import SequenceCutter, Sequences
from zrl.algos.r2d2.config import R2D2Config
from zrl.algos.r2d2.losses import inverse_value_rescale, sequence_priority, value_rescale
from zrl.codecs.frames import is_frame_space
from zrl.nets.recurrent import EnvStates
from zrl.transport import messages as M
from zrl.transport import protocol as P


def actor_priorities(
    seqs: Sequences, burn_in: int, gamma: float, n_step: int, eta: float, eps: float
) -> np.ndarray:
    """Initial priorities ``[N]`` of sequences from the Q-values the actor acted on."""
    if len(seqs) == 0:
        return np.zeros(0, np.float32)
    q = torch.from_numpy(seqs.q)
    boot = inverse_value_rescale(q.max(dim=-1).values, eps)
    raw = nstep_double_q_targets(
        torch.from_numpy(seqs.reward),
        torch.from_numpy(seqs.terminated),
        torch.from_numpy(seqs.mask),
        boot,
        gamma,
        n_step,
    )
    taken = q[:, :-1].gather(-1, torch.from_numpy(seqs.action)[..., None])[..., 0]
    td = (value_rescale(raw, eps) - taken).abs()[:, burn_in:]
    return sequence_priority(td, torch.from_numpy(seqs.mask)[:, burn_in:], eta).numpy()


class R2D2Policy(EnvStates, EpsilonGreedyPolicy):
    records_next_obs = False

    def __init__(self, setup: ActorSetup) -> None:
        super().__init__(setup)
        cfg = setup.config
        self.config = cfg
        self.model: Any = setup.model
        E = setup.num_envs
        self.init_states(setup.model, E)
        self.cutter = SequenceCutter(
            E,
            cfg.section(R2D2Config).sequence_length,
            cfg.section(R2D2Config).burn_in,
            M.obs_shape(setup.observation_space),
            M.obs_dtype(setup.observation_space),
            self.state.shape[1],
            self.num_actions,
        )
        self.frames = is_frame_space(setup.observation_space)
        """Sequences of frame stacks go as ``frame_sequences`` (as the replay shard's layout,
        ``zrl.replay.layout``, takes them)."""
        self.sequences_sent = 0
        setup.log_start(
            f"epsilons {float(self.epsilons.max()):.3g}..{float(self.epsilons.min()):.3g}, "
            f"sequences of {cfg.section(R2D2Config).sequence_length} "
            f"(burn-in {cfg.section(R2D2Config).burn_in})"
        )

    @torch.no_grad()
    def act(
        self, obs: np.ndarray, t: int, rows: slice | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        q, recorded = self.step_q(self.model, obs, rows)
        return self.epsilon_greedy(q, t), {**recorded, "q": q.astype(np.float32, copy=False)}

    def finish(self, trajectory: Trajectory) -> Outgoing:
        tr, x = trajectory, trajectory.extras
        seqs = self.cutter.add(
            tr.obs,
            tr.action,
            tr.reward,
            tr.terminated,
            tr.valid,
            x["first"],
            x["state"],
            x["q"],
            version=tr.weights_version,
        )
        c, rc = self.config.section(R2D2Config), self.config.replay
        priority = actor_priorities(
            seqs, c.burn_in, rc.gamma, rc.n_step, c.priority_eta, c.rescale_epsilon
        )
        self.sequences_sent += len(seqs)
        return Outgoing(P.TRAJECTORY, seqs.arrays(priority, frames=self.frames))

    def heartbeat_info(self) -> dict[str, Any]:
        return {"sequences": self.sequences_sent, "episodes_discarded": self.cutter.discarded}
