"""Ape-X DDPG / TD3 and SAC, the two algorithms for Box actions: what they share. Each has its
own actor policy and learner update on these (``zrl.algos.apex_ddpg``, ``zrl.algos.sac``).

Actor side (:class:`ContinuousPolicy`): uniform actions while warming up, then the
algorithm's exploring actions (:meth:`ContinuousPolicy.explore`: the deterministic policy plus
Gaussian noise, DDPG; samples of the squashed-Gaussian policy, SAC), kept inside the action
bounds, sent to replay as n-step transitions with initial priorities.

Learner side (:class:`ContinuousUpdate`). The generic learner role owns the sockets: it acks
every BATCH, hands it to ``receive``, calls ``train``, publishes the priorities of the result
to the shard that sampled the batch and the weights of ``model`` (policy and critics, the
actors use both) every ``learner.publish_interval`` updates.

- ``receive``: a BATCH of :data:`zrl.transport.messages.CONTINUOUS_TRANSITION_BATCH` (meta
  ``shard``), checked against the model (observation and action widths, actions inside the
  bounds) and kept; a malformed one raises ProtocolError (the replay validates what it
  stores, so this is a peer's bug).
- ``train``: per batch the algorithm's ``step``: one critic step, then (DDPG: every
  ``ddpg.policy_delay``-th update; SAC: always) an actor step, SAC's temperature step, and
  Polyak averaging of the targets with rate ``tau`` (TD3 only on the delayed steps). The
  result carries the new priorities ``|y - Q1(s, a)|`` of the batch's keys with
  ``replay.table: prioritized`` (a uniform table has no use for them), and the critic loss as
  the loss.

A NaN/inf loss or gradient raises :class:`NonFiniteLossError` before the optimizer step that
would apply it; the batch is dropped, never retried. The math is
``zrl.algos.apex_ddpg.losses.ddpg_update`` and ``zrl.algos.sac.losses.sac_update``; what
both use is here (:func:`check_batch`, :func:`frozen`, :func:`initial_priorities`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import Tensor, nn

from zrl.algos.api.actor import ActorSetup, BasePolicy, Outgoing, Trajectory
from zrl.algos.api.learner import LearnerSetup
from zrl.algos.kernel.batch_update import BatchStep, BatchUpdate
from zrl.algos.kernel.batches import PendingBatches
from zrl.algos.kernel.optim import make_adam
from zrl.algos.kernel.q_learning import BATCH_KEYS
from zrl.codecs.nstep import nstep_transitions
from zrl.nets.continuous import DDPGModel, SACModel, clip_to_bounds
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import validate

# --- the math both updates use -------------------------------------------------------


def check_batch(batch: Mapping[str, Tensor], grad_clip: float, caller: str) -> None:
    """Shared argument checks of the continuous-control updates."""
    missing = [k for k in BATCH_KEYS if k not in batch]
    if missing:
        raise ValueError(f"{caller}: batch is missing keys {missing}")
    if not grad_clip > 0:
        raise ValueError(f"grad_clip must be > 0 (math.inf disables), got grad_clip={grad_clip!r}")


@contextmanager
def frozen(modules: Iterable[nn.Module | None]) -> Iterator[None]:
    """Turn ``requires_grad`` off for every parameter of ``modules`` (None entries skipped),
    restoring the previous flags on exit. Used so the actor loss, which backpropagates through
    the critic, leaves no gradient in the critic weights."""
    params = [p for m in modules if m is not None for p in m.parameters()]
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)


def initial_priorities(
    q_taken: ArrayLike, returns: ArrayLike, discounts: ArrayLike, next_q: ArrayLike
) -> np.ndarray:
    """Actor-side priorities ``|R + discount * next_q - Q(s, a)|`` with ``next_q = Q(s', mu(s'))``
    from the actor's own (possibly stale) critic. All ``[M]``; returns float32 ``[M]``."""
    target = np.asarray(returns, dtype=np.float64) + np.asarray(
        discounts, dtype=np.float64
    ) * np.asarray(next_q, dtype=np.float64)
    return np.abs(target - np.asarray(q_taken, dtype=np.float64)).astype(np.float32)


def critic_parameters(model: DDPGModel | SACModel) -> list[nn.Parameter]:
    return [p for q in (model.q1, model.q2) if q is not None for p in q.parameters()]


@torch.no_grad()
def polyak(target: list[Tensor], online: list[Tensor], tau: float) -> None:
    """``target <- target + tau * (online - target)`` for matching parameter lists, in one
    fused call (this runs after every update; building state dicts each time would not)."""
    torch._foreach_lerp_(target, online, tau)


# --- learner side --------------------------------------------------------------------


class ContinuousUpdate(BatchUpdate):
    """A DDPGModel (DDPG / TD3) or SACModel (SAC), its targets and optimizers: what both
    updates hold. A subclass names its ``model_type``, passes its section's rates to
    ``__init__``, adds its own state, calls :meth:`join_learners` last, and takes its
    :meth:`step` (ending in :meth:`step_done`)."""

    model_type: type[DDPGModel] | type[SACModel] = DDPGModel
    target_policy = True
    """Whether the target network's policy is Polyak-averaged too (SAC has no target policy:
    ``a'`` is sampled from the online policy)."""

    def __init__(
        self, setup: LearnerSetup, *, actor_lr: float, critic_lr: float, tau: float
    ) -> None:
        cfg = setup.config
        model = setup.model
        if not isinstance(model, self.model_type):
            raise ValueError(
                f"{cfg.algo} needs zrl's {self.model_type.__name__}, got {type(model)}"
            )
        self.config = cfg
        self.train_stats = setup.train_stats
        self.model: nn.Module = model
        self.online: DDPGModel | SACModel = model
        self.target: DDPGModel | SACModel = copy.deepcopy(model)
        self.target.requires_grad_(False)
        self.tau = tau
        eps = cfg.learner.adam_eps
        self.actor_optimizer = make_adam(model.policy.parameters(), actor_lr, eps)
        self.critic_optimizer = make_adam(critic_parameters(model), critic_lr, eps)
        # Polyak pairs: the critics, and the policy where the target has one.
        target_modules: list[nn.Module | None] = [self.target.q1, self.target.q2]
        online_modules: list[nn.Module | None] = [model.q1, model.q2]
        if self.target_policy:
            target_modules.append(self.target.policy)
            online_modules.append(model.policy)
        self.target_params: list[Tensor] = [
            p for m in target_modules if m is not None for p in m.parameters()
        ]
        self.online_params: list[Tensor] = [
            p for m in online_modules if m is not None for p in m.parameters()
        ]
        self.send_priorities = cfg.replay.table == "prioritized"
        self.updates = 0
        """Updates this object made (the phase of TD3's delayed steps); restored from the
        learner's ``updates`` when its checkpoint carries one."""
        self.last_parts: dict[str, float] = {}
        self.pending = PendingBatches(setup.device)
        """Received batches not trained on yet: (shard, keys, tensors)."""

    # --- receiving --------------------------------------------------------------------

    def receive(self, msg: P.Message, version: int) -> None:
        model = self.online
        dims = validate(msg, M.CONTINUOUS_TRANSITION_BATCH, O=model.obs_dim, A=model.act_dim)
        actions = msg.arrays["action"]
        low = model.policy.action_low.cpu().numpy()
        high = model.policy.action_high.cpu().numpy()
        if dims["B"] and (np.any(actions < low) or np.any(actions > high)):
            raise P.ProtocolError(f"batch actions outside the bounds {low}..{high}")
        self.pending.add(msg)

    # --- training ---------------------------------------------------------------------

    def step_done(
        self,
        loss: float,
        td: np.ndarray,
        parts: dict[str, float],
        figures: dict[str, float],
        targets_due: bool,
    ) -> BatchStep:
        """The end of a subclass's :meth:`step`: keep the finite ``parts`` for the heartbeat
        and report the critic loss as the loss, so every learner has a learner/loss curve."""
        self.last_parts = {k: v for k, v in parts.items() if math.isfinite(v)} or self.last_parts
        return BatchStep(loss, td, {"loss": loss, "critic_loss": loss, **figures}, targets_due)

    def update_targets(self) -> None:
        polyak(self.target_params, self.online_params, self.tau)

    # --- the rest of the protocol -----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.updates = int(state.get("updates", 0))

    def train_info(self) -> dict[str, float]:
        return {
            "lr": float(self.critic_optimizer.param_groups[0]["lr"]),
            "actor_lr": float(self.actor_optimizer.param_groups[0]["lr"]),
        }

    def heartbeat_info(self) -> dict[str, Any]:
        parts = {k: round(v, 5) for k, v in self.last_parts.items()}
        return {**parts, **super().heartbeat_info()}


# --- actor side ----------------------------------------------------------------------


class ContinuousPolicy(BasePolicy):
    """Acting for Box actions (see the module docstring): ``warmup_steps`` of uniform actions,
    then the subclass's :meth:`explore`; every action clipped to the bounds. Initial
    priorities only for a prioritized table. A subclass gives its noise scales per env slot
    (:meth:`noise_sigmas`, zeros by default: they are logged)."""

    records_next_obs = True
    action_dtype = np.float32

    def __init__(self, setup: ActorSetup, *, warmup_steps: int) -> None:
        cfg = setup.config
        space = setup.action_space
        if not hasattr(space, "low") or len(space.shape) != 1:
            raise ValueError(f"{cfg.algo} needs a 1-D Box action space, got {space!r}")
        self.model: Any = setup.model
        self.rng = setup.rng
        self.low = np.asarray(space.low, dtype=np.float32)
        self.high = np.asarray(space.high, dtype=np.float32)
        self.act_dim = int(space.shape[0])
        self.action_shape = (self.act_dim,)
        self.half_range = (self.high - self.low) / 2
        self.warmup_steps = warmup_steps
        self.env_steps = 0
        self.prioritized = cfg.replay.table == "prioritized"
        self.n_step, self.gamma = cfg.replay.n_step, cfg.replay.gamma
        # The action-sampling stream (SAC) differs per actor; the weights come from params.
        torch.manual_seed(setup.seed)
        self.sigmas = self.noise_sigmas(setup)
        setup.log_start(
            f"action bounds {self.low.tolist()}..{self.high.tolist()}, noise sigma "
            f"{float(self.sigmas.max()):.3g}..{float(self.sigmas.min()):.3g}, "
            f"{self.warmup_steps} warm-up steps"
        )

    def noise_sigmas(self, setup: ActorSetup) -> np.ndarray:
        """The Gaussian noise scale of each of this actor's env slots (float32 ``[E]``)."""
        return np.zeros(setup.num_envs, np.float32)

    def explore(self, obs: np.ndarray, rows: slice) -> np.ndarray:
        """Exploring actions ``[E, act_dim]`` for ``obs`` of the envs ``rows``, past the
        warm-up (clipped to the bounds by :meth:`act`)."""
        raise NotImplementedError

    def begin(self, steps: int, env_steps: int) -> None:
        self.env_steps = env_steps

    @torch.no_grad()
    def act(
        self, obs: np.ndarray, t: int, rows: slice | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Exploring actions ``[E, act_dim]`` for ``obs [E, obs_dim]`` (of the envs ``rows``,
        or all), clipped to the bounds."""
        rows = slice(None) if rows is None else rows
        if self.env_steps < self.warmup_steps:
            a = self.rng.uniform(self.low, self.high, size=(len(obs), self.act_dim))
        else:
            a = self.explore(obs, rows)
        return clip_to_bounds(a, self.low, self.high), {}

    @torch.no_grad()
    def bootstrap_q(self, obs: np.ndarray, actions: np.ndarray | None = None) -> np.ndarray:
        """``Q1(s, a)`` if ``actions`` is given, else ``Q(s, mu(s))`` with ``Q = min(Q1, Q2)``
        when there are twin critics."""
        obs_t = torch.from_numpy(obs)
        if actions is not None:
            return self.model.q1(obs_t, torch.from_numpy(actions)).numpy()  # type: ignore[no-any-return]
        q1, q2 = self.model.q_values(obs_t, self.model.act(obs_t, deterministic=True))
        return (q1 if q2 is None else torch.minimum(q1, q2)).numpy()  # type: ignore[no-any-return]

    def finish(self, trajectory: Trajectory) -> Outgoing:
        tr = trajectory
        assert tr.next_obs is not None
        priority = np.zeros(tr.reward.shape, np.float32)
        if self.prioritized:
            ns = nstep_transitions(
                tr.reward, tr.terminated, tr.truncated, tr.valid, self.n_step, self.gamma
            )
            q_taken = self.bootstrap_q(tr.obs[ns.env, ns.start], tr.action[ns.env, ns.start])
            next_q = self.bootstrap_q(tr.next_obs[ns.env, ns.end])
            priority[ns.env, ns.start] = initial_priorities(
                q_taken, ns.returns, ns.discounts, next_q
            )
        return Outgoing(P.TRAJECTORY, tr.transitions(priority))

    def train_info(self) -> dict[str, float]:
        return {"warming_up": float(self.env_steps < self.warmup_steps)}

    def heartbeat_info(self) -> dict[str, Any]:
        return {"warming_up": self.env_steps < self.warmup_steps}
