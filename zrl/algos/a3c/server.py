"""The A3C gradient server: applies the workers' gradients to the model on the parameter server.

The parameter server (``zrl.roles.params``) reads the ``gradients`` stream, counts dropped
messages, writes the checkpoint file and stores and publishes every new weights version; it
builds one :class:`A3CGradientServer` (a ``zrl.algos.api.GradientServer``) and hands it each
GRADIENTS message with its current weights version. This class owns the rest:

- validation: an integer ``weights_version``, the model's parameter names, shapes and float32
  dtype, finite values (a ``ProtocolError`` otherwise: the server drops and counts it);
- the lag rules: a gradient more than ``a3c.max_lag`` versions old is dropped and counted
  (``stale_gradients``), one on a version newer than the server's (it restarted without a
  checkpoint) too (``future_gradients``, with a warning);
- the step: ``a3c.gradients_per_update`` gradients combined (``a3c.reduce``: sum or mean),
  clipped to ``a3c.grad_clip``, one Adam step (``a3c.lr``);
- its state in the server's checkpoint (model, optimizer, counters) and its figures.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from zrl.algos.a3c.config import A3CConfig
from zrl.algos.api.learner import GradientServerSetup
from zrl.algos.kernel.optim import make_adam
from zrl.algos.kernel.policy_gradient import reduce_gradients
from zrl.transport import protocol as P

COUNTERS = ("updates", "applied_gradients", "stale_gradients", "future_gradients")
"""The server's counters, as its heartbeat reports them (``heartbeat_info``)."""


class A3CGradientServer:
    def __init__(self, setup: GradientServerSetup) -> None:
        self.config = setup.config.section(A3CConfig)
        self.log = setup.log
        self.train_stats = setup.train_stats
        self.model = setup.model
        self.optimizer = make_adam(
            self.model.parameters(), self.config.lr, setup.config.learner.adam_eps
        )
        self.grad_shapes = {name: tuple(p.shape) for name, p in self.model.named_parameters()}
        self.accumulated: list[dict[str, np.ndarray]] = []
        self.applied_gradients = 0
        self.stale_gradients = 0
        self.future_gradients = 0
        self.updates = 0

    def receive(self, msg: P.Message, version: int) -> bool:
        """Validate one GRADIENTS message computed on weights ``msg.meta["weights_version"]``
        and keep it; True when it completed an update (the model holds new weights)."""
        if msg.kind != P.GRADIENTS:
            raise P.ProtocolError(f"gradients stream carries {msg.kind!r}")
        computed_on = msg.meta.get("weights_version")
        if not isinstance(computed_on, int) or isinstance(computed_on, bool):
            raise P.ProtocolError("gradients without an integer weights_version")
        if set(msg.arrays) != set(self.grad_shapes) or any(
            msg.arrays[k].shape != self.grad_shapes[k] or msg.arrays[k].dtype != np.float32
            for k in self.grad_shapes
        ):
            raise P.ProtocolError("gradients whose names, shapes or dtypes do not fit the model")
        if not all(np.all(np.isfinite(g)) for g in msg.arrays.values()):
            raise P.ProtocolError("gradients with NaN or inf values")
        if version - computed_on > self.config.max_lag:
            self.stale_gradients += 1
            return False
        if computed_on > version:
            # Computed on weights this server never published (it restarted without a
            # checkpoint): applying it to other weights would be silently wrong.
            self.future_gradients += 1
            if self.future_gradients == 1 or self.future_gradients % 100 == 0:
                self.log.warning(
                    "gradient on weights v%d, but this server is at v%d (restarted without a "
                    "checkpoint?): dropped (%d so far)",
                    computed_on,
                    version,
                    self.future_gradients,
                )
            return False
        self.accumulated.append(msg.arrays)
        self.train_stats.add_with_max(policy_lag=version - computed_on)
        if len(self.accumulated) < self.config.gradients_per_update:
            return False
        self.apply_gradients()
        return True

    def apply_gradients(self) -> None:
        """Combine the accumulated gradients, clip them and take one Adam step."""
        started = time.perf_counter()
        combined = reduce_gradients(
            [{k: torch.from_numpy(np.array(v)) for k, v in g.items()} for g in self.accumulated],
            self.config.reduce,
        )
        self.applied_gradients += len(self.accumulated)
        self.accumulated = []
        for name, p in self.model.named_parameters():
            p.grad = combined[name]
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.updates += 1
        self.train_stats.add(grad_norm=grad_norm, update_ms=(time.perf_counter() - started) * 1e3)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "applied_gradients": self.applied_gradients,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self.applied_gradients = int(state["applied_gradients"])

    def train_info(self) -> dict[str, float]:
        return {"lr": float(self.optimizer.param_groups[0]["lr"])}

    def heartbeat_info(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in COUNTERS}

    def summary(self) -> str:
        return (
            f"{self.updates} updates from {self.applied_gradients} gradients, "
            f"{self.stale_gradients} stale gradients dropped (max_lag {self.config.max_lag})"
        )
