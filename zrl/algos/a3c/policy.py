"""The A3C worker: samples the categorical policy, then computes its rollout's gradient.

Each rollout becomes a GRADIENTS message for the parameter server: the gradient of the
actor-critic loss (``zrl.algos.kernel.policy_gradient.a2c_loss``, GAE advantages from
``zrl.algos.kernel.returns.rollout_gae``) by parameter name, with ``samples`` (valid steps) and the
loss parts in the meta. The worker then goes on with the newest weights it has.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from zrl.algos.a3c.config import A3CConfig
from zrl.algos.api.actor import ActorSetup, Outgoing, Trajectory
from zrl.algos.kernel.policy_gradient import a2c_loss
from zrl.algos.kernel.returns import rollout_gae
from zrl.algos.kernel.sampling import CategoricalPolicy
from zrl.nets.gaussian import categorical_entropy
from zrl.transport import protocol as P


class A3CPolicy(CategoricalPolicy):
    def __init__(self, setup: ActorSetup) -> None:
        super().__init__(setup)
        self.train_stats = setup.train_stats
        self.last_loss = float("nan")

    def finish(self, trajectory: Trajectory) -> Outgoing:
        """The gradient of the actor-critic loss on this rollout, by parameter name."""
        c = self.config.section(A3CConfig)
        tr = trajectory
        E, T = tr.reward.shape
        logits, values = self.model(torch.from_numpy(tr.obs.reshape(E * T, *tr.obs.shape[2:])))
        with torch.no_grad():
            bootstrap = self.model.value(torch.from_numpy(tr.final_obs)).numpy()
        advantages, returns = rollout_gae(
            tr.reward,
            values.detach().numpy().reshape(E, T),
            tr.terminated,
            tr.truncated,
            tr.valid,
            bootstrap,
            c.gamma,
            c.gae_lambda,
        )
        valid = torch.from_numpy(tr.valid.reshape(-1))
        actions = torch.from_numpy(tr.action.reshape(-1))
        logp = torch.log_softmax(logits, dim=-1).gather(1, actions.unsqueeze(1))[:, 0]
        loss, parts = a2c_loss(
            logp[valid],
            values[valid],
            torch.from_numpy(returns.reshape(-1))[valid],
            torch.from_numpy(advantages.reshape(-1))[valid],
            categorical_entropy(logits[valid]),
            c.entropy_coef,
            c.value_coef,
        )
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
        return Outgoing(P.GRADIENTS, grads, meta={"samples": int(valid.sum()), **parts})

    def heartbeat_info(self) -> dict[str, Any]:
        return {"loss": round(self.last_loss, 5)} if np.isfinite(self.last_loss) else {}
