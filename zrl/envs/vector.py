"""Vector environments, always in gymnasium's NEXT_STEP autoreset mode.

NEXT_STEP is the one mode every gymnasium vector env supports (the native
vectorized CartPole only has it): the step after an episode ends only resets that
env, its action is ignored and its reward is 0. Rollout code marks those steps
invalid instead of learning from them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from zrl.config.sections import EnvConfig
from zrl.envs import pomdp
from zrl.envs.base import EnvError, missing_dependency, register_env_namespace

pomdp.register()


def make_vector_env(
    cfg: EnvConfig,
    num_envs: int | None = None,
    env_fn: Callable[[], gym.Env] | None = None,
    evaluation: bool = False,
    opponents: Any = None,
) -> gym.vector.VectorEnv:
    """``num_envs`` copies of the configured env (or of ``env_fn()``, a user's factory).

    Atari ids (``zrl.envs.atari.is_atari``) get ``env.atari``'s preprocessing; ``evaluation``
    turns their training-only parts (episodic life, reward clipping) off, so evaluations
    play whole games and score them truly. Other envs ignore it.

    PettingZoo ids (``zrl.envs.multiagent.envs``) give one slot per agent of the learning policy
    (``num_envs`` games); ``opponents`` (``zrl.envs.multiagent.opponents.Opponents``) plays the
    others, None for a vector env that only gives its spaces."""
    n = num_envs or cfg.num_envs
    mode = cfg.vectorization
    if env_fn is not None:
        vec_cls = gym.vector.AsyncVectorEnv if mode == "async" else gym.vector.SyncVectorEnv
        try:
            return vec_cls([env_fn] * n, autoreset_mode=AutoresetMode.NEXT_STEP)
        except Exception as exc:
            raise EnvError(f"the env factory failed: {type(exc).__name__}: {exc}") from None
    from zrl.config.multiagent import is_multiagent
    from zrl.envs import atari  # it imports this module
    from zrl.envs.multiagent.envs import make_multiagent_vector_env
    from zrl.envs.multiagent.pettingzoo import MultiAgentEnvError

    if is_multiagent(cfg.id):
        try:
            slots = make_multiagent_vector_env(cfg.id, cfg.kwargs, cfg.multiagent, n)
        except MultiAgentEnvError as exc:
            raise EnvError(str(exc)) from None
        slots.opponents = opponents
        return slots

    if atari.is_atari(cfg.id):
        return atari.make_atari_vector_env(cfg, n, evaluation)
    from zrl.envs import vizdoom

    if vizdoom.is_vizdoom(cfg.id):  # RGB [3, 72, 128] frames, zrl.envs.vizdoom
        return vizdoom.make_vizdoom_vector_env(cfg, n)
    from zrl.envs import dmcontrol, minigrid

    if minigrid.is_minigrid(cfg.id):  # FlatImage observations, zrl.envs.minigrid
        return minigrid.make_minigrid_vector_env(cfg, n)
    if dmcontrol.is_dm_control(cfg.id):  # FlatState observations, zrl.envs.dmcontrol
        return dmcontrol.make_dm_control_vector_env(cfg, n)
    if mode == "envpool":
        raise EnvError(f"vectorization envpool is for Atari ids only, not {cfg.id!r}")
    register_env_namespace(cfg.id)
    try:
        if mode in ("auto", "native"):
            try:
                env = gym.make_vec(
                    cfg.id, num_envs=n, vectorization_mode="vector_entry_point", **cfg.kwargs
                )
            except (gym.error.Error, ValueError, TypeError) as exc:
                if mode == "native":
                    raise EnvError(f"{cfg.id} has no native vectorized form: {exc}") from None
                mode = "sync"
            else:
                _check_next_step(env, cfg.id)
                return env
        return gym.make_vec(
            cfg.id,
            num_envs=n,
            vectorization_mode=mode,
            vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP},
            **cfg.kwargs,
        )
    except gym.error.DependencyNotInstalled as exc:  # MuJoCo, Box2D: zrl's extra to install
        raise missing_dependency(cfg.id, exc) from None
    except (gym.error.Error, TypeError, ValueError) as exc:
        raise EnvError(f"cannot make environment {cfg.id!r}: {exc}") from None


def _check_next_step(env: gym.vector.VectorEnv, env_id: str) -> None:
    mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if mode != AutoresetMode.NEXT_STEP:
        env.close()
        raise EnvError(f"{env_id}: native vector env autoresets in {mode}, zrl needs NEXT_STEP")


class EpisodeTracker:
    """Returns and lengths of finished episodes across the envs of a vector env."""

    def __init__(self, num_envs: int) -> None:
        self.running_return = np.zeros(num_envs, dtype=np.float64)
        self.running_length = np.zeros(num_envs, dtype=np.int64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []
        self.episodes = 0

    def update(self, rewards: np.ndarray, done: np.ndarray, valid: np.ndarray) -> None:
        self.running_return += np.where(valid, rewards, 0.0)
        self.running_length += valid
        for i in np.flatnonzero(done & valid):
            self.finished_returns.append(float(self.running_return[i]))
            self.finished_lengths.append(int(self.running_length[i]))
            self.episodes += 1
        self.running_return[done] = 0.0
        self.running_length[done] = 0
        # Keep a bounded window: only recent episodes matter for reporting.
        del self.finished_returns[:-100]
        del self.finished_lengths[:-100]

    def update_trajectory(self, rewards: np.ndarray, done: np.ndarray, valid: np.ndarray) -> None:
        """The same as ``update`` for each step of [E, T] arrays, with cumulative sums instead
        of a Python step loop (this runs in the actor's hot path)."""
        cum_r = np.cumsum(np.where(valid, rewards, 0.0), axis=1)
        cum_n = np.cumsum(valid, axis=1)
        base_r = np.zeros(len(cum_r))
        base_n = np.zeros(len(cum_n), dtype=np.int64)
        for e, j in zip(*np.nonzero(done & valid), strict=True):  # row-major: time order per env
            self.finished_returns.append(float(self.running_return[e] + cum_r[e, j] - base_r[e]))
            self.finished_lengths.append(int(self.running_length[e] + cum_n[e, j] - base_n[e]))
            self.episodes += 1
            self.running_return[e] = 0.0
            self.running_length[e] = 0
            base_r[e], base_n[e] = cum_r[e, j], cum_n[e, j]
        self.running_return += cum_r[:, -1] - base_r
        self.running_length += cum_n[:, -1] - base_n
        del self.finished_returns[:-100]
        del self.finished_lengths[:-100]

    def recent_mean(self) -> float | None:
        return float(np.mean(self.finished_returns)) if self.finished_returns else None


class SplitStep:
    """A vector env's step in two halves, ``step_async(actions)`` then ``step_wait()``, so the
    caller can work while the env steps: ale-py's ``AtariVectorEnv`` ``send``/``recv`` (its
    C++ threads step), gymnasium's ``AsyncVectorEnv`` ``step_async``/``step_wait`` (its worker
    processes step); any other env simply steps in ``step_wait`` (correct, without overlap)."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.num_envs = int(env.num_envs)
        if callable(getattr(env, "send", None)) and callable(getattr(env, "recv", None)):
            self.mode = "send"
        elif isinstance(env, gym.vector.AsyncVectorEnv):
            self.mode = "async"
        else:
            self.mode = "step"
        self.pending = False
        self._actions: Any = None

    def step_async(self, actions: Any) -> None:
        if self.mode == "send":
            self.env.send(actions)
        elif self.mode == "async":
            self.env.step_async(actions)
        else:
            self._actions = actions
        self.pending = True

    def step_wait(self) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        self.pending = False
        if self.mode == "send":
            return self.env.recv()  # type: ignore[no-any-return]
        if self.mode == "async":
            return self.env.step_wait()  # type: ignore[no-any-return]
        actions, self._actions = self._actions, None
        return self.env.step(actions)  # type: ignore[no-any-return]

    def drain(self) -> None:
        """Finish a step still under way (its result dropped), so the env may be reset."""
        if self.pending:
            try:
                self.step_wait()
            except Exception:  # noqa: BLE001, S110 - the env is reset next anyway
                pass


class EnvGroups:
    """E envs as G vector envs of E/G each (``actor.env_groups``): the actor steps one group
    while it computes the actions of another (double-buffered sampling). Rows ``rows[g]`` of
    every ``[E, ...]`` array are group g's envs; ``reset(seed=s)`` seeds group g from
    ``s + rows[g].start``, so env i gets seed ``s + i`` as in one E-env vector env.
    ``step`` steps the groups in turn, so this is also a plain vector env."""

    def __init__(self, envs: list[Any]) -> None:
        self.groups = [SplitStep(env) for env in envs]
        self.rows: list[slice] = []
        start = 0
        for group in self.groups:
            self.rows.append(slice(start, start + group.num_envs))
            start += group.num_envs
        self.num_envs = start
        self.single_observation_space = envs[0].single_observation_space
        self.single_action_space = envs[0].single_action_space

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        obs = []
        for group, rows in zip(self.groups, self.rows, strict=True):
            group.drain()
            o, _ = group.env.reset(
                seed=None if seed is None else seed + rows.start, options=options
            )
            obs.append(np.asarray(o))
        return np.concatenate(obs), {}

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        for group, rows in zip(self.groups, self.rows, strict=True):
            group.step_async(actions[rows])
        results = [group.step_wait() for group in self.groups]
        obs, rewards, terminated, truncated = (
            np.concatenate([np.asarray(r[i]) for r in results]) for i in range(4)
        )
        return obs, rewards, terminated, truncated, {}

    def close(self) -> None:
        for group in self.groups:
            group.drain()
            group.env.close()
