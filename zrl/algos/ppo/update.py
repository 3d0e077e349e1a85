"""``PPOUpdate``: PPO rounds on the actors' rollouts, optionally DD-PPO across learners.

The learner role reads the rollouts (SUB ``rollouts/``, the algorithm's wiring) and hands
each to :meth:`PPOUpdate.receive`; a round is one rollout per actor (``roles.actors``),
:class:`~zrl.algos.ppo.rounds.RoundBuffer` decides which rollouts form it, and
:meth:`PPOUpdate.train` trains it whole (``ppo.epochs`` passes of minibatches) and asks the
role to publish the weights after it.

With ``roles.learners > 1`` (DD-PPO) the update opens, through the role's services:

- a ``torch.distributed`` process group of the policy's learners
  (``zrl.distributed.learner_group.LearnerGroup``: learner 0's group store,
  ``zrl.distributed.group_store``, found by the others through the broker). Every learner
  holds the same round, computes the gradient of its slice of every minibatch and all-reduces
  it (the mean) before the optimizer step, so all learners apply the same update. Learner 0
  publishes the weights (:meth:`PPOUpdate.may_publish`, once the group has formed); the others
  follow them at the start of each round and count any drift. A learner that dies fails the
  others' all-reduce: they drop the round and re-form the group with its restarted learner,
  which takes learner 0's weights, Adam state and minibatch order
  (``PolicyLearners.rejoin``); past ``learner.group_timeout_s`` without it they stop
  (docs/algorithms.md, "Several PPO learners").
- SUB ``weights`` (followers only, ``services.follow_weights``).

On frame stacks ``[k, H, W]`` (Atari) a feed-forward model's rollouts are ``frame_unroll``s,
each frame once: the layout comes from the observation space at setup (full stacks from an
actor are refused, counted by the role), and a round's stacks are rebuilt from the frames
(``zrl.codecs.frames``) before GAE and the updates.

A recurrent actor-critic (``model.core``) trains on ``recurrent_unroll`` rollouts (full
stacks on frame-stacked envs too): its minibatches are whole env rows, each unrolled from the
state its actor recorded (:meth:`PPOUpdate.sequence_loss`, docs/recurrent.md).

On a Box action space the model is the Gaussian actor-critic (``zrl.nets.gaussian``): its
rollouts are ``continuous_unroll``s (float32 actions, the samples before the actors clipped
them) and the losses score them with its log-densities and entropies (summed over the action
dims). ``model.normalize_input`` statistics are updated after each round, from its
observations, and go out with the weights published after it; ``ppo.normalize_returns``
keeps the value targets' running statistics (in the checkpoint).
"""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from zrl.algos.api.learner import BaseUpdate, LearnerSetup, NonFiniteLossError, UpdateResult
from zrl.algos.kernel.optim import clipped_gradients, make_adam
from zrl.algos.kernel.policy_gradient import normalize, ppo_loss
from zrl.algos.kernel.policy_learners import PolicyLearners
from zrl.algos.kernel.value_normalizer import ValueNormalizer
from zrl.algos.ppo.config import PBT_HYPERPARAMETERS, PPOConfig
from zrl.algos.ppo.rounds import Rollout, RoundBuffer, recurrent_round_tensors, round_tensors
from zrl.codecs.frames import is_frame_space
from zrl.distributed.learner_group import CollectiveError
from zrl.nets.discrete import ActorCritic
from zrl.nets.encoders import observe_inputs
from zrl.nets.gaussian import GaussianActorCritic, check_distribution, distribution_of
from zrl.nets.recurrent import RecurrentActorCritic, is_recurrent
from zrl.nets.wire import load_arrays, model_to_arrays
from zrl.transport import protocol as P
from zrl.transport.messages import experience_schema, obs_shape, weights_version
from zrl.transport.schema import Size, validate

TICK_EVERY_STEPS = 16  # keep heartbeats going through a long round


class PPOUpdate(BaseUpdate):
    """The learner side of PPO / DD-PPO (see the module docstring)."""

    def __init__(self, setup: LearnerSetup) -> None:
        cfg = setup.config
        self.config = cfg
        self.model: nn.Module = setup.model
        self.log = setup.log
        self.train_stats = setup.train_stats
        self.services = setup.services
        self.device = torch.device(setup.device)
        """``learner.device``: the round's tensors go there once (GAE runs on the host)."""
        self.obs_shape = obs_shape(setup.observation_space)
        self.num_actions = int(getattr(setup.action_space, "n", 0))
        # A recurrent actor-critic's rollouts carry the state [E, R] they started from.
        self.recurrent = is_recurrent(self.model)
        self.frames = not self.recurrent and is_frame_space(setup.observation_space)
        """Frame stacks ``[k, H, W]`` come as ``frame_unroll`` rollouts (as the actors'
        policy sends them, ``zrl.algos.kernel.sampling``)."""
        self.sizes: dict[str, Size] = {"O": self.obs_shape}
        self.distribution = distribution_of(self.model)
        check_distribution(self.model, setup.action_space)
        continuous = self.distribution.continuous
        if continuous:  # the Gaussian policy: float32 actions [E, T, A]
            if self.recurrent or self.frames:
                raise ValueError("a Gaussian policy is feed-forward over flat observations")
            self.sizes["A"] = int(np.prod(setup.action_space.shape))
        elif self.recurrent:
            self.sizes["R"] = cast(RecurrentActorCritic, self.model).state_size
        elif self.frames:
            self.sizes["O"] = self.obs_shape[1:]
        # A game played from both seats (the config's, not the message's) adds passes.
        turns = not (continuous or self.recurrent or self.frames)
        turns &= cfg.env.multiagent.self_play_seats == "both"
        self.schema = experience_schema(
            "unroll",
            frames=self.frames,
            recurrent=self.recurrent,
            continuous=continuous,
            turns=turns,
        )
        self.optimizer = make_adam(self.model.parameters(), cfg.learner.lr, cfg.learner.adam_eps)
        # DD-PPO among the learners of this learner's policy (one each in a league with
        # exploiters: they train different players and must not average their gradients):
        # the learners' process group, its rendezvous through the broker.
        self.members = PolicyLearners(setup)
        self.learners = self.members.size
        self.learner_index = self.members.rank
        self.leader = self.members.leader
        self.group = self.members.group
        # Followers take the leader's weights (through the parameter server) every round.
        self.follow: Any = None if self.leader else self.services.follow_weights(self.model)
        self.weight_drift = 0.0
        c = cfg.section(PPOConfig)
        policy = cfg.learner_policy(setup.index)
        self.buffer = RoundBuffer(c.mode, cfg.policy_actors(policy), c.max_lag, c.round_timeout)
        self.rounds = 0
        self.updates = 0  # minibatch steps taken by this process (the summary line)
        self.last_loss = float("nan")
        self.training_s = 0.0  # time in rounds, against the uptime: is the learner the bottleneck?
        self.mixed_rounds = 0  # sync rounds whose rollouts came from several versions: must stay 0
        self.round_versions: list[int] = []
        self.last_parts: dict[str, float] = {}
        self.rng = torch.Generator().manual_seed(cfg.seed)
        self.members.optimizer, self.members.generator = self.optimizer, self.rng
        self.started = time.monotonic()
        self.value_normalizer = ValueNormalizer() if c.normalize_returns else None
        """``ppo.normalize_returns``: the value head's targets' running statistics."""
        self.exploits = 0
        """PBT: hyperparameters set (exploits applied) on this learner; a DD-PPO group's
        learners agree on it before each round (:meth:`sync_exploits`)."""
        self.members.shared_state = self.group_state
        self.members.load_shared_state = self.load_group_state
        self.entropy_coef = c.entropy_coef
        """The loss's entropy bonus: ``ppo.entropy_coef`` until PBT sets another."""

    # --- receiving --------------------------------------------------------------------

    def current_version(self, version: int) -> int:
        """The weights version the rounds are measured against: the learner's own (acked by
        the parameter server) for the leader, the followed one for a DD-PPO follower."""
        return version if self.follow is None else int(self.follow.version)

    def receive(self, msg: P.Message, version: int) -> None:
        self.buffer.add(self.validate(msg), self.current_version(version))

    def validate(self, msg: P.Message) -> Rollout:
        """The rollout in ``msg`` (an ``unroll`` TRAJECTORY, ``recurrent_unroll`` for a
        recurrent model, ``frame_unroll`` on frame stacks); raises ProtocolError."""
        sizes = validate(msg, self.schema, **self.sizes)
        if sizes["E"] == 0 or sizes["T"] == 0:
            raise P.ProtocolError(f"empty rollout ({sizes['E']} envs, {sizes['T']} steps)")
        if self.frames and sizes["S"] != sizes["T"] + self.obs_shape[0]:
            raise P.ProtocolError(
                f"rollout frames: {sizes['S']} per env for {sizes['T']} steps, not T + "
                f"{self.obs_shape[0]}"
            )
        a = msg.arrays
        if self.distribution.continuous:
            pass  # float32 samples, checked finite by the schema (unclipped: any value)
        elif a["action"].min() < 0 or a["action"].max() >= self.num_actions:
            raise P.ProtocolError(f"rollout actions outside [0, {self.num_actions})")
        version, actor = msg.meta.get("weights_version"), msg.meta.get("actor")
        if (
            not isinstance(version, int)
            or not isinstance(actor, int)
            or isinstance(version, bool)
            or isinstance(actor, bool)
        ):
            raise P.ProtocolError("rollout without integer weights_version and actor")
        return Rollout(version, actor, a)

    # --- training ---------------------------------------------------------------------

    @property
    def group_ready(self) -> bool:
        """Whether the DD-PPO group has formed (always, for a single learner)."""
        return self.members.ready

    def train(self, version: int) -> UpdateResult | None:
        if not self.members.ready:
            # LearnerGroupError past learner.group_timeout_s
            if self.members.poll() and self.leader and self.members.reformed:
                # Formed again: the round the failure dropped is not coming, and sync
                # actors wait for weights newer than theirs.
                return UpdateResult(updates=0, loss=self.last_loss, publish=True)
            return None
        if self.follow is not None:
            self.follow_leader()
        current = self.current_version(version)
        chosen = self.buffer.take(current)
        if chosen is None:
            return None
        started = time.monotonic()
        try:
            if self.group is not None and self.config.pbt.members:  # only members exploit
                self.sync_exploits()
            steps = self.train_round(chosen, current)
        except NonFiniteLossError as exc:
            exc.source = f"round {self.rounds + 1}"
            raise
        except CollectiveError as exc:  # a learner died or left: round dropped, group re-formed
            self.members.rejoin(exc)
            return None
        finally:
            self.training_s += time.monotonic() - started
        # Published even after a round without valid samples: in sync mode the actors wait for
        # a version newer than the one the round consumed.
        samples = sum(int(r.arrays["valid"].sum()) for r in chosen)
        return UpdateResult(updates=steps, loss=self.last_loss, publish=True, samples=samples)

    def sync_exploits(self) -> None:
        """A DD-PPO group of a population member, before each round: only learner 0 hears the
        pbt role's exploits (in its weights' ACKs) and loads the better member's checkpoint
        and hyperparameters; one small all-reduce (max) of ``exploits`` and its negation finds
        whether any learner has exploited since the last round, and then every learner takes
        learner 0's weights, optimizer (with its learning rate) and group state."""
        assert self.group is not None
        stop = self.services.stop_event
        mine = torch.tensor([float(self.exploits), -float(self.exploits)], dtype=torch.float64)
        counts = self.group.reduce_max(mine.to(self.group.device), self.members.tick, stop).cpu()
        newest, oldest = int(counts[0]), -int(counts[1])
        if newest != oldest:
            self.members.take_leaders_state()
            self.exploits = newest

    def follow_leader(self) -> None:
        """DD-PPO followers take the leader's weights after the same round; with identical
        averaged updates these equal their own, and any drift (which should stay 0)
        is measured and corrected. Weights from another round are only used for the version
        number: loading them would move this learner out of step."""
        follow = self.follow
        while True:
            got = follow.sub.recv(block=False)
            if got is None:
                return
            msg = got[1]
            version, rounds = weights_version(msg.meta), msg.meta.get("rounds")
            if msg.kind != P.WEIGHTS or version is None:
                follow.sub.drop(msg.sender or "?", "not versioned weights")
                continue
            if not follow.from_params(msg.sender or "?"):
                follow.sub.drop(msg.sender or "?", "weights not from a params role")
                continue
            follow.version = max(follow.version, version)
            if rounds != self.rounds:
                continue
            before = model_to_arrays(self.model)
            try:
                load_arrays(self.model, msg.arrays)
            except ValueError as exc:
                follow.sub.drop(msg.sender or "?", f"weights do not fit the model: {exc}")
                continue
            self.weight_drift = max(
                float(np.max(np.abs(before[k] - msg.arrays[k]))) for k in before
            )

    def train_round(self, chosen: list[Rollout], current: int) -> int:
        """Train one round; the minibatch steps taken."""
        c = self.config.section(PPOConfig)
        versions = sorted({r.version for r in chosen})
        if c.mode == "sync" and len(versions) > 1:
            self.mixed_rounds += 1
        self.round_versions = versions
        # Policy lag: how many versions behind the weights being trained the data is.
        self.train_stats.add_with_max(
            policy_lag=float(np.mean([current - r.version for r in chosen]))
        )
        round_started = time.perf_counter()
        T = self.config.actor.trajectory_length
        nominal = self.buffer.round_size * self.config.env.num_envs  # env rows of a full round
        if self.recurrent:
            # Whole env rows: the core is unrolled over each from the state it recorded.
            model = cast(RecurrentActorCritic, self.model)
            data = recurrent_round_tensors(model, chosen, c.gamma, c.gae_lambda, self.device)
            mb = max(1, c.minibatch_size // T)
        else:
            feed_forward = cast(ActorCritic | GaussianActorCritic, self.model)
            data = round_tensors(
                feed_forward,
                chosen,
                c.gamma,
                c.gae_lambda,
                frames=self.frames,
                value_normalizer=self.value_normalizer,
                device=self.device,
            )
            if self.value_normalizer is not None:  # raw returns in, normalized targets out
                self.value_normalizer.update(data["return"])
                data["return"] = self.value_normalizer.normalize(data["return"])
            mb, nominal = c.minibatch_size, nominal * T
        n = len(data["obs"])
        if n == 0 or (self.recurrent and not data["valid"].any()):
            return 0  # no valid samples (only reset steps)
        # Steps per epoch from the configured round size, not from this round's count of valid
        # samples (autoreset steps vary): DD-PPO learners must take the same number of steps.
        per_epoch = max(1, nominal // mb)
        steps = 0
        for _ in range(c.epochs):
            order = torch.randperm(n, generator=self.rng)  # on the host: the generator's
            for j in range(per_epoch):
                idx = order[torch.arange(j * mb, (j + 1) * mb) % n]  # wraps on a short round
                idx = idx.to(self.device)
                self.minibatch_step({k: v[idx] for k, v in data.items()}, steps)
                steps += 1
                if steps % TICK_EVERY_STEPS == 0:
                    self.services.tick()
        # The input statistics move after the round, which trained under those its actors
        # acted with (its ratios start at 1): the next weights carry them.
        observe_inputs(self.model, data["obs"])
        self.rounds += 1
        self.train_stats.add(round_s=time.perf_counter() - round_started)
        return steps

    def part(self, size: int) -> slice:
        """DD-PPO: this learner's slice of a minibatch of ``size`` samples (or rows)."""
        share = size // self.learners
        return slice(self.learner_index * share, (self.learner_index + 1) * share)

    def minibatch_step(self, mb: dict[str, torch.Tensor], step: int) -> None:
        started = time.perf_counter()
        loss, parts = self.sequence_loss(mb) if self.recurrent else self.sample_loss(mb)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.group is not None:
            self.group.average_gradients(self.model, self.services.tick, self.services.stop_event)
        grad_norm = clipped_gradients(
            loss, list(self.model.parameters()), self.config.learner.grad_clip
        )
        self.optimizer.step()
        self.updates += 1
        self.last_loss = parts["loss"]
        self.last_parts = parts
        self.train_stats.add(
            **parts, grad_norm=grad_norm, update_ms=(time.perf_counter() - started) * 1e3
        )

    def sample_loss(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """The PPO loss of this learner's part of a feed-forward minibatch of samples."""
        c = self.config.section(PPOConfig)
        adv = normalize(mb["advantage"]) if c.normalize_advantages else mb["advantage"]
        if self.learners > 1:
            # Each learner takes its slice of the (identically ordered) minibatch.
            part = self.part(len(adv))
            mb = {k: v[part] for k, v in mb.items()}
            adv = adv[part]
        logits, values = self.model(mb["obs"])
        return self.loss(logits, values, adv, mb)

    def sequence_loss(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """The PPO loss of this learner's part of a recurrent minibatch of env rows
        ``[B, T, ...]``: the core unrolled over each row from its recorded state, the loss
        over the valid steps. Advantages are normalized over the whole minibatch's valid
        steps; with DD-PPO each learner's loss is weighted by its share of them, so the
        averaged gradient is the whole minibatch's."""
        c = self.config.section(PPOConfig)
        adv, total = mb["advantage"], int(mb["valid"].sum())
        if c.normalize_advantages:
            adv = adv.masked_scatter(mb["valid"], normalize(adv[mb["valid"]]))
        if self.learners > 1:
            part = self.part(len(adv))
            mb = {k: v[part] for k, v in mb.items()}
            adv = adv[part]
        model = cast(RecurrentActorCritic, self.model)
        logits, values, _ = model.unroll(mb["obs"], mb["state"], mb["first"])
        valid = mb["valid"]
        count = int(valid.sum())
        if count == 0:  # only reset steps in these rows: a zero gradient, for the allreduce
            return (logits.sum() + values.sum()) * 0.0, {"loss": 0.0}
        taken = {k: mb[k][valid] for k in ("action", "logp", "value", "return")}
        loss, parts = self.loss(logits[valid], values[valid], adv[valid], taken)
        return loss * (count * self.learners / total), parts

    def loss(
        self,
        logits: torch.Tensor,
        values: torch.Tensor,
        adv: torch.Tensor,
        mb: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """:func:`ppo_loss` of the model's ``logits`` and ``values`` on samples ``mb`` (their
        ``action``, ``logp``, ``value`` and ``return``) with advantages ``adv``, normalized
        already where the config asks."""
        c = self.config.section(PPOConfig)
        return ppo_loss(
            self.distribution.log_prob(logits, mb["action"]),
            mb["logp"],
            adv,
            values,
            mb["value"],
            mb["return"],
            self.distribution.entropy(logits),
            c.clip,
            c.value_clip,
            self.entropy_coef,
            c.value_coef,
            normalize_advantages=False,
        )

    # --- what the role asks -------------------------------------------------------------

    def may_publish(self) -> bool:
        # DD-PPO: one learner speaks for all, once the group has formed (the first weights
        # start the actors).
        return self.members.may_publish()

    def weights_meta(self) -> dict[str, int]:
        return {"rounds": self.rounds}

    def state_dict(self) -> dict[str, Any]:
        state = {
            "online": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rounds": self.rounds,
            "trained_version": self.buffer.trained_version,
            "entropy_coef": self.entropy_coef,
        }
        if self.value_normalizer is not None:
            state["value_normalizer"] = self.value_normalizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["online"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rounds = int(state["rounds"])
        self.buffer.trained_version = int(state["trained_version"])
        self.entropy_coef = float(state.get("entropy_coef", self.entropy_coef))
        if self.value_normalizer is not None and "value_normalizer" in state:
            self.value_normalizer.load_state_dict(state["value_normalizer"])

    def group_state(self) -> dict[str, Any]:
        """What every DD-PPO learner must hold alike besides the weights, the optimizer and
        the minibatch order, taken from learner 0 whenever the group forms: the rounds trained
        (followers load learner 0's weights of the same round), the entropy bonus and the
        value normalizer's statistics (a restarted or resumed follower's would scale its
        targets otherwise)."""
        state: dict[str, Any] = {"rounds": self.rounds, "entropy_coef": self.entropy_coef}
        if self.value_normalizer is not None:
            state["value_normalizer"] = self.value_normalizer.state_dict()
        return state

    def load_group_state(self, state: dict[str, Any]) -> None:
        self.rounds = int(state["rounds"])
        self.entropy_coef = float(state["entropy_coef"])
        if self.value_normalizer is not None and "value_normalizer" in state:
            self.value_normalizer.load_state_dict(state["value_normalizer"])

    def hyperparameters(self) -> dict[str, float]:
        """The values PBT may change (``PBT_HYPERPARAMETERS``), as they are now."""
        lr = float(self.optimizer.param_groups[0]["lr"])
        return {"learner.lr": lr, "ppo.entropy_coef": float(self.entropy_coef)}

    def set_hyperparameters(self, values: dict[str, float]) -> None:
        """Set PBT's hyperparameters (the optimizer's learning rate, the entropy bonus) from
        ``values``, by name; a name PBT does not change raises ValueError."""
        unknown = sorted(set(values) - set(PBT_HYPERPARAMETERS))
        if unknown:
            raise ValueError(f"PPO cannot set the hyperparameter(s) {unknown}")
        if "learner.lr" in values:
            for group in self.optimizer.param_groups:
                group["lr"] = float(values["learner.lr"])
        if "ppo.entropy_coef" in values:
            self.entropy_coef = float(values["ppo.entropy_coef"])
        self.exploits += 1

    def train_info(self) -> dict[str, float]:
        info = {"lr": float(self.optimizer.param_groups[0]["lr"])}
        if self.value_normalizer is not None:
            info["return_mean"] = self.value_normalizer.mean
            info["return_std"] = self.value_normalizer.std
        return info

    def heartbeat_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "rounds": self.rounds,
            "stale_rollouts": self.buffer.stale,
            "short_rounds": self.buffer.short_rounds,
            "mixed_rounds": self.mixed_rounds,
            "round_versions": self.round_versions,
            "busy": round(self.training_s / max(1e-9, time.monotonic() - self.started), 3),
        }
        info.update(self.members.heartbeat_info())
        if not self.leader:
            info["weight_drift"] = self.weight_drift
        for k in ("approx_kl", "clip_fraction", "entropy"):
            if k in self.last_parts:
                info[k] = round(self.last_parts[k], 4)
        return info

    def summary(self) -> str:
        drift = f", weight drift {self.weight_drift:g}" if not self.leader else ""
        group = self.members.summary()
        mode = self.config.section(PPOConfig).mode
        return (
            f"{self.rounds} rounds ({mode}), {self.updates} updates, "
            f"mixed-version rounds {self.mixed_rounds}, stale rollouts {self.buffer.stale}, "
            f"short rounds {self.buffer.short_rounds}{drift}{group}, "
            f"{self.training_s:.1f} s training of {time.monotonic() - self.started:.1f} s"
        )

    def close(self) -> None:
        """Destroy the DD-PPO process group."""
        self.members.close()
