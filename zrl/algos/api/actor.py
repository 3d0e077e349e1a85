"""The actor side of an algorithm: what the generic actor gives its policy
(:class:`ActorSetup`, a finished :class:`Trajectory`) and what the policy gives back (actions,
an :class:`Outgoing` message); :class:`ActorPolicy` is the interface, :class:`BasePolicy` its
defaults.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from zrl.codecs.frames import frames_of

if TYPE_CHECKING:
    import numpy as np
    from torch import nn

    from zrl.algos.api.train_stats import TrainStats
    from zrl.config.experiment import ExperimentConfig


@dataclass
class ActorSetup:
    """What the actor gives its policy: the experiment, its envs' spaces and its model."""

    config: ExperimentConfig
    observation_space: Any
    action_space: Any
    num_envs: int
    model: nn.Module
    actor_index: int
    seed: int
    rng: np.random.Generator
    log: logging.Logger
    train_stats: TrainStats

    def log_start(self, what: str = "") -> None:
        """Log the actor's start: index, algorithm, envs, seed and ``what`` the policy adds."""
        self.log.info(
            "actor %d (%s): %d x %s%s, seed %d",
            self.actor_index,
            self.config.algo,
            self.num_envs,
            self.config.env.id,
            f", {what}" if what else "",
            self.seed,
        )


@dataclass
class Trajectory:
    """T steps of E envs as the actor recorded them, env-major ``[E, T, ...]``.

    ``valid[e, t]`` is False for the step after an episode end (it only reset the env);
    ``final_obs`` is the observation after the last step (the bootstrap state of an unroll);
    ``extras`` holds what ``ActorPolicy.act`` asked to record, in the same layout;
    ``weights_version`` is the version of the weights that acted (the message's meta carries
    it too; a policy that sends data spanning trajectories, R2D2's, keeps it per step)."""

    obs: np.ndarray
    next_obs: np.ndarray | None
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    final_obs: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    weights_version: int = 0

    def transitions(self, priority: np.ndarray) -> dict[str, np.ndarray]:
        """The arrays of a ``transitions`` TRAJECTORY (``zrl.transport.messages``)."""
        assert self.next_obs is not None, "the policy must set records_next_obs"
        return {
            "obs": self.obs,
            "action": self.action,
            "reward": self.reward,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "valid": self.valid,
            "next_obs": self.next_obs,
            "priority": priority,
        }

    def unroll(self) -> dict[str, np.ndarray]:
        """The arrays of an ``unroll`` TRAJECTORY (behaviour log-probs in ``extras``)."""
        return {
            "obs": self.obs,
            "action": self.action,
            "logp": self.extras["logp"],
            "reward": self.reward,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "valid": self.valid,
            "bootstrap_obs": self.final_obs.copy(),
        }

    def frame_unroll(self) -> dict[str, np.ndarray]:
        """The arrays of a ``frame_unroll`` TRAJECTORY: :meth:`unroll` with each frame of the
        ``[E, T, k, H, W]`` stacks once (``zrl.codecs.frames.frames_of``)."""
        arrays = self.unroll()
        del arrays["obs"], arrays["bootstrap_obs"]
        return {"frames": frames_of(self.obs, self.final_obs), **arrays}


@dataclass
class Outgoing:
    """What the actor sends for one trajectory: a message kind, its arrays and extra meta."""

    kind: str
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)


class ActorPolicy(Protocol):
    """The actor-side half of an algorithm. The actor owns the envs, the buffers, sending,
    the credit window and the episode statistics; the policy only decides."""

    # Read-only to the actor (properties here, so that a policy's narrower class attribute,
    # ``action_dtype = np.int64``, satisfies the protocol).
    @property
    def records_next_obs(self) -> bool:
        """Whether the actor keeps every step's next observation (transitions need it)."""

    @property
    def action_dtype(self) -> type: ...

    @property
    def action_shape(self) -> tuple[int, ...]:
        """The per-env action: ``()`` int64 for Discrete, ``(act_dim,)`` float32 for a Box."""

    def begin(self, steps: int, env_steps: int) -> None:
        """A trajectory of ``steps`` steps starts (draw its exploration noise here, at once)."""

    def act(
        self, obs: np.ndarray, t: int, rows: slice | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions ``[E, *action_shape]`` for observations ``[E, ...]`` at step ``t`` of the
        trajectory, and per-step extras to record (``{"logp": [E]}``, ...).

        ``rows``: the observations are only those of envs ``rows`` of the E (double-buffered
        sampling, ``actor.env_groups`` > 1, acts for one group of envs at a time); per-env
        state (exploration draws of ``begin``, per-env epsilons) is indexed by it, and the
        actions and extras are ``[len(rows), ...]``. The actor passes it only when
        ``env_groups`` > 1: a policy without it runs with ``env_groups: 1``."""

    def finish(self, trajectory: Trajectory) -> Outgoing:
        """The message to send for a collected trajectory (adds priorities, or computes the
        gradient for A3C)."""

    def episodes_started(self, envs: np.ndarray) -> None:
        """The envs with these indices start a new episode at their next observation (after
        the step that only reset them, or after all envs were reset on an env error): a
        recurrent policy zeroes their state before it acts on that observation."""

    def may_collect(self, weights_version: int) -> bool:
        """False while the algorithm must wait for newer weights before collecting (PPO)."""

    def sent(self, weights_version: int) -> None:
        """A trajectory collected with ``weights_version`` left the actor."""

    def train_info(self) -> dict[str, float]:
        """Exploration figures for the training metrics (epsilons, noise scales, ...)."""

    def heartbeat_info(self) -> dict[str, Any]:
        """Extra heartbeat fields."""


class BasePolicy:
    """Defaults of the optional :class:`ActorPolicy` methods, for policies to inherit."""

    def begin(self, steps: int, env_steps: int) -> None:
        pass

    def episodes_started(self, envs: np.ndarray) -> None:
        pass

    def may_collect(self, weights_version: int) -> bool:
        return True

    def sent(self, weights_version: int) -> None:
        pass

    def train_info(self) -> dict[str, float]:
        return {}

    def heartbeat_info(self) -> dict[str, Any]:
        return {}
