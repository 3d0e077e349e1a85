"""``ContinuousLearner``: Ape-X DDPG / TD3 or SAC updates on batches from the replay shards.

Sockets (those of the Ape-X DQN ``Learner``):

- PULL ``batches`` <- replay shards: BATCH messages of n-step transitions with
  ``action`` float32 ``[B, act_dim]``.
- PUB ``priorities/<shard>/``: the new priorities ``|y - Q1(s, a)|`` of the sampled keys,
  back to the shard that sampled them (``replay.table: prioritized`` only; a uniform table
  has no use for them).
- DEALER -> the parameter server: WEIGHTS (policy and critics, the actors use both) every
  ``learner.publish_interval`` updates.

Per batch: one critic step, then (DDPG: every ``ddpg.policy_delay``-th update; SAC: always)
an actor step, SAC's temperature step, and Polyak averaging of the targets with rate ``tau``
(TD3 only on the delayed steps). The math is ``zrl.algos.ddpg.ddpg_update`` and
``zrl.algos.sac.sac_update``; this class only moves data.

A batch with NaN/inf values or actions outside the bounds is dropped (the replay validates
what it stores, so this is a peer's bug). A NaN/inf loss or gradient raises before the
optimizer step that would apply it (``on_non_finite``): the batch is dropped, and ten in a
row stop the learner cleanly (it is diverging), reporting the learner's id and update
number and keeping the last good checkpoint and published weights.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from zrl.algos.ddpg import ddpg_update
from zrl.algos.dqn import NonFiniteLossError
from zrl.algos.sac import default_target_entropy, sac_update
from zrl.continuous_models import DDPGModel, SACModel
from zrl.roles.learner import Learner, check_transition_batch, make_adam
from zrl.transport import protocol as P

CONTINUOUS_BATCH_ARRAYS: dict[str, tuple[str | None, int | None]] = {
    "obs": ("float32", 2),
    "action": ("float32", 2),
    "reward": ("float32", 1),
    "discount": ("float32", 1),
    "next_obs": ("float32", 2),
    "weight": ("float32", 1),
    "key": ("int64", 1),
}


def critic_parameters(model: DDPGModel | SACModel) -> list[nn.Parameter]:
    return [p for q in (model.q1, model.q2) if q is not None for p in q.parameters()]


@torch.no_grad()
def polyak(target: list[Tensor], online: list[Tensor], tau: float) -> None:
    """``target <- target + tau * (online - target)`` for matching parameter lists, in one
    fused call (this runs after every update; building state dicts each time would not)."""
    torch._foreach_lerp_(target, online, tau)


class ContinuousLearner(Learner):
    role = "learner"

    def setup_updates(self) -> None:
        cfg = self.config
        model = self.online
        if not isinstance(model, DDPGModel | SACModel):
            raise ValueError(f"{cfg.algo} needs zrl's DDPGModel/SACModel, got {type(model)}")
        self.sac = isinstance(model, SACModel)
        algo_cfg = cfg.sac if self.sac else cfg.ddpg
        self.target = copy.deepcopy(model)
        self.target.requires_grad_(False)
        self.actor_optimizer = make_adam(model.policy.parameters(), algo_cfg.actor_lr)
        self.critic_optimizer = make_adam(critic_parameters(model), algo_cfg.critic_lr)
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
        self.log_alpha = nn.Parameter(torch.tensor(math.log(cfg.sac.init_alpha)))
        self.alpha_optimizer = make_adam([self.log_alpha], cfg.sac.alpha_lr)
        te = cfg.sac.target_entropy
        self.target_entropy = default_target_entropy(model.act_dim) if te is None else te
        self.open_batches()
        self.priority_pub = self.open_publisher("priorities")
        self.send_priorities = cfg.replay.table == "prioritized"
        self.last_parts: dict[str, float] = {}

    # --- checkpoints ------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "alpha_optimizer": self.alpha_optimizer.state_dict(),
        }

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])

    # --- updates ----------------------------------------------------------------------

    def check_batch(self, msg: P.Message) -> str:
        """Validate a BATCH against the model; its shard id. Raises ProtocolError."""
        shard = check_transition_batch(msg, CONTINUOUS_BATCH_ARRAYS)
        a = msg.arrays
        model = self.online
        if a["obs"].shape[1] != model.obs_dim or a["next_obs"].shape[1] != model.obs_dim:
            raise P.ProtocolError(f"batch observations are not {model.obs_dim} wide")
        if a["action"].shape[1] != model.act_dim:
            raise P.ProtocolError(f"batch actions are not {model.act_dim} wide")
        for name in ("obs", "action", "reward", "discount", "next_obs", "weight"):
            if not np.all(np.isfinite(a[name])):
                raise P.ProtocolError(
                    f"{self.id} at update {self.updates + 1}: batch array {name!r} from "
                    f"{shard} is not finite"
                )
        low = model.policy.action_low.numpy()
        high = model.policy.action_high.numpy()
        if len(a["key"]) and (np.any(a["action"] < low) or np.any(a["action"] > high)):
            raise P.ProtocolError(f"batch actions outside the bounds {low}..{high}")
        return shard

    def on_batch(self, msg: P.Message) -> None:
        shard = self.check_batch(msg)
        batch = {k: torch.from_numpy(np.array(v)) for k, v in msg.arrays.items() if k != "key"}
        grad_clip = self.config.learner.grad_clip
        started = time.perf_counter()
        try:
            if self.sac:
                c = self.config.sac
                r = sac_update(
                    self.online, self.target, self.actor_optimizer, self.critic_optimizer,
                    self.alpha_optimizer, self.log_alpha, batch,
                    target_entropy=self.target_entropy, grad_clip=grad_clip,
                    fixed_alpha=c.fixed_alpha,
                )  # fmt: skip
                update_targets, td, loss = True, r.td, r.critic_loss
                parts = {"actor_loss": r.actor_loss, "alpha": r.alpha, "entropy": r.entropy}
                figures = {
                    **parts, "alpha_loss": r.alpha_loss, "q_mean": r.q_mean,
                    "grad_norm": r.grad_norm, "actor_grad_norm": r.actor_grad_norm,
                }  # fmt: skip
            else:
                d = self.config.ddpg
                update_targets = (self.updates + 1) % d.policy_delay == 0
                r2 = ddpg_update(
                    self.online, self.target, self.actor_optimizer, self.critic_optimizer, batch,
                    update_actor=update_targets, target_noise=d.target_noise,
                    target_noise_clip=d.target_noise_clip, grad_clip=grad_clip,
                    huber_delta=d.huber_delta,
                )  # fmt: skip
                td, loss = r2.td, r2.critic_loss
                parts = {"actor_loss": r2.actor_loss, "q_mean": r2.q_mean}
                figures = {
                    **parts, "grad_norm": r2.grad_norm, "actor_grad_norm": r2.actor_grad_norm
                }  # fmt: skip
        except NonFiniteLossError as exc:
            self.on_non_finite(exc, f"a batch from {shard}")
        self.non_finite_in_a_row = 0
        self.updates += 1
        self.last_loss = loss
        self.last_parts = {k: v for k, v in parts.items() if math.isfinite(v)} or self.last_parts
        # loss = critic_loss, so every learner has a learner/loss curve.
        self.train_stats.add(
            loss=loss, critic_loss=loss, update_ms=(time.perf_counter() - started) * 1e3,
            **figures,
        )  # fmt: skip
        self.train_stats.add_array("td_error", td)
        if update_targets:
            tau = self.config.sac.tau if self.sac else self.config.ddpg.tau
            polyak(self.target_params, self.online_params, tau)
        if self.send_priorities:
            self.priority_pub.send(
                P.Message(
                    P.PRIORITIES,
                    arrays={"key": np.ascontiguousarray(msg.arrays["key"]), "priority": td},
                ),
                topic=P.priority_topic(shard),
                block=False,
            )
        if self.updates % self.config.learner.publish_interval == 0:
            self.send_weights()

    def train_info(self) -> dict[str, float]:
        return {
            "lr": float(self.critic_optimizer.param_groups[0]["lr"]),
            "actor_lr": float(self.actor_optimizer.param_groups[0]["lr"]),
        }

    def heartbeat_info(self) -> dict[str, Any]:
        info = super().heartbeat_info()
        info.update({k: round(v, 5) for k, v in self.last_parts.items()})
        return info
