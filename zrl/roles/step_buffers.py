"""The buffers an actor collects one trajectory in: time-major ``[T, E, ...]``, so each step
writes one row (or the rows of one env group), turned env-major ``[E, T, ...]`` (the message
layout, :class:`~zrl.algos.api.Trajectory`) once the trajectory is complete.

Sockets: none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from zrl.algos.api.actor import ActorPolicy, Trajectory


def env_major(x: np.ndarray) -> np.ndarray:
    """Time-major ``[T, E, ...]`` collection buffers -> the ``[E, T, ...]`` message layout."""
    return np.ascontiguousarray(x.swapaxes(0, 1))


ALL_ENVS = slice(None)


@dataclass
class StepBuffers:
    """Time-major buffers of one trajectory ``[T, E, ...]``: each step writes one row (or the
    rows of one env group)."""

    obs: np.ndarray
    next_obs: np.ndarray | None  # only for policies that record it
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    extras: dict[str, np.ndarray]

    @classmethod
    def empty(cls, steps: int, obs: np.ndarray, policy: ActorPolicy) -> StepBuffers:
        E = len(obs)
        return cls(
            obs=np.empty((steps, *obs.shape), obs.dtype),
            next_obs=np.empty((steps, *obs.shape), obs.dtype) if policy.records_next_obs else None,
            action=np.empty((steps, E, *policy.action_shape), policy.action_dtype),
            reward=np.empty((steps, E), np.float32),
            terminated=np.empty((steps, E), bool),
            truncated=np.empty((steps, E), bool),
            extras={},
        )

    def acted(self, t: int, rows: slice, action: np.ndarray, extras: dict[str, np.ndarray]) -> None:
        self.action[t, rows] = action
        for name, value in extras.items():
            self._extra(name, t, rows, value)

    def _extra(self, name: str, t: int, rows: slice, value: np.ndarray) -> None:
        """Store ``value`` as extra ``name`` of step ``t``, rows ``rows`` (made at first use)."""
        if name not in self.extras:
            shape = (len(self.obs), self.reward.shape[1], *value.shape[1:])
            self.extras[name] = np.empty(shape, value.dtype)
        self.extras[name][t, rows] = value

    def stepped(
        self, t: int, rows: slice, next_obs: np.ndarray, reward: Any, term: Any, trunc: Any
    ) -> None:
        if self.next_obs is not None:
            self.next_obs[t, rows] = next_obs
        self.reward[t, rows] = reward
        self.terminated[t, rows] = term
        self.truncated[t, rows] = trunc

    def recorded(self, t: int, rows: slice, info: dict[str, Any], keys: tuple[str, ...]) -> None:
        """Keep the per-env arrays ``keys`` of step ``t``'s info among the extras."""
        for name in keys:
            self._extra(name, t, rows, np.asarray(info[name]))

    def trajectory(self, valid: np.ndarray, final_obs: np.ndarray) -> Trajectory:
        """The env-major trajectory of these buffers: ``valid[e, t]`` says which steps were
        real transitions, ``final_obs`` is the observation after the last step."""
        return Trajectory(
            obs=env_major(self.obs),
            next_obs=None if self.next_obs is None else env_major(self.next_obs),
            action=env_major(self.action),
            reward=env_major(self.reward),
            terminated=env_major(self.terminated),
            truncated=env_major(self.truncated),
            valid=valid,
            final_obs=final_obs,
            extras={name: env_major(x) for name, x in self.extras.items()},
        )
