"""``ApexDDPGUpdate``: the learner side of Ape-X DDPG / TD3 on the kernel's
:class:`~zrl.algos.kernel.continuous.ContinuousUpdate` (receiving, targets, checkpoint state,
shared with SAC): per batch one critic step and, every ``ddpg.policy_delay``-th update, an
actor step and the Polyak averaging of the targets (the math is
:func:`zrl.algos.apex_ddpg.losses.ddpg_update`).
"""

from __future__ import annotations

from torch import Tensor

from zrl.algos.apex_ddpg.config import DDPGConfig
from zrl.algos.apex_ddpg.losses import ddpg_update
from zrl.algos.api.learner import LearnerSetup
from zrl.algos.kernel.batch_update import BatchStep
from zrl.algos.kernel.continuous import ContinuousUpdate
from zrl.nets.continuous import DDPGModel


class ApexDDPGUpdate(ContinuousUpdate):
    """A DDPGModel (a second critic with ``ddpg.twin``), its target copy, actor and critic
    Adam."""

    model_type = DDPGModel

    def __init__(self, setup: LearnerSetup) -> None:
        d = setup.config.section(DDPGConfig)
        super().__init__(setup, actor_lr=d.actor_lr, critic_lr=d.critic_lr, tau=d.tau)
        self.join_learners(setup)

    def step(self, batch: dict[str, Tensor]) -> BatchStep:
        online, target = self.online, self.target
        assert isinstance(online, DDPGModel) and isinstance(target, DDPGModel)
        d = self.config.section(DDPGConfig)
        targets_due = (self.updates + 1) % d.policy_delay == 0
        r = ddpg_update(
            online,
            target,
            self.actor_optimizer,
            self.critic_optimizer,
            batch,
            update_actor=targets_due,
            target_noise=d.target_noise,
            target_noise_clip=d.target_noise_clip,
            grad_clip=self.config.learner.grad_clip,
            huber_delta=d.huber_delta,
            step=self.optimizer_step,
        )
        parts = {"actor_loss": r.actor_loss, "q_mean": r.q_mean}
        figures = {**parts, "grad_norm": r.grad_norm, "actor_grad_norm": r.actor_grad_norm}
        return self.step_done(r.critic_loss, r.td, parts, figures, targets_due)
