"""``OnPolicyActor``: the actor of IMPALA, PPO and A3C (``algo`` in the config).

It steps a vector env with a sampled (stochastic) policy and records the behaviour
log-probabilities. Where the rollout goes depends on the algorithm:

- **impala**: PUSH ``experience`` -> a replay shard's FIFO queue, exactly as the Ape-X
  actor (credit window of acknowledged inserts, end-of-stream wait). Actors never wait
  for the learner: V-trace corrects for the lag, and the learner drops unrolls older
  than ``impala.max_lag`` versions.
- **ppo**: PUB topic ``rollouts/`` -> every learner (DD-PPO learners each take a share of
  every minibatch). In ``ppo.mode: sync`` the actor sends one rollout per weights version
  and then waits for the next version, so a round never mixes versions; in ``async`` it
  sends up to ``ppo.max_lag + 1`` rollouts per version before waiting.
- **a3c**: the actor is an A3C worker: it computes the actor-critic gradient of its own
  rollout and PUSHes it on ``gradients`` to the parameter server, which applies it; the
  worker then continues with the newest weights it has (asynchronously).

Sockets (besides the base class's): SUB ``weights`` through ``WeightsFollower``, plus the
per-algorithm output above.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from zrl.algos.policy_gradient import a2c_loss
from zrl.algos.returns import rollout_gae
from zrl.algos.vtrace import categorical_entropy
from zrl.models import policy_logits, sample_categorical
from zrl.roles.actor import Actor, env_major
from zrl.transport import protocol as P

WEIGHTS_WAIT_FETCH_S = 1.0  # waiting this long for a new version: ask the parameter server


class OnPolicyActor(Actor):
    role = "actor"

    def setup_outputs(self) -> None:
        algo = self.config.algo
        if algo == "impala":
            super().setup_outputs()
        elif algo == "ppo":
            self.rollouts = self.open_publisher("rollouts", hwm=1000)
        elif algo == "a3c":
            self.gradients = self.open_push("gradients", hwm=2)
        else:
            raise ValueError(f"OnPolicyActor does not run algo {algo!r}")
        self.sent_per_version: dict[int, int] = {}
        self.waiting_since: float | None = None
        self.next_fetch = 0.0
        self.last_loss = float("nan")

    def setup_exploration(self) -> None:
        # Exploration is the policy's own sampling (Gumbel noise from self.rng, seeded by the
        # actor index); the actors differ only by their seeds.
        self.num_actions = int(self.envs.single_action_space.n)
        self.log.info(
            "actor %d (%s): %d x %s, seed %d",
            self.actor_index, self.config.algo, self.num_envs, self.config.env.id, self.seed,
        )  # fmt: skip

    # --- collection -------------------------------------------------------------------

    @torch.no_grad()
    def policy(self, obs: np.ndarray, gumbel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Actions sampled under the current weights (with this step's Gumbel noise) and
        their log-probabilities."""
        logp = torch.log_softmax(policy_logits(self.model, torch.from_numpy(obs)), dim=1)
        return sample_categorical(logp.numpy(), gumbel)

    def collect(self) -> P.Message | None:
        """T steps of every env as env-major [E, T] arrays, with behaviour log-probs."""
        T, E = self.config.actor.trajectory_length, self.num_envs
        obs_dim = self.obs.shape[1]
        obs_t = np.empty((T, E, obs_dim), np.float32)
        actions_t = np.empty((T, E), np.int64)
        logp_t = np.empty((T, E), np.float32)
        rewards_t = np.empty((T, E), np.float32)
        terminated_t = np.empty((T, E), bool)
        truncated_t = np.empty((T, E), bool)
        gumbel = self.rng.gumbel(size=(T, E, self.num_actions))
        first_needs_reset = self.needs_reset
        version = self.weights.version
        obs = self.obs
        for t in range(T):
            a, logp = self.policy(obs, gumbel[t])
            try:
                next_obs, r, term, trunc, _ = self.envs.step(a)
            except Exception as exc:  # noqa: BLE001 - a user's env must not stop the actor
                self.on_env_error(exc)
                return None
            obs_t[t] = obs
            actions_t[t] = a
            logp_t[t] = logp
            rewards_t[t] = r
            terminated_t[t] = term
            truncated_t[t] = trunc
            obs = np.asarray(next_obs, dtype=np.float32).reshape(E, -1)
        self.obs = obs
        rewards, terminated, truncated, valid = self.end_trajectory(
            first_needs_reset, rewards_t, terminated_t, truncated_t
        )
        self.trajectories += 1
        arrays = {
            "obs": env_major(obs_t),
            "action": env_major(actions_t),
            "logp": env_major(logp_t),
            "reward": rewards,
            "terminated": terminated,
            "truncated": truncated,
            "valid": valid,
            "bootstrap_obs": obs.copy(),
        }
        meta = {"weights_version": version, "actor": self.actor_index, "env_steps": self.env_steps}
        if self.config.algo == "a3c":
            return self.gradient_message(arrays, meta)
        return P.Message(P.TRAJECTORY, meta=meta, arrays=arrays)

    def gradient_message(self, rollout: dict[str, np.ndarray], meta: dict[str, Any]) -> P.Message:
        """A3C: the gradient of the actor-critic loss on this rollout, by parameter name."""
        c = self.config.a3c
        E, T = rollout["reward"].shape
        obs = torch.from_numpy(rollout["obs"].reshape(E * T, -1))
        logits, values = self.model(obs)
        with torch.no_grad():
            bootstrap = self.model.value(torch.from_numpy(rollout["bootstrap_obs"])).numpy()
        advantages, returns = rollout_gae(
            rollout["reward"], values.detach().numpy().reshape(E, T), rollout["terminated"],
            rollout["truncated"], rollout["valid"], bootstrap, c.gamma, c.gae_lambda,
        )  # fmt: skip
        valid = torch.from_numpy(rollout["valid"].reshape(-1))
        dist_logp = torch.log_softmax(logits, dim=-1)
        actions = torch.from_numpy(rollout["action"].reshape(-1))
        logp = dist_logp.gather(1, actions.unsqueeze(1))[:, 0]
        loss, parts = a2c_loss(
            logp[valid], values[valid],
            torch.from_numpy(returns.reshape(-1))[valid],
            torch.from_numpy(advantages.reshape(-1))[valid],
            categorical_entropy(logits[valid]),
            c.entropy_coef, c.value_coef,
        )  # fmt: skip
        self.model.zero_grad(set_to_none=True)
        loss.backward()
        grads = {
            name: np.ascontiguousarray(
                p.grad.numpy() if p.grad is not None else np.zeros(p.shape, np.float32)
            )
            for name, p in self.model.named_parameters()
        }
        self.last_loss = parts["loss"]
        self.train_stats.add(**parts)
        return P.Message(
            P.GRADIENTS, meta={**meta, "samples": int(valid.sum()), **parts}, arrays=grads
        )

    # --- loop -------------------------------------------------------------------------

    def may_collect(self) -> bool:
        """PPO: at most one rollout per version (sync) or ``max_lag + 1`` (async)."""
        if self.config.algo != "ppo":
            return True
        c = self.config.ppo
        version = self.weights.version
        allowed = 1 if c.mode == "sync" else c.max_lag + 1
        # Version 0 is this process's own initialisation, not the learner's weights.
        return version > 0 and self.sent_per_version.get(version, 0) < allowed

    def step(self) -> None:
        if self.config.algo == "impala":
            super().step()  # the replay credit window, exactly as the Ape-X actor
            return
        if self.pending is None:
            self.weights.update()
            if not self.may_collect():
                self.wait_for_weights()
                return
            self.waiting_since = None
            self.pending = self.collect()
            if self.pending is None:
                return
        out = self.rollouts if self.config.algo == "ppo" else self.gradients
        topic = P.ROLLOUTS_TOPIC if self.config.algo == "ppo" else None
        if out.send(self.pending, topic=topic):
            version = int(self.pending.meta["weights_version"])
            self.sent_per_version[version] = self.sent_per_version.get(version, 0) + 1
            for old in [v for v in self.sent_per_version if v < version - 8]:
                del self.sent_per_version[old]
            self.pending = None
            self.blocked_since = None
        elif self.blocked_since is None:
            self.blocked_since = time.monotonic()

    def wait_for_weights(self) -> None:
        now = time.monotonic()
        if self.waiting_since is None:
            self.waiting_since = now
            self.next_fetch = now + WEIGHTS_WAIT_FETCH_S
        if now >= self.next_fetch:
            # A publish can precede our subscription (or be lost): ask params directly.
            self.next_fetch = now + WEIGHTS_WAIT_FETCH_S
            self.weights.fetch_latest(timeout=0.5)
        else:
            self.weights.sub.sock.poll(50)

    @property
    def in_flight(self) -> int:
        return super().in_flight if self.config.algo == "impala" else 0

    def heartbeat_info(self) -> dict[str, Any]:
        info = super().heartbeat_info()
        if self.waiting_since is not None:
            info["waiting_for_weights_s"] = round(time.monotonic() - self.waiting_since, 1)
        if self.config.algo == "a3c" and np.isfinite(self.last_loss):
            info["loss"] = round(self.last_loss, 5)
        return info
