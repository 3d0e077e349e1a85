"""``ImpalaUpdate``: the learner side of IMPALA, V-trace actor-critic updates on unrolls.

The generic learner role owns the sockets: it acks every BATCH from the replay shards' FIFO
queues, hands it to :meth:`ImpalaUpdate.receive`, then calls :meth:`ImpalaUpdate.train` with
its current weights version, and publishes the weights of ``model`` every
``learner.publish_interval`` updates. IMPALA sends no priorities.

Receiving, dropping the unrolls more than ``impala.max_lag`` versions behind the learner
(``stale_unrolls``), the policy lag and the checkpoint state are
:class:`zrl.algos.kernel.unrolls.UnrollUpdate`'s; on the fresh unrolls this takes ``impala.epochs``
updates, and the result carries the last loss.

A NaN/inf loss raises :class:`NonFiniteLossError` before the optimizer step (the weights are
intact); the batch is dropped, never retried. On a GPU the check stays on the device: the step
and the batch's later ones are skipped there, and the learner reads the result's ``finite``
flag one update later (:class:`zrl.algos.kernel.unrolls.UnrollUpdate`). The math is
``zrl.algos.impala.losses.impala_update``.
"""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor

from zrl.algos.api.learner import LearnerSetup, UpdateResult
from zrl.algos.impala.config import ImpalaConfig
from zrl.algos.impala.losses import impala_update
from zrl.algos.kernel.unrolls import UnrollUpdate


class ImpalaUpdate(UnrollUpdate):
    """The actor-critic and its Adam; ``impala.epochs`` updates per batch of fresh unrolls."""

    def __init__(self, setup: LearnerSetup) -> None:
        super().__init__(setup, setup.config.section(ImpalaConfig).max_lag)
        self.step_skipped = False  # in a group: the last step was not taken (group_step)

    def steps_per_batch(self) -> int:
        return self.config.section(ImpalaConfig).epochs

    def group_step(self, loss: Tensor, valid: Tensor) -> float:
        """A learner group's step (:meth:`UnrollUpdate.step`): its pre-clip norm (NaN where
        no learner had a valid step: not taken, ``step_skipped`` set)."""
        norm = self.step(loss, valid, None)[0]
        self.step_skipped = norm is None
        return math.nan if norm is None else float(norm)

    def train_unrolls(self, batch: dict[str, Tensor]) -> UpdateResult:
        c = self.config.section(ImpalaConfig)
        loss: float | Tensor = math.nan
        # On a GPU nothing is read back per update (see UnrollUpdate): a NaN/inf step is
        # skipped on the device, and so are the batch's later ones.
        finite = torch.ones((), dtype=torch.bool, device=self.device) if self.defer_checks else None
        steps = 0
        for _ in range(c.epochs):
            started = time.perf_counter()
            result = impala_update(
                self.model,
                self.optimizer,
                batch,
                gamma=c.gamma,
                rho_bar=c.rho_bar,
                c_bar=c.c_bar,
                entropy_coef=c.entropy_coef,
                value_coef=c.value_coef,
                grad_clip=self.config.learner.grad_clip,
                lambda_=c.vtrace_lambda,
                finite=finite,
                step=self.group_step if self.group is not None else None,
            )
            finite = result.finite
            if self.step_skipped:  # in a group: no learner had a valid step in it
                continue
            self.updates += 1
            steps += 1
            loss = result.parts["loss"]
            self.mean_rho = result.mean_rho
            self.train_stats.add(
                **result.parts,
                grad_norm=result.grad_norm,
                mean_rho=result.mean_rho,
                update_ms=(time.perf_counter() - started) * 1e3,
            )
        return UpdateResult(updates=steps, loss=loss, finite=finite)
