"""AlphaZero's policy-value loss: cross-entropy of the policy to the search's visit
distribution over the legal moves, plus the squared error of the value to the game's
outcome (the L2 term is the optimizer's weight decay)."""

from __future__ import annotations

import torch
from torch import Tensor


def policy_value_loss(
    logits: Tensor, value: Tensor, target_policy: Tensor, outcome: Tensor, value_coef: float = 1.0
) -> tuple[Tensor, Tensor, Tensor]:
    """``(loss, policy_loss, value_loss)`` of a batch: ``logits [B, A]`` (illegal moves masked
    to a large negative logit, or not: only moves where ``target_policy [B, A]`` is positive
    count), ``value [B]``, ``outcome [B]`` in [-1, 1]. The policy loss is the mean over rows
    of ``-sum_a pi(a) log p(a)``, the value loss the mean of ``(value - outcome)^2``; the loss
    is ``policy_loss + value_coef * value_loss``."""
    logp = torch.log_softmax(logits.float(), dim=1)
    terms = torch.where(target_policy > 0, target_policy * logp, torch.zeros_like(logp))
    policy_loss = -terms.sum(dim=1).mean()
    value_loss = (value.float() - outcome).pow(2).mean()
    return policy_loss + value_coef * value_loss, policy_loss, value_loss
