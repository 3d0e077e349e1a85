"""``Actor``: steps a vector env with the latest policy and pushes trajectories.

Sockets:

- PUSH ``experience`` -> broker -> a replay shard: one TRAJECTORY message per
  ``trajectory_length`` steps of all envs (arrays [E, T, ...]), with Ape-X
  actor-side initial priorities. A full stream blocks the send (back-pressure):
  the actor then retries the same message and collects nothing new meanwhile, so
  nothing is dropped and memory stays bounded.
- SUB ``acks/<id>/`` (topic bus): the shard's ACK of each inserted trajectory. At most
  ``actor.max_in_flight`` trajectories may be unacknowledged (a credit window), which
  bounds how stale replay's data can get; on stop the actor waits for the last acks
  (end of stream) instead of trusting LINGER. An ack releases exactly the trajectory it
  names; one no ack names within ``ACK_TIMEOUT_S`` is counted lost
  (``trajectories_lost``/``steps_lost`` in heartbeats), so experience taken off the stream by
  anyone but a shard is reported, never hidden by the acks of later trajectories.
- SUB ``weights`` (topic bus) and one GET_WEIGHTS at start (late join): the newest
  version is applied before each trajectory and reported with it.

Exploration: env slot k of all N = actors x envs slots uses the Ape-X epsilon
base ** (1 + alpha * k / (N - 1)); seeds derive from the run seed and the index.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from zrl.algos.dqn import apex_epsilons, initial_priorities
from zrl.algos.returns import nstep_transitions
from zrl.envs import EpisodeTracker
from zrl.roles.base import Role
from zrl.roles.weights import WeightsFollower
from zrl.runtime import actor_seed, limit_torch_threads
from zrl.transport import protocol as P
from zrl.transport.credit import CreditWindow

ACK_TIMEOUT_S = 10.0  # then a restarted shard or a lost ack no longer holds us back
EOS_TIMEOUT_S = 5.0


def env_major(x: np.ndarray) -> np.ndarray:
    """Time-major ``[T, E, ...]`` collection buffers -> the ``[E, T, ...]`` message layout."""
    return np.ascontiguousarray(x.swapaxes(0, 1))


class Actor(Role):
    role = "actor"
    # How long teardown waits for the acks of what is still in flight.
    eos_timeout_s = EOS_TIMEOUT_S

    def setup_outputs(self) -> None:
        """The sockets trajectories leave by (subclasses for other algorithms replace them)."""
        # Subscribe first: the subscription must reach the broker before our first insert
        # is acknowledged, or the window would wait for an ack that was never delivered.
        self.acks = self.open_subscriber([P.ack_topic(self.id)], "acks")
        self.experience = self.open_push("experience", hwm=2)

    def setup_exploration(self) -> None:
        """Ape-X epsilon-greedy: one epsilon per env slot across all actors."""
        cfg = self.config
        self.num_actions = int(self.envs.single_action_space.n)
        slots = max(cfg.roles.actors, self.actor_index + 1) * self.num_envs
        all_eps = apex_epsilons(slots, cfg.actor.epsilon, cfg.actor.epsilon_alpha)
        first = self.actor_index * self.num_envs
        self.epsilons = all_eps[first : first + self.num_envs].astype(np.float32)
        self.log.info(
            "actor %d: %d x %s, epsilons %.3g..%.3g, seed %d",
            self.actor_index, self.num_envs, cfg.env.id,
            float(self.epsilons.max()), float(self.epsilons.min()), self.seed,
        )  # fmt: skip

    def setup(self) -> None:
        cfg = self.config
        self.setup_outputs()
        limit_torch_threads(cfg.actor.torch_threads)
        self.actor_index = self.index if self.index is not None else 0
        self.seed = actor_seed(cfg.seed, self.actor_index)
        torch.manual_seed(cfg.seed)  # same initial weights as the learner until the first version
        self.rng = np.random.default_rng(self.seed)
        self.envs = self.make_envs()
        self.num_envs = self.envs.num_envs
        self.model = self.make_model(
            self.envs.single_observation_space, self.envs.single_action_space
        )
        self.model.eval()
        self.weights = WeightsFollower(self, self.model)
        self.setup_exploration()
        self.weights.fetch_latest()
        obs, _ = self.envs.reset(seed=self.seed)
        self.obs = np.asarray(obs, dtype=np.float32).reshape(self.num_envs, -1)
        self.needs_reset = np.zeros(self.num_envs, dtype=bool)
        self.episodes = EpisodeTracker(self.num_envs)
        self._episodes_reported = 0
        self.env_steps = 0
        self.trajectories = 0
        self.pending: P.Message | None = None
        self.pending_steps = 0
        self.blocked_since: float | None = None
        # Credit window: a trajectory counts as in flight until a replay shard acknowledges
        # its insertion. Bounding it bounds how stale the data in replay can be, whatever
        # the socket buffers between here and the shard could hold.
        self.window = CreditWindow(cfg.actor.max_in_flight, ACK_TIMEOUT_S)
        self.env_errors = 0
        self.started = time.monotonic()

    @torch.no_grad()
    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self.model(torch.from_numpy(obs)).numpy()

    def on_reregistered(self) -> None:
        # Trajectories in flight through a broker that died are gone: say how many, and
        # reopen the window instead of waiting for acks that cannot come.
        if hasattr(self, "window") and self.in_flight > 0:
            lost = self.window.lose_all()
            self.log.warning(
                "%d trajectories were unacknowledged when the broker went away: counted as lost (%d in total)",
                lost, self.window.ledger.lost,
            )  # fmt: skip

    def on_env_error(self, exc: Exception) -> None:
        """An env raised: count it, reset the envs and drop the partial trajectory."""
        self.env_errors += 1
        if self.env_errors == 1 or self.env_errors % 100 == 0:
            self.log.warning("env raised %s: %s (error %d; envs reset, trajectory dropped)",
                             type(exc).__name__, exc, self.env_errors)  # fmt: skip
        obs, _ = self.envs.reset(seed=self.seed + self.env_errors)
        self.episodes.running_return[:] = 0.0  # the aborted episodes are not finished episodes
        self.episodes.running_length[:] = 0
        self.obs = np.asarray(obs, dtype=np.float32).reshape(self.num_envs, -1)
        self.needs_reset = np.zeros(self.num_envs, dtype=bool)

    def collect(self) -> P.Message | None:
        """T steps of every env, as one TRAJECTORY message.

        The per-step loop does only what must happen per step (forward, act, step, store);
        exploration draws, episode bookkeeping and priorities are done once per trajectory."""
        cfg = self.config
        T, E = cfg.actor.trajectory_length, self.num_envs
        obs_dim = self.obs.shape[1]
        # Time-major buffers: each step writes one contiguous row.
        obs_t = np.empty((T, E, obs_dim), np.float32)
        next_t = np.empty((T, E, obs_dim), np.float32)
        actions_t = np.empty((T, E), np.int64)
        rewards_t = np.empty((T, E), np.float32)
        terminated_t = np.empty((T, E), bool)
        truncated_t = np.empty((T, E), bool)
        q_t = np.empty((T, E, self.num_actions), np.float32)
        explore = self.rng.random((T, E)) < self.epsilons
        random_actions = self.rng.integers(0, self.num_actions, size=(T, E))
        first_needs_reset = self.needs_reset
        version = self.weights.version
        obs = self.obs
        for t in range(T):
            q = self.q_values(obs)
            a = np.where(explore[t], random_actions[t], q.argmax(axis=1))
            try:
                next_obs, r, term, trunc, _ = self.envs.step(a)
            except Exception as exc:  # noqa: BLE001 - a user's env must not stop the actor
                self.on_env_error(exc)
                return None
            obs_t[t] = obs
            next_t[t] = next_obs.reshape(E, -1)
            actions_t[t] = a
            rewards_t[t] = r
            terminated_t[t] = term
            truncated_t[t] = trunc
            q_t[t] = q
            obs = next_t[t]
        self.obs = obs
        rewards, terminated, truncated, valid = self.end_trajectory(
            first_needs_reset, rewards_t, terminated_t, truncated_t
        )
        obs_buf, next_buf, actions = env_major(obs_t), env_major(next_t), env_major(actions_t)
        q_taken = np.take_along_axis(q_t, actions_t[..., None], axis=2)[..., 0].T
        nstep = nstep_transitions(
            rewards, terminated, truncated, valid, cfg.replay.n_step, cfg.replay.gamma
        )
        next_q = self.q_values(next_buf[nstep.env, nstep.end])
        priority = np.zeros((E, T), np.float32)
        priority[nstep.env, nstep.start] = initial_priorities(
            q_taken[nstep.env, nstep.start], nstep.returns, nstep.discounts, next_q
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

    def end_trajectory(
        self,
        first_needs_reset: np.ndarray,
        rewards_t: np.ndarray,
        terminated_t: np.ndarray,
        truncated_t: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Bookkeeping every actor does after T steps: which steps were real transitions, the
        episode returns, the env-step count and which envs reset first next time. Takes the
        time-major buffers; returns env-major ``(rewards, terminated, truncated, valid)``."""
        done_t = terminated_t | truncated_t
        self.needs_reset = done_t[-1].copy()
        rewards, terminated, truncated = (
            env_major(rewards_t), env_major(terminated_t), env_major(truncated_t)
        )  # fmt: skip
        # NEXT_STEP autoreset: the step after an episode end only resets that env.
        valid = np.empty(rewards.shape, bool)
        valid[:, 0] = ~first_needs_reset
        valid[:, 1:] = ~env_major(done_t)[:, :-1]
        self.episodes.update_trajectory(rewards, terminated | truncated, valid)
        self.pending_steps = int(valid.sum())
        self.env_steps += self.pending_steps
        return rewards, terminated, truncated, valid

    @property
    def in_flight(self) -> int:
        return self.window.in_flight

    def read_acks(self) -> None:
        while True:
            got = self.acks.recv(block=False)
            if got is None:
                return
            msg = got[1]
            # Only a replay shard's ack of a trajectory we actually sent, and still count as
            # in flight (or lost), releases it; a duplicate is dropped like a forgery.
            try:
                seq = P.acked_seq(msg, "replay-", self.experience.next_seq, "trajectory")
                if not self.window.ack(seq):
                    raise P.ProtocolError(f"ack of trajectory {seq} that is not in flight")
            except P.ProtocolError as exc:
                self.acks._drop(msg.sender or "?", str(exc))

    def expire_window(self) -> None:
        """Count trajectories no shard acknowledged within ``ACK_TIMEOUT_S`` as lost: a
        restarted shard or a lost ack must not deadlock the window."""
        lost = self.window.expire()
        if lost:
            self.log.warning(
                "%d trajectories unacknowledged by replay for %.0fs: counted as lost (%d in total)",
                lost, ACK_TIMEOUT_S, self.window.ledger.lost,
            )  # fmt: skip

    def step(self) -> None:
        self.read_acks()
        self.expire_window()
        if self.pending is None and self.window.full:
            if self.blocked_since is None:
                self.blocked_since = time.monotonic()
            self.acks.sock.poll(100)
            return
        if self.pending is None:
            self.weights.update()
            self.pending = self.collect()
            if self.pending is None:
                return
        # Blocks at most the socket's send timeout; on a full stream we retry next step.
        if self.experience.send(self.pending):
            self.window.sent(self.pending.seq, self.pending_steps)
            self.pending = None
            self.blocked_since = None
        elif self.blocked_since is None:
            self.blocked_since = time.monotonic()

    def train_info(self) -> dict[str, float]:
        """The training episodes finished since the last report, and the exploration."""
        out: dict[str, float] = {}
        if not hasattr(self, "episodes"):
            return out
        tracker = self.episodes
        reported = getattr(self, "_episodes_reported", 0)
        new = min(tracker.episodes - reported, len(tracker.finished_returns))
        self._episodes_reported = tracker.episodes
        if new > 0:
            returns = tracker.finished_returns[-new:]
            lengths = tracker.finished_lengths[-new:]
            out["episode_return"] = float(np.mean(returns))
            out["episode_return_min"] = float(np.min(returns))
            out["episode_return_max"] = float(np.max(returns))
            out["episode_length"] = float(np.mean(lengths))
        out.update(self.exploration_info())
        return out

    def exploration_info(self) -> dict[str, float]:
        """Ape-X: the smallest and largest epsilon of this actor's env slots."""
        eps = getattr(self, "epsilons", None)
        if eps is None or not len(eps):
            return {}
        return {"epsilon_min": float(eps.min()), "epsilon_max": float(eps.max())}

    def heartbeat_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "env_steps": self.env_steps,
            "episodes": self.episodes.episodes,
            "weights_version": self.weights.version,
            "in_flight": self.in_flight,
            "ack_timeouts": self.window.timeouts,
            "env_errors": self.env_errors,
            **self.window.report(),
        }
        recent = self.episodes.recent_mean()
        if recent is not None:
            info["episode_return"] = round(recent, 2)
        if self.blocked_since is not None:
            info["blocked_s"] = round(time.monotonic() - self.blocked_since, 1)
        return info

    def teardown(self) -> None:
        # End of stream: LINGER is no delivery guarantee (libzmq can drop queued messages of a
        # closing PUSH), so wait until the replay acknowledged everything we sent.
        if hasattr(self, "experience"):
            deadline = time.monotonic() + self.eos_timeout_s
            while self.in_flight > 0 and time.monotonic() < deadline:
                self.acks.sock.poll(50)
                self.read_acks()
            if self.in_flight > 0:
                self.log.warning(
                    "stopping with %d trajectories sent but not acknowledged by replay: counted as lost",
                    self.window.lose_all(),
                )
        if hasattr(self, "envs"):
            self.envs.close()
