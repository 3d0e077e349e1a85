"""``SACLearnerUpdate``: the learner side of SAC on the kernel's
:class:`~zrl.algos.kernel.continuous.ContinuousUpdate` (receiving, targets, checkpoint state,
shared with Ape-X DDPG): per batch one critic step, an actor step, the temperature step
(``log_alpha`` and its Adam, in the checkpoint too) and the Polyak averaging of the target
critics (the math is :func:`zrl.algos.sac.losses.sac_update`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from zrl.algos.api.learner import LearnerSetup
from zrl.algos.kernel.batch_update import BatchStep
from zrl.algos.kernel.continuous import ContinuousUpdate
from zrl.algos.kernel.optim import make_adam
from zrl.algos.sac.config import SACConfig
from zrl.algos.sac.losses import default_target_entropy, sac_update
from zrl.nets.continuous import SACModel


class SACLearnerUpdate(ContinuousUpdate):
    """A SACModel, its target critics (no target policy), the actor, critic and temperature
    Adam."""

    model_type = SACModel
    target_policy = False

    def __init__(self, setup: LearnerSetup) -> None:
        c = setup.config.section(SACConfig)
        super().__init__(setup, actor_lr=c.actor_lr, critic_lr=c.critic_lr, tau=c.tau)
        eps = setup.config.learner.adam_eps
        self.log_alpha = nn.Parameter(torch.tensor(math.log(c.init_alpha)))
        self.alpha_optimizer = make_adam([self.log_alpha], c.alpha_lr, eps)
        te = c.target_entropy
        self.target_entropy = default_target_entropy(self.online.act_dim) if te is None else te
        self.join_learners(setup)

    def step(self, batch: dict[str, Tensor]) -> BatchStep:
        online, target = self.online, self.target
        assert isinstance(online, SACModel) and isinstance(target, SACModel)
        r = sac_update(
            online,
            target,
            self.actor_optimizer,
            self.critic_optimizer,
            self.alpha_optimizer,
            self.log_alpha,
            batch,
            target_entropy=self.target_entropy,
            grad_clip=self.config.learner.grad_clip,
            fixed_alpha=self.config.section(SACConfig).fixed_alpha,
            step=self.optimizer_step,
        )
        parts = {"actor_loss": r.actor_loss, "alpha": r.alpha, "entropy": r.entropy}
        figures = {
            **parts,
            "alpha_loss": r.alpha_loss,
            "q_mean": r.q_mean,
            "grad_norm": r.grad_norm,
            "actor_grad_norm": r.actor_grad_norm,
        }
        return self.step_done(r.critic_loss, r.td, parts, figures, True)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "alpha_optimizer": self.alpha_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])

    def group_tensors(self) -> list[Tensor]:
        return [*super().group_tensors(), self.log_alpha]
