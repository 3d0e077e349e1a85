"""``ContinuousActor``: the actor of Ape-X DDPG and SAC (``Box`` action spaces).

Sockets: exactly those of the Ape-X DQN ``Actor`` (its credit window, acks and end of stream
are inherited unchanged):

- PUSH ``experience`` -> a replay shard: one TRAJECTORY message per ``trajectory_length``
  steps of all envs, with ``action`` float32 ``[E, T, act_dim]`` and actor-side initial
  priorities.
- SUB ``acks/<id>/``: the shard's ACK of each insert (at most ``actor.max_in_flight`` unacked).
- SUB ``weights`` (+ one GET_WEIGHTS at start): the newest policy and critics.

Acting:

- the first ``ddpg.warmup_steps`` / ``sac.warmup_steps`` env steps (of this actor, over all
  its envs): uniform random actions in the bounds, as SB3's ``learning_starts`` (a critic
  trained on one near-constant policy's actions generalises badly);
- **apex_ddpg**: ``mu(s) + sigma_k * half_range * N(0, I)``, where env slot k of all
  N = actors x envs slots has its own ``sigma_k = noise_sigma ** (1 + noise_alpha * k / (N-1))``
  (the Ape-X spread of ``zrl.algos.dqn.apex_epsilons``: a few slots explore widely, most stay
  near the deterministic policy);
- **sac**: a sample of the squashed-Gaussian policy (its own stochasticity explores).

Every action is clipped to the env's bounds (``clip_to_bounds``) before ``env.step``; a
non-finite action raises there instead of being clipped into a bound.

Initial priorities (only for ``replay.table: prioritized``; zeros otherwise, the table
ignores them): ``|R + discount * Q(s', mu(s')) - Q1(s, a)|`` from this actor's own copy of the
critics (``zrl.algos.ddpg.initial_priorities``), where ``Q`` is ``Q1``, or ``min(Q1, Q2)``
with twin critics (TD3, and always for SAC, with ``mu`` the mean action and no entropy term).
The learner then replaces them with its own ``|y - Q1(s, a)|``.

A NaN/inf observation or reward from the env is counted (``non_finite_env``), logged with
the actor's id and env step, and handled as an env error: envs reset, trajectory dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from zrl.algos.ddpg import initial_priorities
from zrl.algos.dqn import apex_epsilons
from zrl.algos.returns import nstep_transitions
from zrl.continuous_models import clip_to_bounds
from zrl.roles.actor import Actor, env_major
from zrl.transport import protocol as P


class NonFiniteEnvError(FloatingPointError):
    """The env returned a NaN/inf observation or reward."""


class ContinuousActor(Actor):
    role = "actor"

    def setup_exploration(self) -> None:
        cfg = self.config
        space = self.envs.single_action_space
        if not hasattr(space, "low") or len(space.shape) != 1:
            raise ValueError(f"{cfg.algo} needs a 1-D Box action space, got {space!r}")
        self.low = np.asarray(space.low, dtype=np.float32)
        self.high = np.asarray(space.high, dtype=np.float32)
        self.act_dim = int(space.shape[0])
        self.half_range = (self.high - self.low) / 2
        algo_cfg = cfg.ddpg if cfg.algo == "apex_ddpg" else cfg.sac
        self.warmup_steps = algo_cfg.warmup_steps
        self.non_finite_env = 0
        self.prioritized = cfg.replay.table == "prioritized"
        # The action-sampling stream (SAC) differs per actor; the weights come from params.
        torch.manual_seed(self.seed)
        self.sigmas = np.zeros(self.num_envs, np.float32)
        if cfg.algo == "apex_ddpg":
            slots = max(cfg.roles.actors, self.actor_index + 1) * self.num_envs
            all_sigmas = apex_epsilons(slots, cfg.ddpg.noise_sigma, cfg.ddpg.noise_alpha)
            first = self.actor_index * self.num_envs
            self.sigmas = all_sigmas[first : first + self.num_envs].astype(np.float32)
        self.log.info(
            "actor %d (%s): %d x %s, action bounds %s..%s, noise sigma %.3g..%.3g, "
            "%d warm-up steps, seed %d",
            self.actor_index, cfg.algo, self.num_envs, cfg.env.id, self.low.tolist(),
            self.high.tolist(), float(self.sigmas.max()), float(self.sigmas.min()),
            self.warmup_steps, self.seed,
        )  # fmt: skip

    # --- acting -----------------------------------------------------------------------

    @torch.no_grad()
    def policy_actions(self, obs: np.ndarray) -> np.ndarray:
        """Exploring actions ``[E, act_dim]`` for ``obs [E, obs_dim]``, before clipping."""
        if self.env_steps < self.warmup_steps:
            return self.rng.uniform(self.low, self.high, size=(len(obs), self.act_dim))
        obs_t = torch.from_numpy(obs)
        if self.config.algo == "sac":
            return self.model.act(obs_t, deterministic=False).numpy()  # type: ignore[no-any-return]
        mu = self.model.act(obs_t).numpy()
        noise = self.rng.standard_normal(mu.shape).astype(np.float32)
        return mu + noise * self.sigmas[:, None] * self.half_range  # type: ignore[no-any-return]

    def check_finite(self, obs: np.ndarray, rewards: np.ndarray | None, t: int) -> None:
        """Raise NonFiniteEnvError (naming this role and the env step) on NaN/inf from the env."""
        bad = [] if np.all(np.isfinite(obs)) else ["observation"]
        if rewards is not None and not np.all(np.isfinite(rewards)):
            bad.append("reward")
        if bad:
            self.non_finite_env += 1
            raise NonFiniteEnvError(
                f"{self.id} at env step {self.env_steps + t * self.num_envs}: the env returned "
                f"a non-finite {' and '.join(bad)} ({self.non_finite_env} so far)"
            )

    @torch.no_grad()
    def bootstrap_q(self, obs: np.ndarray, actions: np.ndarray | None = None) -> np.ndarray:
        """``Q1(s, a)`` if ``actions`` is given, else ``Q(s, mu(s))`` with ``Q = min(Q1, Q2)``
        when there are twin critics (see the module docstring)."""
        obs_t = torch.from_numpy(obs)
        if actions is not None:
            return self.model.q1(obs_t, torch.from_numpy(actions)).numpy()  # type: ignore[no-any-return]
        q1, q2 = self.model.q_values(obs_t, self.model.act(obs_t, deterministic=True))
        return (q1 if q2 is None else torch.minimum(q1, q2)).numpy()  # type: ignore[no-any-return]

    def collect(self) -> P.Message | None:
        """T steps of every env as one TRAJECTORY message (env-major ``[E, T, ...]`` arrays)."""
        cfg = self.config
        T, E = cfg.actor.trajectory_length, self.num_envs
        obs_dim = self.obs.shape[1]
        obs_t = np.empty((T, E, obs_dim), np.float32)
        next_t = np.empty((T, E, obs_dim), np.float32)
        actions_t = np.empty((T, E, self.act_dim), np.float32)
        rewards_t = np.empty((T, E), np.float32)
        terminated_t = np.empty((T, E), bool)
        truncated_t = np.empty((T, E), bool)
        first_needs_reset = self.needs_reset
        version = self.weights.version
        obs = self.obs
        for t in range(T):
            try:
                if t == 0:
                    self.check_finite(obs, None, t)  # after a reset, nothing checked it yet
                a = clip_to_bounds(self.policy_actions(obs), self.low, self.high)
                next_obs, r, term, trunc, _ = self.envs.step(a)
                next_obs = np.asarray(next_obs, dtype=np.float32).reshape(E, -1)
                self.check_finite(next_obs, np.asarray(r), t)
            except Exception as exc:  # noqa: BLE001 - a user's env must not stop the actor
                self.on_env_error(exc)
                return None
            obs_t[t] = obs
            next_t[t] = next_obs
            actions_t[t] = a
            rewards_t[t] = r
            terminated_t[t] = term
            truncated_t[t] = trunc
            obs = next_obs
        self.obs = obs
        rewards, terminated, truncated, valid = self.end_trajectory(
            first_needs_reset, rewards_t, terminated_t, truncated_t
        )
        obs_buf, next_buf, actions = env_major(obs_t), env_major(next_t), env_major(actions_t)
        priority = np.zeros((E, T), np.float32)
        if self.prioritized:
            ns = nstep_transitions(
                rewards, terminated, truncated, valid, cfg.replay.n_step, cfg.replay.gamma
            )
            q_taken = self.bootstrap_q(obs_buf[ns.env, ns.start], actions[ns.env, ns.start])
            next_q = self.bootstrap_q(next_buf[ns.env, ns.end])
            priority[ns.env, ns.start] = initial_priorities(
                q_taken, ns.returns, ns.discounts, next_q
            )
        self.trajectories += 1
        return P.Message(
            P.TRAJECTORY,
            meta={
                "weights_version": version,
                "actor": self.actor_index,
                "env_steps": self.env_steps,
            },
            arrays={
                "obs": obs_buf,
                "action": actions,
                "reward": rewards,
                "terminated": terminated,
                "truncated": truncated,
                "valid": valid,
                "next_obs": next_buf,
                "priority": priority,
            },
        )

    def exploration_info(self) -> dict[str, float]:
        """DDPG: the Gaussian noise scale (fraction of the half-range) of this actor's env
        slots; SAC explores by its own policy's entropy (``learner/entropy``, ``alpha``)."""
        out: dict[str, float] = {}
        if self.config.algo == "apex_ddpg" and len(self.sigmas):
            out = {"noise_sigma_min": float(self.sigmas.min()),
                   "noise_sigma_max": float(self.sigmas.max())}  # fmt: skip
        out["warming_up"] = float(self.env_steps < self.warmup_steps)
        return out

    def heartbeat_info(self) -> dict[str, Any]:
        info = super().heartbeat_info()
        info["non_finite_env"] = self.non_finite_env
        info["warming_up"] = self.env_steps < self.warmup_steps
        return info
