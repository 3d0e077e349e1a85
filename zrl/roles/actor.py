"""``Actor``: steps a vector env with the algorithm's policy and sends what it collects.

The actor is the same for every algorithm. It owns the envs, the per-step buffers, the episode
statistics, the credit window and sending; the algorithm's ``ActorPolicy``
(``zrl.algos.api``, built once after WELCOME) chooses the actions and turns each trajectory of
``actor.trajectory_length`` steps of all envs into the message to send.

Sockets (where the algorithm's ``wiring.experience`` says):

- **replay**: PUSH ``experience`` -> broker -> a replay shard: one TRAJECTORY per trajectory
  (arrays [E, T, ...]). A full stream blocks the send (back-pressure): the actor retries the
  same message and collects nothing new meanwhile, so nothing is dropped and memory stays
  bounded. SUB ``acks/<id>/`` and ``incarnations/`` (topic bus): the shards' ACK of each
  insert and their incarnations. At most ``actor.max_in_flight`` trajectories may be
  unacknowledged (a credit window, ``zrl.roles.insert_acks``); one that no ack names within
  ``ACK_TIMEOUT_S``, or that a restarted shard lost, is counted lost, never hidden by later
  acks (docs/protocol.md, ``ack`` and ``incarnation``). On stop the actor waits for the last
  acks.
- **rollouts**: PUB topic ``rollouts/`` -> every learner (PPO). The policy may hold the actor
  back until newer weights arrive (``may_collect``); meanwhile the actor asks the parameter
  server for them once a second.
- **gradients**: PUSH ``gradients`` -> the parameter server (A3C: the policy computed the
  gradient of the rollout).
- SUB ``weights`` (topic bus) and one GET_WEIGHTS at start (late join): the newest version is
  applied before each trajectory and reported with it.
- DEALER -> an inference role's rpc (LOOKUP "inference"), where ``roles.inference`` places
  one on the actor's host: INFER/INFERRED (``zrl.roles.inference_client``). The actor then
  follows no weights and reports the oldest version that answered for each trajectory.
- DEALER -> the league's rpc (found with LOOKUP "league"), only in a run with a league
  (``roles.league``): MATCH, RESULTS, GET_SNAPSHOT (``zrl.roles.league_client``).

An actor acts for one learning policy for its whole life, ``config.actor_policy(index)``
(the default one, or a league player, round-robin over the indices): it follows that policy's
weights stream and publishes its rollouts on that policy's topic, and follows the stream of a
learning player the league matches it against too (``live_opponent``). On a multi-agent env
the vector env's slots are the learning policy's agents, and the actor lends it who plays the
others (``make_opponents``). With ``actor.env_groups`` > 1 it computes one group's actions
while the other steps (double-buffered sampling, ``zrl.envs.vector.EnvGroups``). All of this:
docs/architecture.md.

A NaN/inf observation or reward from the env, or an env that raises, is counted
(``non_finite_env``, ``env_errors``), logged with the actor's id and env step, and handled the
same way: envs reset, trajectory dropped. Seeds derive from the run seed and the index.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from zrl.algos.api.actor import ActorPolicy, ActorSetup, Trajectory
from zrl.algos.registry import get_algorithm
from zrl.envs.multiagent.envs import MultiAgentVectorEnv, fixed_opponents
from zrl.envs.vector import EnvGroups, EpisodeTracker
from zrl.roles.base import Role
from zrl.roles.inference_client import (
    InferenceClient,
    InferenceStopped,
    RemoteModel,
    connect_inference,
)
from zrl.roles.insert_acks import InsertAcks
from zrl.roles.model_opponents import ModelOpponents
from zrl.roles.step_buffers import ALL_ENVS, StepBuffers, env_major
from zrl.roles.weights import WeightsFollower
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel
from zrl.utils.runtime import actor_seed, limit_torch_threads

EOS_TIMEOUT_S = 5.0
WEIGHTS_WAIT_FETCH_S = 1.0  # waiting this long for a new version: ask the parameter server


class NonFiniteEnvError(FloatingPointError):
    """The env returned a NaN/inf observation or reward."""


class Actor(Role):
    role = "actor"
    # How long teardown waits for the acks of what is still in flight.
    eos_timeout_s = EOS_TIMEOUT_S

    def __init__(self, broker: str, **kwargs: Any) -> None:
        super().__init__(broker, **kwargs)
        self.actor_index = self.index if self.index is not None else 0
        self.envs: Any = None
        self.step_info: tuple[str, ...] = ()
        """The per-env arrays of the envs' step info recorded with each step (the
        ``passes`` of a turn-based game played from both seats)."""
        self.num_envs = 0
        self.obs = np.zeros((0, 0), np.float32)
        self.obs_dtype = np.dtype(np.float32)
        self.needs_reset = np.zeros(0, dtype=bool)
        self.episodes = EpisodeTracker(0)
        self._episodes_reported = 0
        self.env_steps = 0
        self.trajectories = 0
        self.env_errors = 0
        self.non_finite_env = 0
        self.pending: P.Message | None = None
        self.pending_steps = 0
        self.blocked_since: float | None = None
        self.waiting_since: float | None = None
        self.next_fetch = 0.0
        self.acks: Channel | None = None
        self.output_stream = ""
        """The stream its experience leaves by (``open_outputs``)."""
        self.credit = InsertAcks(1, self.log, lambda: self.output.next_seq)
        self.started = time.monotonic()
        self.matchmaker: Any = None  # the league's client, in a run with a league
        self.policy_name = M.DEFAULT_POLICY
        self.live: dict[str, WeightsFollower] = {}  # other learning players we play against
        self.build_opponent: Any = None  # a fresh model for an opponent (multi-agent envs)
        self.weights: WeightsFollower | None = None  # None: an inference role runs the model
        self.inference: InferenceClient | None = None

    def setup(self) -> None:
        cfg = self.config
        algorithm = get_algorithm(cfg.algo)
        self.policy_name = cfg.actor_policy(self.actor_index)
        self.open_outputs(algorithm.wiring.experience)
        limit_torch_threads(cfg.actor.torch_threads)
        self.seed = actor_seed(cfg.seed, self.actor_index)
        torch.manual_seed(cfg.seed)  # same initial weights as the learner until the first version
        self.rng = np.random.default_rng(self.seed)
        groups = cfg.actor.env_groups
        if groups > 1:
            size = cfg.env.num_envs // groups
            self.envs = EnvGroups([self.make_envs(num_envs=size) for _ in range(groups)])
        else:
            self.envs = self.make_envs()
        self.num_envs = self.envs.num_envs
        one = self.envs.groups[0] if isinstance(self.envs, EnvGroups) else self.envs
        self.step_info = tuple(getattr(one, "step_info", ()))
        spaces = (self.envs.single_observation_space, self.envs.single_action_space)
        self.model = self.make_model(*spaces)
        self.model.eval()
        self.inference = connect_inference(self, self.actor_index)
        if self.inference is None:
            self.weights = WeightsFollower(self, self.model, self.policy_name)
            self.policy: ActorPolicy = self.make_policy(spaces, self.model)
        else:  # the inference role of this host runs the forwards (connected at the first)
            self.policy = self.make_policy(spaces, RemoteModel(self.model, self.inference))
        if isinstance(self.envs, MultiAgentVectorEnv):
            self.envs.opponents = self.make_opponents(self.envs, spaces)
        if self.weights is not None:
            self.weights.fetch_latest()
        self.obs_dtype = M.obs_dtype(spaces[0])
        obs, _ = self.envs.reset(seed=self.seed)
        self.obs = M.as_obs(obs, self.num_envs, self.obs_dtype)
        self.needs_reset = np.zeros(self.num_envs, dtype=bool)
        self.episodes = EpisodeTracker(self.num_envs)
        # Credit window: a trajectory counts as in flight until a replay shard acknowledges
        # its insertion. Bounding it bounds how stale the data in replay can be, whatever
        # the socket buffers between here and the shard could hold.
        self.credit = InsertAcks(cfg.actor.max_in_flight, self.log, lambda: self.output.next_seq)

    def make_policy(self, spaces: tuple[Any, Any], model: Any) -> ActorPolicy:
        """The algorithm's policy over ``model`` (this actor's, or the inference role's
        stand-in for it), its envs, seed and random stream, for ``spaces`` (observation,
        action)."""
        algorithm = get_algorithm(self.config.algo)
        return algorithm.policy(
            ActorSetup(
                config=self.config,
                observation_space=spaces[0],
                action_space=spaces[1],
                num_envs=self.num_envs,
                model=model,
                actor_index=self.actor_index,
                seed=self.seed,
                rng=self.rng,
                log=self.log,
                train_stats=self.train_stats,
            )
        )

    def make_opponents(self, envs: MultiAgentVectorEnv, spaces: tuple[Any, Any]) -> ModelOpponents:
        """Who plays the agents of a multi-agent env that are not this actor's slots: the
        league's choice when one runs, else ``env.multiagent.opponent``; ``self`` is this
        actor's model at its current weights."""
        cfg = self.config
        fixed = fixed_opponents(envs, cfg.env.multiagent.opponent, self.seed + 1)

        def build() -> Any:
            return self.make_model(*spaces).eval()

        self.build_opponent = build
        self.matchmaker = self.make_matchmaker()
        return ModelOpponents(fixed, self.model, build, self.matchmaker, self.live_opponent)

    def make_matchmaker(self) -> Any:
        """The league's client when the run has a league (``roles.league``), else None."""
        if not self.config.roles.league:
            return None
        from zrl.roles.league_client import LeagueClient

        return LeagueClient(self, self.policy_name, self.live_opponent)

    def live_opponent(self, policy: str) -> Any:
        """The model of another learning policy at its newest weights, following its stream
        from the first call on; None for a name that is no other learning policy, or while
        its weights have not come."""
        if policy == self.policy_name or policy not in self.config.policies:
            return None
        follower = self.live.get(policy)
        if follower is None:
            follower = self.live[policy] = WeightsFollower(self, self.build_opponent(), policy)
            follower.fetch_latest(timeout=0.5)
        return follower.model if follower.version > 0 else None

    def open_outputs(self, experience: str) -> None:
        """The sockets trajectories leave by, for the algorithm's ``wiring.experience``."""
        self.output_topic: str | None = None
        if experience == "replay":
            # Subscribe first: the subscription must reach the broker before our first insert
            # is acknowledged, or the window would wait for an ack that was never delivered.
            self.acks = self.open_subscriber([P.ack_topic(self.id), P.INCARNATIONS_TOPIC], "acks")
            self.output = self.open_push("experience", hwm=2)
        elif experience == "rollouts":
            self.output = self.open_publisher("rollouts", hwm=1000)
            self.output_topic = M.policy_topic(P.ROLLOUTS_TOPIC, self.policy_name)
        else:
            self.output = self.open_push("gradients", hwm=2)
        self.output_stream = self.output.name

    def on_reregistered(self) -> None:
        # Trajectories in flight through a broker that died are gone: say how many, and
        # reopen the window instead of waiting for acks that cannot come.
        self.credit.lose_all("were unacknowledged when the broker went away")

    # --- collection -------------------------------------------------------------------

    def on_env_error(self, exc: Exception) -> None:
        """An env raised or returned NaN/inf: count it, reset the envs and drop the partial
        trajectory."""
        self.env_errors += 1
        if self.env_errors == 1 or self.env_errors % 100 == 0:
            self.log.warning(
                "env raised %s: %s (error %d; envs reset, trajectory dropped)",
                type(exc).__name__,
                exc,
                self.env_errors,
            )
        obs, _ = self.envs.reset(seed=self.seed + self.env_errors)
        self.policy.episodes_started(np.arange(self.num_envs))
        self.episodes.running_return[:] = 0.0  # the aborted episodes are not finished episodes
        self.episodes.running_length[:] = 0
        self.obs = M.as_obs(obs, self.num_envs, self.obs_dtype)
        self.needs_reset = np.zeros(self.num_envs, dtype=bool)

    def check_finite(self, obs: np.ndarray, rewards: np.ndarray | None, t: int) -> None:
        """Raise NonFiniteEnvError (naming this role and the env step) on NaN/inf from the env."""
        bad = [] if obs.dtype == np.uint8 or np.isfinite(obs).all() else ["observation"]
        if rewards is not None and not np.isfinite(rewards).all():
            bad.append("reward")
        if bad:
            self.non_finite_env += 1
            raise NonFiniteEnvError(
                f"{self.id} at env step {self.env_steps + t * self.num_envs}: the env returned "
                f"a non-finite {' and '.join(bad)} ({self.non_finite_env} so far)"
            )

    def collect(self) -> P.Message | None:
        """T steps of every env, as the message the policy makes of them.

        The per-step loop does only what must happen per step (act, step, store); exploration
        draws, episode bookkeeping and priorities are done once per trajectory."""
        T, E = self.config.actor.trajectory_length, self.num_envs
        policy = self.policy
        buf = StepBuffers.empty(T, self.obs, policy)
        first_needs_reset = self.needs_reset
        version = self.weights_version
        if self.inference is not None:
            self.inference.take_oldest_version()  # count this trajectory's replies only
        policy.begin(T, self.env_steps)
        try:
            self.check_finite(self.obs, None, 0)  # after a reset, nothing checked it yet
            if isinstance(self.envs, EnvGroups):
                obs = self.collect_groups(self.envs, buf)
            else:
                obs = self.obs
                for t in range(T):
                    self.heartbeat_if_due()
                    buf.obs[t] = obs
                    buf.acted(t, ALL_ENVS, *policy.act(obs, t))
                    next_obs, r, term, trunc, info = self.envs.step(buf.action[t])
                    obs = M.as_obs(next_obs, E, self.obs_dtype)
                    self.check_finite(obs, r, t)
                    buf.stepped(t, ALL_ENVS, obs, r, term, trunc)
                    buf.recorded(t, ALL_ENVS, info, self.step_info)
                    self.report_episode_starts(buf, t, ALL_ENVS, first_needs_reset)
        except InferenceStopped:  # the run stops: the partial trajectory goes nowhere
            return None
        except Exception as exc:  # noqa: BLE001 - a user's env must not stop the actor
            self.on_env_error(exc)
            return None
        self.obs = obs
        if self.inference is not None:  # the oldest version among the replies that acted
            version = self.inference.take_oldest_version()
        trajectory = self.end_trajectory(first_needs_reset, buf)
        trajectory.weights_version = version
        out = policy.finish(trajectory)
        self.trajectories += 1
        if self.trajectories == 1:
            # Report the first env steps at the next tick, not up to a second later: the
            # head times the start-up (seconds_to_first_env_step) by that report.
            self._next_heartbeat = self._next_metrics = 0.0
        meta = {"weights_version": version, "actor": self.actor_index, "env_steps": self.env_steps}
        return P.Message(out.kind, meta={**meta, **out.meta}, arrays=out.arrays)

    def collect_groups(self, envs: EnvGroups, buf: StepBuffers) -> np.ndarray:
        """``collect``'s T steps, double-buffered: group g's actions are computed while the
        groups sent before it step. Fills the buffers' rows of each group; returns the
        observation after the last step."""
        T, policy = len(buf.obs), self.policy
        final = np.empty_like(self.obs)
        buf.obs[0] = self.obs

        def act(t: int, g: int, rows: slice) -> None:
            buf.acted(t, rows, *policy.act(buf.obs[t, rows], t, rows))
            envs.groups[g].step_async(buf.action[t, rows])

        for g, rows in enumerate(envs.rows):
            act(0, g, rows)
        for t in range(T):
            self.heartbeat_if_due()  # a long trajectory is no silence to the broker
            for g, rows in enumerate(envs.rows):
                next_obs, r, term, trunc, info = envs.groups[g].step_wait()
                next_obs = M.as_obs(next_obs, rows.stop - rows.start, self.obs_dtype)
                self.check_finite(next_obs, r, t)
                buf.stepped(t, rows, next_obs, r, term, trunc)
                buf.recorded(t, rows, info, self.step_info)
                self.report_episode_starts(buf, t, rows, self.needs_reset)
                if t + 1 < T:
                    buf.obs[t + 1, rows] = next_obs
                    act(t + 1, g, rows)  # while the other groups step
                else:
                    final[rows] = next_obs
        return final

    def report_episode_starts(
        self, buf: StepBuffers, t: int, rows: slice, first_needs_reset: np.ndarray
    ) -> None:
        """After step ``t`` of the envs ``rows``: those whose step only reset them (their
        previous step ended an episode) start an episode at their next observation."""
        if t == 0:
            reset = first_needs_reset[rows]
        else:
            reset = buf.terminated[t - 1, rows] | buf.truncated[t - 1, rows]
        if reset.any():
            self.policy.episodes_started(np.flatnonzero(reset) + (rows.start or 0))

    def end_trajectory(self, first_needs_reset: np.ndarray, buf: StepBuffers) -> Trajectory:
        """Bookkeeping after T steps: which steps were real transitions, the episode returns,
        the env-step count and which envs reset first next time; the env-major trajectory."""
        done = env_major(buf.terminated | buf.truncated)
        self.needs_reset = done[:, -1].copy()
        # NEXT_STEP autoreset: the step after an episode end only resets that env.
        valid = np.empty(done.shape, bool)
        valid[:, 0] = ~first_needs_reset
        valid[:, 1:] = ~done[:, :-1]
        trajectory = buf.trajectory(valid, self.obs)
        self.episodes.update_trajectory(trajectory.reward, done, valid)
        self.pending_steps = int(valid.sum())
        self.env_steps += self.pending_steps
        return trajectory

    # --- acks -------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return self.credit.in_flight

    # --- loop -------------------------------------------------------------------------

    def step(self) -> None:
        if self.acks is not None:
            self.credit.read(self.acks)
            self.credit.expire()
            if self.pending is None and self.credit.window.full:
                if self.blocked_since is None:
                    self.blocked_since = time.monotonic()
                self.acks.sock.poll(100)
                return
        if self.pending is None:
            if self.weights is not None:
                self.weights.update()
            for follower in self.live.values():
                follower.update()
            if not self.policy.may_collect(self.weights_version):
                self.wait_for_weights()
                return
            self.waiting_since = None
            self.pending = self.collect()
            if self.pending is None:
                return
        # Blocks at most the socket's send timeout; on a full stream we retry next step.
        if self.output.send(self.pending, topic=self.output_topic):
            if self.acks is not None:
                self.credit.window.sent(self.pending.seq, self.pending_steps)
            self.policy.sent(int(self.pending.meta["weights_version"]))
            self.pending = None
            self.blocked_since = None
        elif self.blocked_since is None:
            self.blocked_since = time.monotonic()

    @property
    def weights_version(self) -> int:
        """The weights version the actor acts with: its own model's, or the last one its
        inference role answered with."""
        if self.inference is not None:
            return self.inference.version
        assert self.weights is not None
        return self.weights.version

    def wait_for_weights(self) -> None:
        assert self.weights is not None, "policies that wait for weights need them here"
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

    # --- reports ----------------------------------------------------------------------

    def train_info(self) -> dict[str, float]:
        """The training episodes finished since the last report, and the exploration."""
        out: dict[str, float] = {}
        tracker = self.episodes
        new = min(tracker.episodes - self._episodes_reported, len(tracker.finished_returns))
        self._episodes_reported = tracker.episodes
        if new > 0:
            returns = tracker.finished_returns[-new:]
            lengths = tracker.finished_lengths[-new:]
            out["episode_return"] = float(np.mean(returns))
            out["episode_return_min"] = float(np.min(returns))
            out["episode_return_max"] = float(np.max(returns))
            out["episode_length"] = float(np.mean(lengths))
        if self.envs is not None:
            out.update(self.policy.train_info())
        return out

    def heartbeat_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "env_steps": self.env_steps,
            "episodes": self.episodes.episodes,
            "weights_version": self.weights_version,
            "env_errors": self.env_errors,
            "non_finite_env": self.non_finite_env,
            **self.credit.report(),
            **self.policy.heartbeat_info(),
        }
        if self.output_stream:
            # The bytes of its experience path (experience, rollouts or gradients): the head
            # divides them by the env steps (summary.json's wire.<path>.bytes_per_env_step).
            sent = self.stats.stream(self.output_stream).sent_bytes
            info[f"wire_bytes_{self.output_stream}"] = sent
        if self.matchmaker is not None:
            info.update(self.matchmaker.heartbeat_info())
        if self.inference is not None:
            info.update(self.inference.heartbeat_info())
        if len(self.config.policies) > 1:
            info["policy"] = self.policy_name
        if isinstance(self.envs, MultiAgentVectorEnv):
            info.update(self.envs.heartbeat_info())
        recent = self.episodes.recent_mean()
        if recent is not None:
            info["episode_return"] = round(recent, 2)
        if self.blocked_since is not None:
            info["blocked_s"] = round(time.monotonic() - self.blocked_since, 1)
        if self.waiting_since is not None:
            info["waiting_for_weights_s"] = round(time.monotonic() - self.waiting_since, 1)
        return info

    def teardown(self) -> None:
        # End of stream: LINGER is no delivery guarantee (libzmq can drop queued messages of a
        # closing PUSH), so wait until the replay acknowledged everything we sent.
        if self.acks is not None:
            deadline = time.monotonic() + self.eos_timeout_s
            while self.in_flight > 0 and time.monotonic() < deadline:
                self.acks.sock.poll(50)
                self.credit.read(self.acks)
            self.credit.lose_all("sent but not acknowledged by replay at the stop")
        if self.matchmaker is not None:
            self.matchmaker.close()
        if self.envs is not None:
            self.envs.close()
