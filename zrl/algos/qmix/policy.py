"""The QMIX actor policy: each agent epsilon-greedy on the shared agent Q-network over its own
observation, and each game's slots grouped into one team transition.

The actor's vector env has one slot per agent (``zrl.envs.multiagent.envs.ParallelVectorEnv``:
game ``g`` is slots ``g * L .. g * L + L - 1``). Acting is per slot: ``forward`` of the model
(illegal actions masked), the greedy action with probability ``1 - epsilon``, else a uniformly
random legal one; epsilon decays linearly with the actor's env steps
(``qmix.epsilon_start`` -> ``qmix.epsilon_end`` over ``qmix.epsilon_steps``).

``finish`` sends a ``transitions`` TRAJECTORY of the team (:func:`team_transitions`), one row
per game: the L slot observations side by side (each carries the global state), the joint
action index, the team reward, the game's episode flags. The replay shard takes it as any
transitions (n-step returns, uniform table) with its layout fixed for teams
(``Wiring.team``, ``zrl.replay.layout``).

With ``model.core`` (:class:`RecurrentQMIXPolicy`) each slot carries its agent's recurrent
state, zeroed where the actor says an episode starts, and ``finish`` cuts each game's team
steps into R2D2's fixed-length overlapping sequences (``zrl.algos.kernel.sequences``,
``qmix.sequence_length`` and ``qmix.burn_in``): the L slot observations side by side per step,
the joint action, the team reward, the game's flags, and the L agents' states at the
sequence's start side by side; they go as a ``sequences`` TRAJECTORY (:func:`team_steps`).

The team reward is the **mean** of the agents' rewards, not the sum: in simple_spread each
agent's reward is ``(1 - local_ratio) * shared + local_ratio * own collisions``, so the mean
counts the shared coverage term once and averages the collision penalties, and the team
return is on the scale of the per-agent returns the evaluator reports (about -28 for a random
policy) whatever the number of agents; the sum would only scale Q_tot by L.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from zrl.algos.api.actor import ActorSetup, BasePolicy, Outgoing, Trajectory
from zrl.algos.kernel.sequences import SequenceCutter
from zrl.algos.qmix.config import QMIXConfig
from zrl.algos.qmix.losses import joint_actions, linear_epsilon
from zrl.nets.recurrent import EnvStates, is_recurrent
from zrl.transport import protocol as P


def by_game(x: np.ndarray, agents: int) -> np.ndarray:
    """Slot-major ``[E, T, ...]`` (E = G * L, a game's slots consecutive) -> ``[G, T, L, ...]``."""
    E, T = x.shape[:2]
    if E % agents:
        raise ValueError(f"{E} slots are not whole games of {agents} agents")
    return np.swapaxes(x.reshape(E // agents, agents, T, *x.shape[2:]), 1, 2)


def team_transitions(tr: Trajectory, agents: int, num_actions: int) -> dict[str, np.ndarray]:
    """The ``transitions`` arrays of the teams of trajectory ``tr`` (``[E, T, ...]`` slots):
    ``[G, T, ...]`` with ``obs``/``next_obs`` the agents' slot observations concatenated
    (``[G, T, L * slot]``), ``action`` the joint index (``losses.joint_actions``), ``reward``
    the agents' mean, ``terminated``/``truncated`` any agent's (they end together),
    ``valid`` every agent's, ``priority`` zeros (the table is uniform)."""
    assert tr.next_obs is not None, "the policy must set records_next_obs"
    G, T = tr.obs.shape[0] // agents, tr.obs.shape[1]
    obs = by_game(tr.obs, agents).reshape(G, T, -1)
    next_obs = by_game(tr.next_obs, agents).reshape(G, T, -1)
    return {
        "obs": obs,
        "action": joint_actions(by_game(tr.action, agents), num_actions),
        "reward": by_game(tr.reward, agents).mean(axis=2).astype(np.float32),
        "terminated": by_game(tr.terminated, agents).any(axis=2),
        "truncated": by_game(tr.truncated, agents).any(axis=2),
        "valid": by_game(tr.valid, agents).all(axis=2),
        "next_obs": next_obs,
        "priority": np.zeros((G, T), np.float32),
    }


def team_steps(
    tr: Trajectory, first: np.ndarray, state: np.ndarray, agents: int, num_actions: int
) -> dict[str, np.ndarray]:
    """The team steps of trajectory ``tr`` (``[E, T, ...]`` slots) that a recurrent actor
    cuts into sequences, ``[G, T, ...]``: ``obs`` the agents' slot observations side by side
    (``[G, T, L * slot]``), ``action`` the joint index, ``reward`` the agents' mean,
    ``terminated`` any agent's, ``valid`` every agent's, ``first`` any agent's (a game's
    agents start together), ``state`` the agents' states before each step side by side
    (``[G, T, L * S]``, from the slots' ``state [E, T, S]``)."""
    G, T = tr.obs.shape[0] // agents, tr.obs.shape[1]
    return {
        "obs": by_game(tr.obs, agents).reshape(G, T, -1),
        "action": joint_actions(by_game(tr.action, agents), num_actions),
        "reward": by_game(tr.reward, agents).mean(axis=2).astype(np.float32),
        "terminated": by_game(tr.terminated, agents).any(axis=2),
        "valid": by_game(tr.valid, agents).all(axis=2),
        "first": by_game(first, agents).any(axis=2),
        "state": by_game(state, agents).reshape(G, T, -1),
    }


def qmix_policy(setup: ActorSetup) -> QMIXPolicy | RecurrentQMIXPolicy:
    """The QMIX actor policy for the model: :class:`RecurrentQMIXPolicy` for a recurrent
    agent network (``model.core``), else :class:`QMIXPolicy`."""
    if is_recurrent(setup.model):
        return RecurrentQMIXPolicy(setup)
    return QMIXPolicy(setup)


class QMIXPolicy(BasePolicy):
    records_next_obs = True
    action_dtype = np.int64
    action_shape: tuple[int, ...] = ()

    def __init__(self, setup: ActorSetup) -> None:
        self.cfg = setup.config.section(QMIXConfig)
        model: Any = setup.model
        self.model = model
        self.rng = setup.rng
        self.agents = int(model.agents)
        self.num_actions = int(setup.action_space.n)
        if setup.num_envs % self.agents:
            raise ValueError(
                f"{setup.num_envs} env slots are not whole games of {self.agents} agents"
            )
        self.epsilon = self.cfg.epsilon_start
        self.explore = np.zeros((0, setup.num_envs), bool)
        self.scores = np.zeros((0, setup.num_envs, self.num_actions))
        setup.log_start(
            f"{setup.num_envs // self.agents} games of {self.agents} agents, epsilon "
            f"{self.cfg.epsilon_start:.3g} -> {self.cfg.epsilon_end:.3g} over "
            f"{self.cfg.epsilon_steps} steps"
        )

    def begin(self, steps: int, env_steps: int) -> None:
        c = self.cfg
        self.epsilon = linear_epsilon(env_steps, c.epsilon_start, c.epsilon_end, c.epsilon_steps)
        E = self.explore.shape[1]
        self.explore = self.rng.random((steps, E)) < self.epsilon
        # Random scores per action: the random action is the best-scoring legal one.
        self.scores = self.rng.random((steps, E, self.num_actions))

    @torch.no_grad()
    def act(
        self, obs: np.ndarray, t: int, rows: slice | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        rows = slice(None) if rows is None else rows
        q = self.model(torch.from_numpy(obs)).numpy()
        legal = q > ILLEGAL_THRESHOLD
        random = np.where(legal, self.scores[t, rows], -1.0).argmax(axis=1)
        return np.where(self.explore[t, rows], random, q.argmax(axis=1)), {}

    def finish(self, trajectory: Trajectory) -> Outgoing:
        return Outgoing(P.TRAJECTORY, team_transitions(trajectory, self.agents, self.num_actions))

    def train_info(self) -> dict[str, float]:
        return {"epsilon": float(self.epsilon)}


class RecurrentQMIXPolicy(EnvStates, QMIXPolicy):
    """QMIX's actor policy over a recurrent agent network: epsilon-greedy as
    :class:`QMIXPolicy`, a state per slot, each game's team sequences sent."""

    records_next_obs = False

    def __init__(self, setup: ActorSetup) -> None:
        super().__init__(setup)
        self.init_states(setup.model, setup.num_envs)
        obs_width = self.agents * int(np.prod(setup.observation_space.shape))
        self.cutter = SequenceCutter(
            setup.num_envs // self.agents,
            self.cfg.sequence_length,
            self.cfg.burn_in,
            (obs_width,),
            np.dtype(np.float32),
            self.agents * self.state.shape[1],
            0,  # no Q-values kept: a uniform table needs no initial priorities
        )
        self.sequences_sent = 0

    @torch.no_grad()
    def act(
        self, obs: np.ndarray, t: int, rows: slice | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        q, recorded = self.step_q(self.model, obs, rows)
        random = np.where(q > ILLEGAL_THRESHOLD, self.scores[t], -1.0).argmax(axis=1)
        return np.where(self.explore[t], random, q.argmax(axis=1)), recorded

    def finish(self, trajectory: Trajectory) -> Outgoing:
        x = trajectory.extras
        team = team_steps(trajectory, x["first"], x["state"], self.agents, self.num_actions)
        G, T = team["action"].shape
        seqs = self.cutter.add(
            team["obs"],
            team["action"],
            team["reward"],
            team["terminated"],
            team["valid"],
            team["first"],
            team["state"],
            np.zeros((G, T, 0), np.float32),
            version=trajectory.weights_version,
        )
        self.sequences_sent += len(seqs)
        return Outgoing(P.TRAJECTORY, seqs.arrays(np.zeros(len(seqs), np.float32)))

    def heartbeat_info(self) -> dict[str, Any]:
        return {"sequences": self.sequences_sent, "episodes_discarded": self.cutter.discarded}


ILLEGAL_THRESHOLD = -1e7
"""Q-values at or below it are the model's masked (illegal) actions (``losses.ILLEGAL_Q``)."""
