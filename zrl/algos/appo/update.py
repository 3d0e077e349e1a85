"""``AppoUpdate``: the learner side of APPO, PPO's clipped surrogate on V-trace advantages.

The learner role acks every BATCH from the replay shards' FIFO queues and hands it to
:meth:`AppoUpdate.receive`; receiving, dropping the unrolls more than ``appo.max_lag`` versions
behind the learner (``stale_unrolls``), the policy lag (``policy_lag``, ``policy_lag_max``)
and the checkpoint state are :class:`zrl.algos.kernel.unrolls.UnrollUpdate`'s, shared with IMPALA.

On the fresh unrolls of a batch, as Sample Factory: ``appo.epochs`` passes, each over the
unrolls shuffled and split into ``appo.minibatches`` minibatches of whole unrolls (V-trace
needs whole sequences; fewer when fewer unrolls are fresh). Every minibatch is one optimizer
step: a forward pass (:func:`zrl.algos.kernel.unrolls.unroll_outputs`: a recurrent model unrolls
from each unroll's recorded state), V-trace under the current weights, :func:`appo_loss`,
gradient clipping to ``learner.grad_clip``. A NaN/inf loss raises :class:`NonFiniteLossError`
before that step's optimizer step; the batch is dropped, never retried. On a GPU the check
stays on the device: the step and the batch's later ones are skipped there, and the learner
reads the result's ``finite`` flag one update later
(:class:`zrl.algos.kernel.unrolls.UnrollUpdate`). The loss and its parts stay 0-d tensors
until the metrics report.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from zrl.algos.api.learner import LearnerSetup, UpdateResult
from zrl.algos.appo.config import AppoConfig
from zrl.algos.appo.losses import appo_loss
from zrl.algos.kernel.unrolls import UnrollUpdate, unroll_outputs
from zrl.algos.kernel.value_normalizer import ValueNormalizer
from zrl.algos.kernel.vtrace import unroll_forward


class AppoUpdate(UnrollUpdate):
    """The actor-critic and its Adam; ``appo.epochs x appo.minibatches`` steps per batch."""

    def __init__(self, setup: LearnerSetup) -> None:
        super().__init__(setup, setup.config.section(AppoConfig).max_lag)
        self.rng = torch.Generator().manual_seed(setup.config.seed)  # the minibatch shuffles
        normalize = setup.config.section(AppoConfig).normalize_returns
        self.value_normalizer = ValueNormalizer() if normalize else None

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.value_normalizer is not None:
            state["value_normalizer"] = self.value_normalizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.value_normalizer is not None and "value_normalizer" in state:
            self.value_normalizer.load_state_dict(state["value_normalizer"])

    def train_info(self) -> dict[str, float]:
        info = super().train_info()
        if self.value_normalizer is not None:
            info["return_mean"] = self.value_normalizer.mean
            info["return_std"] = self.value_normalizer.std
        return info

    def old_values(self, batch: dict[str, Tensor]) -> Tensor | None:
        """``V(x_t)`` before this batch's first step, ``[T, B]``: what ``appo.value_clip``
        clips against (None without it)."""
        if self.config.section(AppoConfig).value_clip is None:
            return None
        with torch.no_grad():
            _, values, _ = unroll_outputs(self.model, batch)
        return values.T

    def steps_per_batch(self) -> int:
        c = self.config.section(AppoConfig)
        return c.epochs * c.minibatches

    def train_unrolls(self, batch: dict[str, Tensor]) -> UpdateResult:
        c = self.config.section(AppoConfig)
        n = batch["reward"].shape[0]
        old_values = self.old_values(batch)
        # In a learner group every learner takes epochs x minibatches steps, whatever its
        # batch holds (a minibatch without unrolls adds no gradient to that step's mean).
        groups = c.minibatches if self.group is not None else min(c.minibatches, n)
        steps = 0
        loss = torch.tensor(float("nan"))
        parts: dict[str, Tensor] = {}
        # On a GPU nothing is read back per step (see UnrollUpdate): a NaN/inf step is
        # skipped on the device, and so are the batch's later ones.
        finite = torch.ones((), dtype=torch.bool, device=self.device) if self.defer_checks else None
        for epoch in range(c.epochs):
            order = torch.randperm(n, generator=self.rng)  # the same draws on any device
            if batch["reward"].is_cuda:  # from pinned memory: the host does not wait
                order = order.pin_memory().to(batch["reward"].device, non_blocking=True)
            for rows in order.tensor_split(groups):
                started = time.perf_counter()
                if len(rows) == 0:  # in a group only: fewer unrolls than minibatches
                    steps += self.idle_step()
                    continue
                f = unroll_forward(
                    self.model,
                    {k: v[rows] for k, v in batch.items()},
                    gamma=c.gamma,
                    rho_bar=c.rho_bar,
                    c_bar=c.c_bar,
                    lambda_=c.vtrace_lambda,
                    value_normalizer=self.value_normalizer,
                )
                returns = f.returns
                if self.value_normalizer is not None:
                    if epoch == 0:  # each target once in the statistics, as Sample Factory
                        self.value_normalizer.update(returns.vs, f.valid)
                    returns = replace(returns, vs=self.value_normalizer.normalize(returns.vs))
                loss, parts = appo_loss(
                    f.logits,
                    f.values,
                    f.actions,
                    f.behaviour_logp,
                    returns,
                    clip=c.clip,
                    entropy_coef=c.entropy_coef,
                    value_coef=c.value_coef,
                    value_clip=c.value_clip,
                    valid=f.valid,
                    old_values=None if old_values is None else old_values[:, rows],
                    normalize_advantages=c.normalize_advantages,
                    distribution=f.distribution,
                )
                grad_norm, finite = self.step(loss, f.valid, finite)
                if grad_norm is None:  # in a group: no learner had a valid step in it
                    continue
                self.updates += 1
                steps += 1
                self.train_stats.add(
                    **parts, grad_norm=grad_norm, update_ms=(time.perf_counter() - started) * 1e3
                )
        if parts:
            self.mean_rho = parts["mean_rho"]  # read at the heartbeat
        if finite is None:  # checked already: the CPU path, where reading costs nothing
            return UpdateResult(updates=steps, loss=float(loss.detach()))
        return UpdateResult(updates=steps, loss=loss.detach(), finite=finite)
