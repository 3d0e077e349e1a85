"""The math of QMIX (Rashid et al. 2018, "QMIX: Monotonic Value Function Factorisation for
Deep Multi-Agent Reinforcement Learning"), as pure functions over tensors.

Each of the ``L`` agents has ``Q_a(o_a, u_a)`` from a network shared by all agents; the
mixing network combines the chosen ``Q_a`` into ``Q_tot(s, u)`` with weights that
hypernetworks compute from the global state ``s``, made non-negative by an absolute value, so
``dQ_tot / dQ_a >= 0``: each agent's greedy action is the team's (the paper's eq. 5)::

    hidden = elu(q @ |W1(s)| + b1(s))          q [L], W1 [L, E], b1 [E]
    Q_tot  = hidden @ |W2(s)| + V(s)           W2 [E], V a scalar

The TD target of a team transition (an n-step return ``R`` and its discount ``gamma^n``, 0 at
the episode's end) uses the target agent network and the target mixer::

    y = R + discount * Q_tot^-(s', argmax-or-max_u' Q_a^-(o'_a, u'))

(double Q: ``u'_a = argmax_u Q_a(o'_a, u)`` by the online agent network, valued by the target
one; else each ``max_u Q_a^-``), over the agent's legal actions where the env masks them.
The loss is the paper's squared TD error ``mean_b w_b (y_b - Q_tot(s_b, u_b))^2`` (``w``: the
replay's importance weights, ones for a uniform table).

A team transition carries the agents' actions as one joint index (``joint_actions``):
``sum_a u_a * A^a``, agent 0 the least significant digit.

With a recurrent agent network (``model.core``) the learner trains on team sequences of ``T``
steps (``T + 1`` observations), as R2D2 does (:func:`qmix_sequence_update`): every agent's
network is unrolled from the state it had at the sequence's start, the first ``burn_in`` steps
without gradient (``zrl.algos.kernel.q_learning.burn_in_unroll``); ``Q_tot`` is mixed per step; the
targets are the n-step returns over the sequence's real steps (``mask``), cut without a
bootstrap at a terminal step, else bootstrapping ``Q_tot^-`` of the observation after the walk
(``zrl.algos.kernel.q_learning.nstep_double_q_targets``, with ``Q_tot^-`` as the bootstrap value and
no value rescaling); the loss is pymarl's masked mean of the squared TD errors over the trained
steps (:func:`qmix_sequence_loss`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from zrl.algos.kernel.optim import StepFn, checked_step
from zrl.algos.kernel.q_learning import burn_in_unroll, nstep_double_q_targets

if TYPE_CHECKING:
    from zrl.algos.qmix.model import QMIXModel, RecurrentQMIXModel

ILLEGAL_Q = -1e8
"""The Q-value an illegal action gets: below every learned value, finite (0 * it is 0)."""

BATCH_KEYS = ("obs", "action", "reward", "discount", "next_obs", "weight")
SEQUENCE_BATCH_KEYS = ("obs", "action", "reward", "terminated", "mask", "first", "state", "weight")


def mix(q: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """The monotonic mixing of the agents' chosen Q-values ``q [B, L]`` into ``Q_tot [B]``,
    given the hypernetworks' outputs for each state: ``w1 [B, L, E]``, ``b1 [B, E]``,
    ``w2 [B, E]``, ``b2 [B]`` (the weights' absolute values are taken here)."""
    hidden = F.elu(torch.bmm(q.unsqueeze(1), w1.abs()).squeeze(1) + b1)
    return (hidden * w2.abs()).sum(dim=1) + b2


def joint_actions(actions: np.ndarray, num_actions: int) -> np.ndarray:
    """The agents' actions ``[..., L]`` (int, in ``[0, num_actions)``) as one joint index
    ``sum_a u_a * num_actions^a``, int64 ``[...]``."""
    actions = np.asarray(actions, np.int64)
    if actions.size and (actions.min() < 0 or actions.max() >= num_actions):
        raise ValueError(f"agent actions outside [0, {num_actions})")
    digits = np.asarray(num_actions, np.int64) ** np.arange(actions.shape[-1], dtype=np.int64)
    return (actions * digits).sum(axis=-1)  # type: ignore[no-any-return]


def agent_actions(joint: Tensor, agents: int, num_actions: int) -> Tensor:
    """Inverse of :func:`joint_actions`: joint indices ``[B]`` -> each agent's action
    ``[B, L]`` (int64)."""
    digits = num_actions ** torch.arange(agents, device=joint.device, dtype=torch.int64)
    return (joint.long().unsqueeze(1) // digits) % num_actions


def linear_epsilon(env_steps: int, start: float, end: float, steps: int) -> float:
    """The exploration rate after ``env_steps`` env steps: ``start`` decaying linearly to
    ``end`` over ``steps`` steps, then ``end``."""
    frac = min(max(env_steps, 0) / steps, 1.0)
    return start + (end - start) * frac


def chosen(q: Tensor, actions: Tensor) -> Tensor:
    """``q [B, L, A]`` at each agent's action ``actions [B, L]`` -> ``[B, L]``."""
    return q.gather(2, actions.long().unsqueeze(2)).squeeze(2)


def next_agent_values(next_q_target: Tensor, next_q_online: Tensor | None = None) -> Tensor:
    """Each agent's bootstrap value ``[B, L]`` from the target network's ``[B, L, A]``: at the
    online network's argmax (double Q, ``next_q_online`` given) or its own max. Illegal
    actions must already carry :data:`ILLEGAL_Q` in both."""
    if next_q_online is None:
        return next_q_target.max(dim=2).values
    return chosen(next_q_target, next_q_online.argmax(dim=2))


def qmix_targets(returns: Tensor, discounts: Tensor, next_q_tot: Tensor) -> Tensor:
    """``y = R + discount * Q_tot^-(s', u')``; all ``[B]``."""
    return returns + discounts * next_q_tot


def qmix_loss(q_tot: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """``mean_b w_b (y_b - Q_tot_b)^2`` and the detached TD errors ``y - Q_tot`` ``[B]``.
    ``targets`` must not require grad (compute them under ``torch.no_grad()``): a ValueError
    otherwise, rather than training towards a moving target."""
    if targets.requires_grad:
        raise ValueError("qmix_loss: targets require grad; compute them under torch.no_grad()")
    td = targets - q_tot
    return (weights * td.square()).mean(), td.detach()


@dataclass
class QMIXStep:
    """What one :func:`qmix_update` did."""

    loss: float
    td: np.ndarray
    """float32 ``[B]`` ``|y - Q_tot|``."""
    grad_norm: float
    q_tot_mean: float


def qmix_update(
    online: QMIXModel,
    target: QMIXModel,
    optimizer: torch.optim.Optimizer,
    batch: Mapping[str, Tensor],
    *,
    double: bool,
    grad_clip: float,
    step: StepFn = checked_step,
) -> QMIXStep:
    """One gradient step of QMIX on a batch of team transitions: ``obs``/``next_obs``
    ``[B, L * slot]`` (the agents' slot observations side by side, each carrying the state),
    ``action [B]`` (joint indices), ``reward [B]`` (the n-step team return), ``discount [B]``,
    ``weight [B]``. The agent network and the mixer learn together; gradients are clipped to
    global L2 norm ``grad_clip``; ``step`` takes the optimizer step (a learner group's
    averages the gradients first). NonFiniteLossError before a non-finite step."""
    missing = [k for k in BATCH_KEYS if k not in batch]
    if missing:
        raise ValueError(f"qmix_update: batch is missing keys {missing}")
    L, A = online.agents, online.num_actions
    q, state = online.team_q(batch["obs"])
    actions = agent_actions(batch["action"], L, A)
    q_tot = online.mixer(chosen(q, actions), state)
    with torch.no_grad():
        next_q_target, next_state = target.team_q(batch["next_obs"])
        next_q_online = online.team_q(batch["next_obs"])[0] if double else None
        next_values = next_agent_values(next_q_target, next_q_online)
        y = qmix_targets(batch["reward"], batch["discount"], target.mixer(next_values, next_state))
    loss, td = qmix_loss(q_tot, y, batch["weight"])
    grad_norm = step(optimizer, loss, list(online.parameters()), grad_clip)
    return QMIXStep(
        loss=float(loss.item()),
        td=td.abs().cpu().numpy().astype(np.float32),
        grad_norm=grad_norm,
        q_tot_mean=float(q_tot.detach().mean().item()),
    )


def mix_steps(mixer: torch.nn.Module, q: Tensor, states: Tensor) -> Tensor:
    """``Q_tot [B, T]`` of the agents' chosen Q-values ``q [B, T, L]`` in the global states
    ``states [B, T, state]``: the mixer at every step."""
    B, T, L = q.shape
    return mixer(q.reshape(B * T, L), states.reshape(B * T, -1)).view(B, T)  # type: ignore[no-any-return]


def qmix_sequence_loss(
    q_tot: Tensor, targets: Tensor, train_mask: Tensor, weights: Tensor
) -> tuple[Tensor, Tensor]:
    """``sum_bt w_b m_bt (y_bt - Q_tot_bt)^2 / max(1, sum_bt m_bt)`` (pymarl's masked mean
    over the batch's trained steps, each weighted by its sequence's importance weight) and
    the detached ``|y - Q_tot|`` ``[B, T]``, 0 where ``train_mask`` is False. Shapes:
    ``q_tot``/``targets``/``train_mask`` ``[B, T]``, ``weights [B]``; ``targets`` must not
    require grad."""
    if targets.requires_grad:
        raise ValueError("qmix_sequence_loss: targets require grad; compute them under no_grad")
    if q_tot.shape != targets.shape or q_tot.shape != train_mask.shape:
        raise ValueError(
            f"q_tot {tuple(q_tot.shape)}, targets {tuple(targets.shape)} and train_mask "
            f"{tuple(train_mask.shape)} must have one shape [B, T]"
        )
    mask = train_mask.bool()
    td = torch.where(mask, targets - q_tot, 0.0)  # padding never reaches the loss
    count = mask.sum().clamp(min=1).to(td.dtype)
    loss = (weights.to(td.dtype).unsqueeze(1) * td.square()).sum() / count
    return loss, td.detach().abs()


def qmix_sequence_update(
    online: RecurrentQMIXModel,
    target: RecurrentQMIXModel,
    optimizer: torch.optim.Optimizer,
    batch: Mapping[str, Tensor],
    *,
    burn_in: int,
    gamma: float,
    n_step: int,
    double: bool,
    grad_clip: float,
    step: StepFn = checked_step,
) -> QMIXStep:
    """One gradient step of recurrent QMIX on a batch of ``B`` team sequences of ``T`` steps:
    ``obs [B, T + 1, L * slot]``, ``first [B, T + 1]``, ``state [B, L * S]`` (the agents'
    states before position 0), ``action [B, T]`` (joint indices), ``reward``/``terminated``/
    ``mask [B, T]``, ``weight [B]``. The loss covers the steps after ``burn_in``; ``td`` of
    the result is each sequence's mean ``|y - Q_tot|`` over them; ``step`` as
    :func:`qmix_update`'s. NonFiniteLossError before a non-finite step."""
    missing = [k for k in SEQUENCE_BATCH_KEYS if k not in batch]
    if missing:
        raise ValueError(f"qmix_sequence_update: batch is missing keys {missing}")
    L, A = online.agents, online.num_actions
    obs, first, state = batch["obs"], batch["first"].bool(), batch["state"]
    B, T = batch["action"].shape
    q_burn, q_train = burn_in_unroll(online.team_unroll, obs, state, first, burn_in)
    actions = agent_actions(batch["action"].reshape(-1), L, A).view(B, T, L)[:, burn_in:]
    taken = q_train[:, : T - burn_in].gather(3, actions.unsqueeze(3)).squeeze(3)
    states = online.team_states(obs)
    q_tot = mix_steps(online.mixer, taken, states[:, burn_in:T])
    with torch.no_grad():
        q_target = target.team_unroll(obs, state, first)[0]
        P = q_target.shape[1]
        q_online = torch.cat((q_burn, q_train.detach()), dim=1) if double else None
        values = next_agent_values(
            q_target.reshape(B * P, L, A),
            None if q_online is None else q_online.reshape(B * P, L, A),
        )
        boot = mix_steps(target.mixer, values.view(B, P, L), target.team_states(obs))
        y = nstep_double_q_targets(
            batch["reward"], batch["terminated"], batch["mask"], boot, gamma, n_step
        )[:, burn_in:]
    train_mask = batch["mask"].bool()[:, burn_in:]
    loss, td = qmix_sequence_loss(q_tot, y, train_mask, batch["weight"])
    grad_norm = step(optimizer, loss, list(online.parameters()), grad_clip)
    steps = train_mask.sum(dim=1).clamp(min=1)
    real = q_tot.detach()[train_mask]
    return QMIXStep(
        loss=float(loss.item()),
        td=(td.sum(dim=1) / steps).cpu().numpy().astype(np.float32),
        grad_norm=grad_norm,
        q_tot_mean=float(real.mean().item()) if real.numel() else 0.0,
    )
