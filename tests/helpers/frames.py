"""Frame-stacked envs stepped the way ``Actor.collect`` steps them: the reference the frame
tests (``tests/replay/test_frames.py``, ``tests/nets/test_frames.py``, the recurrent and R2D2
frame paths) rebuild stacks against. ``Scripted`` frames carry their step since reset, and the
action places episode ends; :func:`act_on` runs a recurrent policy over collected steps."""

from __future__ import annotations

from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from zrl.algos.api.actor import Trajectory

CONTINUE, TERMINATE, TRUNCATE = 0, 1, 2
SHAPE = (5, 6)


class Scripted(gym.Env):
    """Random nonzero frames; pixel [0, 0] holds 1 + the steps since reset. The action says
    whether the step terminates or truncates, so tests place episode ends where they like."""

    def __init__(self, seed: int) -> None:
        self.observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self._rng = np.random.default_rng(seed)
        self._age = 0

    def _frame(self) -> np.ndarray:
        frame = self._rng.integers(1, 256, SHAPE, dtype=np.uint8)
        frame[0, 0] = self._age + 1
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._age = 0
        return self._frame(), {}

    def step(self, action):
        self._age += 1
        reward = float(self._rng.integers(-3, 4)) + 0.25
        return self._frame(), reward, action == TERMINATE, action == TRUNCATE, {}


def make_env(seed: int, k: int, padding: str) -> gym.Env:
    return gym.wrappers.FrameStackObservation(Scripted(seed), k, padding_type=padding)


class Collector:
    """Steps E scripted envs like ``Actor.collect``/``end_trajectory`` (env-major output)."""

    def __init__(self, num_envs: int, k: int, padding: str = "zero", seed: int = 0) -> None:
        fns = [partial(make_env, seed * 100 + e, k, padding) for e in range(num_envs)]
        self.envs = gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP)
        self.obs, _ = self.envs.reset(seed=seed)
        self.needs_reset = np.zeros(num_envs, bool)
        self.rng = np.random.default_rng(seed + 1)

    def collect(self, actions: np.ndarray) -> dict[str, np.ndarray]:
        """``actions [T, E]``; ignored by the env on reset-only steps, as in NEXT_STEP."""
        obs_t, next_t, rew, term, trunc = [], [], [], [], []
        for a in actions:
            next_obs, r, te, tr, _ = self.envs.step(a)
            obs_t.append(self.obs)
            next_t.append(next_obs)
            rew.append(r)
            term.append(te)
            trunc.append(tr)
            self.obs = next_obs
        done = np.array(term) | np.array(trunc)
        valid = np.empty(done.shape, bool)
        valid[0] = ~self.needs_reset
        valid[1:] = ~done[:-1]
        self.needs_reset = done[-1].copy()
        em = lambda x: np.ascontiguousarray(np.swapaxes(np.asarray(x), 0, 1))  # noqa: E731
        E, T = done.shape[1], done.shape[0]
        return {
            "obs": em(obs_t),
            "next_obs": em(next_t),
            "action": em(actions).astype(np.int64),
            "reward": em(rew).astype(np.float32),
            "terminated": em(term),
            "truncated": em(trunc),
            "valid": em(valid),
            "priority": self.rng.random((E, T)).astype(np.float32) * 3,
            "final_obs": self.obs.copy(),
        }


def scripted_actions(T: int, E: int) -> list[np.ndarray]:
    a = [np.zeros((T, E), np.int64) for _ in range(3)]
    a[0][0, 0] = a[0][T - 1, 0] = TERMINATE  # env 0: ends at t=0 and at the last step
    a[0][2, 1], a[0][5, 1] = TERMINATE, TRUNCATE  # env 1: two ends in one trajectory
    a[1][1, 1] = a[1][3, 1] = TERMINATE  # ... then a one-step episode
    a[0][T - 1, 2] = TRUNCATE  # env 2: truncated at the last step
    a[1][1, 2] = TRUNCATE  # ... after an invalid first step: a one-step episode
    a[0][T - 2, 4] = TERMINATE  # env 4: the final obs is a reset obs
    return a  # env 3 never ends: its episode spans all trajectories


def first_of(traj: dict[str, np.ndarray], started: np.ndarray) -> np.ndarray:
    """``first [E, T]`` as a recurrent policy records it for the collected ``traj``: step t's
    observation starts an episode after a reset-only step (``valid[:, t - 1]`` False), and at
    step 0 where ``started`` (the actor's first observations, or a reset-only last step of the
    trajectory before). ``started`` is updated for the next trajectory."""
    valid = traj["valid"]
    first = np.empty(valid.shape, bool)
    first[:, 0] = started
    first[:, 1:] = ~valid[:, :-1]
    started[:] = ~valid[:, -1]
    return first


def act_on(policy: Any, traj: dict[str, np.ndarray], version: int = 1) -> Trajectory:
    """``traj`` (from :meth:`Collector.collect`) as the actor role hands it to a recurrent
    ``policy``: ``begin``, ``act`` on each step's observations (the policy's actions are
    recorded; the scripted env ended episodes by its own), ``episodes_started`` after every
    reset-only step."""
    E, T = traj["valid"].shape
    policy.begin(T, 0)
    actions, extras = [], []
    for t in range(T):
        a, x = policy.act(traj["obs"][:, t], t)
        actions.append(a)
        extras.append(x)
        if not traj["valid"][:, t].all():
            policy.episodes_started(np.flatnonzero(~traj["valid"][:, t]))
    return Trajectory(
        obs=traj["obs"],
        next_obs=None,
        action=np.stack(actions, 1).astype(np.int64),
        reward=traj["reward"],
        terminated=traj["terminated"],
        truncated=traj["truncated"],
        valid=traj["valid"],
        final_obs=traj["final_obs"],
        extras={k: np.stack([x[k] for x in extras], 1) for k in extras[0]},
        weights_version=version,
    )
