"""The actor policy of the actor-critics (IMPALA, PPO, A3C): sample the categorical policy.

Actions are drawn with the Gumbel-max trick from noise drawn once per trajectory (``rng``,
seeded by the actor index: the actors differ only by their seeds), and their behaviour
log-probabilities are recorded. Each trajectory becomes an ``unroll`` TRAJECTORY
(``zrl.transport.messages.UNROLL``): the steps plus the observation to bootstrap from; on
frame stacks a ``frame_unroll`` (``FRAME_UNROLL``: each frame once, the learner rebuilds the
stacks), to a replay FIFO (IMPALA, APPO) and to PPO's learners alike.
With ``actor.random_policy`` the actions are uniform and the model is never run (their
log-probability is ``-log(num_actions)``): what the pipeline costs without inference.

:class:`RecurrentCategoricalPolicy` samples a recurrent actor-critic (``zrl.nets.recurrent``) the
same way, carrying each env's state ``[E, S]`` from step to step and across trajectories; its
trajectories become a ``recurrent_unroll`` TRAJECTORY (``RECURRENT_UNROLL``): the unroll plus
the state before step 0 (``state [E, S]``) and the steps whose state was zeroed (``first``);
on frame stacks a ``recurrent_frame_unroll`` (``RECURRENT_FRAME_UNROLL``: the same with each
frame once) where its ``frame_unrolls`` says so (IMPALA, APPO; recurrent PPO's learners take
``recurrent_unroll`` rollouts).
:class:`GaussianPolicy` samples the diagonal Gaussian of a Box action space
(``zrl.nets.gaussian``) and sends ``continuous_unroll`` TRAJECTORYs (``CONTINUOUS_UNROLL``):
the unroll with float32 actions ``[E, T, A]``, the samples before they were clipped to the Box.
:func:`make_categorical_policy` (IMPALA's and APPO's ``policy``) picks one for the model and
the action space.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from zrl.algos.api.actor import ActorSetup, BasePolicy, Outgoing, Trajectory
from zrl.codecs.frames import is_frame_space, is_frame_stack
from zrl.nets.discrete import policy_logits, sample_categorical
from zrl.nets.gaussian import check_box
from zrl.nets.recurrent import EnvStates, is_recurrent
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
        self.frames = is_frame_space(setup.observation_space)  # stacks, not RGB images
        setup.log_start()

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
        if self.frames and is_frame_stack(trajectory.obs):  # ``Trajectory.frame_unroll``
            return Outgoing(P.TRAJECTORY, trajectory.frame_unroll())
        return Outgoing(P.TRAJECTORY, trajectory.unroll())


class RecurrentCategoricalPolicy(EnvStates, CategoricalPolicy):
    """The categorical policy of a recurrent actor-critic: ``model.step(obs, state)`` per step.

    Resets: ``episodes_started`` marks envs whose next observation starts an episode; their
    state is zeroed before the policy acts on it. ``begin`` applies the marks already pending
    (an episode that starts at a trajectory's first observation) to the state it records as
    the trajectory's ``state``, and the act of step 0 still reports them in ``first[:, 0]``:
    ``first[e, t]`` is True exactly where the state was zeroed before step ``t``, and
    ``state[e]`` is the state step 0 acted from (before the reset of ``first[e, 0]``, which is
    already zero). A learner replaying the rows with ``model.unroll(obs, state, first)``
    computes what this policy computed. All envs act at once (``actor.env_groups: 1``).
    """

    frame_unrolls = True
    """Frame stacks go as ``recurrent_frame_unroll`` (to a replay FIFO); False: as
    ``recurrent_unroll``, full stacks."""

    def __init__(self, setup: ActorSetup) -> None:
        super().__init__(setup)
        if self.random:
            raise ValueError("actor.random_policy: a recurrent policy always runs its model")
        self.init_states(self.model, setup.num_envs)
        self.start_state = self.state.copy()  # the state before step 0 of this trajectory

    def begin(self, steps: int, env_steps: int) -> None:
        super().begin(steps, env_steps)
        self.zero_starts()
        self.start_state = self.state.copy()

    @torch.no_grad()
    def act(
        self, obs: np.ndarray, t: int, rows: slice | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions sampled from ``model.step`` on the envs' states (zeroed first where an
        episode starts), their log-probabilities and whether the state was zeroed."""
        first = self.take_starts(rows)
        logits, _, state = self.model.step(torch.from_numpy(obs), torch.from_numpy(self.state))
        self.state = state.numpy()
        logp = torch.log_softmax(logits, dim=1)
        actions, taken_logp = sample_categorical(logp.numpy(), self.gumbel[t])
        return actions, {"logp": taken_logp.astype(np.float32, copy=False), "first": first}

    def finish(self, trajectory: Trajectory) -> Outgoing:
        if self.frame_unrolls and self.frames and is_frame_stack(trajectory.obs):
            arrays = trajectory.frame_unroll()  # each frame once
        else:
            arrays = trajectory.unroll()
        arrays.update(state=self.start_state, first=trajectory.extras["first"])
        return Outgoing(P.TRAJECTORY, arrays)


class GaussianPolicy(BasePolicy):
    """The diagonal Gaussian policy of a Box action space (``zrl.nets.gaussian``): the model's
    ``policy_logits`` are its mean and log-std ``[E, 2A]``; the actor samples ``u = mean +
    std * eps`` with ``eps ~ N(0, I)`` drawn once per trajectory (``rng``), records ``u`` and
    its log-density (summed over the action dims) and steps the env with ``u`` clipped to the
    Box. Its trajectories become a ``continuous_unroll`` TRAJECTORY whose ``action`` is ``u``,
    the unclipped sample (CleanRL's ``ppo_continuous_action.py``: the learner scores the
    sample, the clipping is the env's business). No random mode, no recurrent state."""

    records_next_obs = False
    action_dtype = np.float32

    def __init__(self, setup: ActorSetup) -> None:
        self.config = setup.config
        self.model: Any = setup.model
        self.rng = setup.rng
        box = check_box(setup.action_space)
        if setup.config.actor.random_policy:
            raise ValueError(
                "actor.random_policy: the Gaussian policy (Box actions) has no random mode; "
                "set actor.random_policy: false"
            )
        if is_recurrent(self.model):
            raise ValueError("model.core: the Gaussian policy (Box actions) is feed-forward")
        self.act_dim = int(box.shape[0])
        self.action_shape = (self.act_dim,)
        self.low = np.asarray(box.low, np.float32)
        self.high = np.asarray(box.high, np.float32)
        self.noise = np.zeros((0, setup.num_envs, self.act_dim), np.float32)
        setup.log_start("Gaussian policy")

    def begin(self, steps: int, env_steps: int) -> None:
        shape = (steps, self.noise.shape[1], self.act_dim)
        self.noise = self.rng.standard_normal(shape, dtype=np.float32)

    @torch.no_grad()
    def act(
        self, obs: np.ndarray, t: int, rows: slice | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions clipped to the Box for the env, and per step the unclipped sample
        (``sample``) and its log-density (``logp``)."""
        rows = slice(None) if rows is None else rows
        params = policy_logits(self.model, torch.from_numpy(obs)).numpy()
        sample, logp = sample_gaussian(params, self.noise[t, rows])
        return np.clip(sample, self.low, self.high), {"logp": logp, "sample": sample}

    def finish(self, trajectory: Trajectory) -> Outgoing:
        arrays = trajectory.unroll()
        arrays["action"] = trajectory.extras["sample"]  # the sample logp is the density of
        return Outgoing(P.TRAJECTORY, arrays)


def sample_gaussian(params: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Samples ``mean + exp(log_std) * noise`` of the diagonal Gaussians with ``params [B, 2A]``
    (mean, log-std) and their log-densities ``[B]`` (summed over the A dims), float32:
    ``sum_j -noise_j^2 / 2 - log_std_j - log(2 pi) / 2``."""
    mean, log_std = np.split(params.astype(np.float32, copy=False), 2, axis=-1)
    sample = mean + np.exp(log_std) * noise
    logp = (-0.5 * np.square(noise) - log_std - 0.5 * math.log(2.0 * math.pi)).sum(axis=-1)
    return sample.astype(np.float32, copy=False), logp.astype(np.float32, copy=False)


def make_categorical_policy(setup: ActorSetup) -> CategoricalPolicy | GaussianPolicy:
    """The policy for the actor's model (IMPALA, APPO), from the env's action space: the
    Gaussian one for a Box; for a Discrete the categorical one, recurrent when the model
    carries a state (``model.core``), so its unrolls carry it too."""
    if isinstance(setup.action_space, gym.spaces.Box):
        return GaussianPolicy(setup)
    if is_recurrent(setup.model):
        return RecurrentCategoricalPolicy(setup)
    return CategoricalPolicy(setup)
