"""Ape-X DDPG / TD3 and SAC, the two algorithms for Box actions: what they share.

Actor side (``ContinuousPolicy``): the actions of the deterministic policy plus Gaussian
noise (DDPG) or samples of the squashed-Gaussian policy (SAC), kept inside the action bounds,
sent to replay as n-step transitions with initial priorities.

Learner side (:class:`ContinuousUpdate`). The generic learner role owns the sockets: it acks
every BATCH, hands it to ``receive``, calls ``train``, publishes the priorities of the result
to the shard that sampled the batch and the weights of ``model`` (policy and critics, the
actors use both) every ``learner.publish_interval`` updates.

- ``receive``: a BATCH of :data:`zrl.transport.messages.CONTINUOUS_TRANSITION_BATCH` (meta
  ``shard``), checked against the model (observation and action widths, actions inside the
  bounds) and kept; a malformed one raises ProtocolError (the replay validates what it
  stores, so this is a peer's bug).
- ``train``: per batch one critic step, then (DDPG: every ``ddpg.policy_delay``-th update;
  SAC: always) an actor step, SAC's temperature step, and Polyak averaging of the targets
  with rate ``tau`` (TD3 only on the delayed steps). The result carries the new priorities
  ``|y - Q1(s, a)|`` of the batch's keys with ``replay.table: prioritized`` (a uniform table
  has no use for them), and the critic loss as the loss.

A NaN/inf loss or gradient raises :class:`NonFiniteLossError` before the optimizer step that
would apply it; the batch is dropped, never retried. The math is
``zrl.algos.apex_ddpg.losses.ddpg_update`` and ``zrl.algos.sac.losses.sac_update``.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from zrl.algos.apex_ddpg.config import DDPGConfig
from zrl.algos.apex_ddpg.losses import ddpg_update, initial_priorities
from zrl.algos.apex_dqn.losses import apex_epsilons
from zrl.algos.api.actor import ActorSetup, BasePolicy, Outgoing, Trajectory
from zrl.algos.api.learner import LearnerSetup
from zrl.algos.kernel.batch_update import BatchStep, BatchUpdate
from zrl.algos.kernel.batches import PendingBatches
from zrl.algos.kernel.optim import make_adam
from zrl.algos.sac.config import SACConfig
from zrl.algos.sac.losses import default_target_entropy, sac_update
from zrl.nets.continuous import DDPGModel, SACModel, clip_to_bounds
from zrl.replay.nstep import nstep_transitions
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import validate


def critic_parameters(model: DDPGModel | SACModel) -> list[nn.Parameter]:
    return [p for q in (model.q1, model.q2) if q is not None for p in q.parameters()]


@torch.no_grad()
def polyak(target: list[Tensor], online: list[Tensor], tau: float) -> None:
    """``target <- target + tau * (online - target)`` for matching parameter lists, in one
    fused call (this runs after every update; building state dicts each time would not)."""
    torch._foreach_lerp_(target, online, tau)


class ContinuousUpdate(BatchUpdate):
    """A DDPGModel (DDPG / TD3) or SACModel (SAC), its targets and optimizers."""

    def __init__(self, setup: LearnerSetup) -> None:
        cfg = setup.config
        model = setup.model
        if not isinstance(model, DDPGModel | SACModel):
            raise ValueError(f"{cfg.algo} needs zrl's DDPGModel/SACModel, got {type(model)}")
        self.config = cfg
        self.train_stats = setup.train_stats
        self.model: nn.Module = model
        self.online: DDPGModel | SACModel = model
        self.sac = isinstance(model, SACModel)
        algo_cfg = cfg.section(SACConfig) if self.sac else cfg.section(DDPGConfig)
        self.target: DDPGModel | SACModel = copy.deepcopy(model)
        self.target.requires_grad_(False)
        eps = cfg.learner.adam_eps
        self.actor_optimizer = make_adam(model.policy.parameters(), algo_cfg.actor_lr, eps)
        self.critic_optimizer = make_adam(critic_parameters(model), algo_cfg.critic_lr, eps)
        # Polyak pairs: SAC has no target policy (a' is sampled from the online policy).
        target_modules: list[nn.Module | None] = [self.target.q1, self.target.q2]
        online_modules: list[nn.Module | None] = [model.q1, model.q2]
        if not self.sac:
            target_modules.append(self.target.policy)
            online_modules.append(model.policy)
        self.target_params: list[Tensor] = [
            p for m in target_modules if m is not None for p in m.parameters()
        ]
        self.online_params: list[Tensor] = [
            p for m in online_modules if m is not None for p in m.parameters()
        ]
        self.log_alpha = nn.Parameter(torch.tensor(math.log(cfg.section(SACConfig).init_alpha)))
        self.alpha_optimizer = make_adam([self.log_alpha], cfg.section(SACConfig).alpha_lr, eps)
        te = cfg.section(SACConfig).target_entropy
        self.target_entropy = default_target_entropy(model.act_dim) if te is None else te
        self.send_priorities = cfg.replay.table == "prioritized"
        self.updates = 0
        """Updates this object made (the phase of TD3's delayed steps); restored from the
        learner's ``updates`` when its checkpoint carries one."""
        self.last_parts: dict[str, float] = {}
        self.pending = PendingBatches(setup.device)
        """Received batches not trained on yet: (shard, keys, tensors)."""
        self.join_learners(setup)

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

    def step(self, batch: dict[str, Tensor]) -> BatchStep:
        online, target = self.online, self.target
        grad_clip = self.config.learner.grad_clip
        if isinstance(online, SACModel):
            assert isinstance(target, SACModel)
            c = self.config.section(SACConfig)
            r = sac_update(
                online,
                target,
                self.actor_optimizer,
                self.critic_optimizer,
                self.alpha_optimizer,
                self.log_alpha,
                batch,
                target_entropy=self.target_entropy,
                grad_clip=grad_clip,
                fixed_alpha=c.fixed_alpha,
                step=self.optimizer_step,
            )
            targets_due, td, loss = True, r.td, r.critic_loss
            parts = {"actor_loss": r.actor_loss, "alpha": r.alpha, "entropy": r.entropy}
            figures = {
                **parts,
                "alpha_loss": r.alpha_loss,
                "q_mean": r.q_mean,
                "grad_norm": r.grad_norm,
                "actor_grad_norm": r.actor_grad_norm,
            }
        else:
            assert isinstance(target, DDPGModel)
            d = self.config.section(DDPGConfig)
            targets_due = (self.updates + 1) % d.policy_delay == 0
            r2 = ddpg_update(
                online,
                target,
                self.actor_optimizer,
                self.critic_optimizer,
                batch,
                update_actor=targets_due,
                target_noise=d.target_noise,
                target_noise_clip=d.target_noise_clip,
                grad_clip=grad_clip,
                huber_delta=d.huber_delta,
                step=self.optimizer_step,
            )
            td, loss = r2.td, r2.critic_loss
            parts = {"actor_loss": r2.actor_loss, "q_mean": r2.q_mean}
            figures = {**parts, "grad_norm": r2.grad_norm, "actor_grad_norm": r2.actor_grad_norm}
        self.last_parts = {k: v for k, v in parts.items() if math.isfinite(v)} or self.last_parts
        # loss = critic_loss, so every learner has a learner/loss curve.
        return BatchStep(loss, td, {"loss": loss, "critic_loss": loss, **figures}, targets_due)

    def update_targets(self) -> None:
        tau = (
            self.config.section(SACConfig).tau if self.sac else self.config.section(DDPGConfig).tau
        )
        polyak(self.target_params, self.online_params, tau)

    # --- the rest of the protocol -----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "alpha_optimizer": self.alpha_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.updates = int(state.get("updates", 0))

    def train_info(self) -> dict[str, float]:
        return {
            "lr": float(self.critic_optimizer.param_groups[0]["lr"]),
            "actor_lr": float(self.actor_optimizer.param_groups[0]["lr"]),
        }

    def group_tensors(self) -> list[Tensor]:
        return [*super().group_tensors(), self.log_alpha]

    def heartbeat_info(self) -> dict[str, Any]:
        parts = {k: round(v, 5) for k, v in self.last_parts.items()}
        return {**parts, **super().heartbeat_info()}


# --- actor side ----------------------------------------------------------------------


class ContinuousPolicy(BasePolicy):
    """Acting for Box actions (see the module docstring): warm-up, then DDPG's Gaussian noise
    with an Ape-X spread of scales, or a sample of SAC's squashed-Gaussian policy; every
    action clipped to the bounds. Initial priorities only for a prioritized table."""

    records_next_obs = True
    action_dtype = np.float32

    def __init__(self, setup: ActorSetup) -> None:
        cfg = setup.config
        space = setup.action_space
        if not hasattr(space, "low") or len(space.shape) != 1:
            raise ValueError(f"{cfg.algo} needs a 1-D Box action space, got {space!r}")
        self.model: Any = setup.model
        self.rng = setup.rng
        self.sac = cfg.algo == "sac"
        self.low = np.asarray(space.low, dtype=np.float32)
        self.high = np.asarray(space.high, dtype=np.float32)
        self.act_dim = int(space.shape[0])
        self.action_shape = (self.act_dim,)
        self.half_range = (self.high - self.low) / 2
        self.warmup_steps = (
            cfg.section(SACConfig) if self.sac else cfg.section(DDPGConfig)
        ).warmup_steps
        self.env_steps = 0
        self.prioritized = cfg.replay.table == "prioritized"
        self.n_step, self.gamma = cfg.replay.n_step, cfg.replay.gamma
        # The action-sampling stream (SAC) differs per actor; the weights come from params.
        torch.manual_seed(setup.seed)
        self.sigmas = np.zeros(setup.num_envs, np.float32)
        if not self.sac:
            slots = max(cfg.roles.count("actors"), setup.actor_index + 1) * setup.num_envs
            all_sigmas = apex_epsilons(
                slots, cfg.section(DDPGConfig).noise_sigma, cfg.section(DDPGConfig).noise_alpha
            )
            first = setup.actor_index * setup.num_envs
            self.sigmas = all_sigmas[first : first + setup.num_envs].astype(np.float32)
        setup.log.info(
            "actor %d (%s): %d x %s, action bounds %s..%s, noise sigma %.3g..%.3g, "
            "%d warm-up steps, seed %d",
            setup.actor_index,
            cfg.algo,
            setup.num_envs,
            cfg.env.id,
            self.low.tolist(),
            self.high.tolist(),
            float(self.sigmas.max()),
            float(self.sigmas.min()),
            self.warmup_steps,
            setup.seed,
        )

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
        elif self.sac:
            a = self.model.act(torch.from_numpy(obs), deterministic=False).numpy()
        else:
            mu = self.model.act(torch.from_numpy(obs)).numpy()
            noise = self.rng.standard_normal(mu.shape).astype(np.float32)
            a = mu + noise * self.sigmas[rows, None] * self.half_range
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
        """DDPG: the Gaussian noise scale (fraction of the half-range) of this actor's env
        slots; SAC explores by its own policy's entropy (``learner/entropy``, ``alpha``)."""
        out: dict[str, float] = {}
        if not self.sac and len(self.sigmas):
            out = {
                "noise_sigma_min": float(self.sigmas.min()),
                "noise_sigma_max": float(self.sigmas.max()),
            }
        out["warming_up"] = float(self.env_steps < self.warmup_steps)
        return out

    def heartbeat_info(self) -> dict[str, Any]:
        return {"warming_up": self.env_steps < self.warmup_steps}
