"""The learner side of an algorithm: what the generic learner gives its update
(:class:`LearnerSetup`, :class:`LearnerServices`, each message) and what the update gives
back (:class:`UpdateResult`); for an algorithm whose actors send gradients, the same between
the parameter server and its :class:`GradientServer`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from zrl.algos.api.train_stats import TrainStats
    from zrl.config.experiment import ExperimentConfig
    from zrl.transport.protocol import Message
    from zrl.transport.sockets import Channel


class LearnerServices(Protocol):
    """What the learner role lends an update that talks to its peers (DD-PPO)."""

    id: str
    stop_event: threading.Event

    def open_publisher(self, name: str = "topics", *, hwm: int = 1000) -> Channel: ...

    def open_subscriber(self, topics: list[str], name: str, *, hwm: int = 1000) -> Channel: ...

    def tick(self) -> None:
        """Heartbeats and registry replies: call it during long work (every ~100 ms)."""

    def follow_weights(self, model: nn.Module) -> Any:
        """A ``WeightsFollower`` of the published weights for ``model``."""

    advertise: str
    """The address other hosts reach this learner's host at (``--advertise``, or the
    interface that routes to the broker)."""

    def role_info(self, role_id: str) -> dict[str, Any] | None:
        """The heartbeat info of the live role ``role_id`` (a STATUS to the broker), None
        while it is not registered or not alive."""

    def take_input(self) -> bool:
        """Take in one message of the learner's input that has arrived, without waiting: a
        replay BATCH acked and handed to the update's ``receive`` (IMPALA's and APPO's
        learner groups, while a collective waits). False when none had arrived."""


@dataclass
class LearnerSetup:
    """What the learner gives its update: the experiment, its model and its place."""

    config: ExperimentConfig
    model: nn.Module
    observation_space: Any
    action_space: Any
    index: int
    log: logging.Logger
    train_stats: TrainStats
    services: LearnerServices
    device: torch.device | str = "cpu"
    """Where ``model`` lives (``learner.device``): batches go there
    (``zrl.algos.kernel.batches``)."""


@dataclass
class Priorities:
    """New priorities of sampled keys, for the shard that sampled them."""

    shard: str
    keys: np.ndarray
    priorities: np.ndarray


@dataclass
class UpdateResult:
    """What one call of ``LearnerUpdate.train`` did."""

    updates: int
    """Optimizer steps taken."""
    loss: float | torch.Tensor
    """The last step's loss: a 0-d tensor where reading it would wait for the device (the
    learner reads it for its heartbeat)."""
    priorities: Priorities | None = None
    samples: int = 0
    """Distinct env steps (transitions) trained on, each counted once however many epochs
    used it: what ``samples_trained`` in progress.csv adds up."""
    publish: bool = False
    """Publish the weights now, whatever ``learner.publish_interval`` says (end of a round)."""
    finite: torch.Tensor | None = None
    """Checked on the device (``zrl.algos.kernel.optim.deferred_step``): a 0-d bool tensor, False
    when a step of this batch met a NaN/inf loss or gradient and the device skipped it and
    the batch's later steps. The learner reads it one update later, while the next update
    runs, and drops the batch then as a :class:`NonFiniteLossError` would have. None: checked
    at once (the error raised)."""


class BaseUpdate:
    """Defaults of the optional :class:`LearnerUpdate` methods, for updates to inherit."""

    def may_publish(self) -> bool:
        return True

    def weights_meta(self) -> dict[str, int]:
        return {}

    def train_info(self) -> dict[str, float]:
        return {}

    def heartbeat_info(self) -> dict[str, Any]:
        return {}

    def summary(self) -> str:
        return ""

    def close(self) -> None:
        """Nothing to release."""


class NonFiniteLossError(FloatingPointError):
    """A NaN/inf loss or gradient norm, raised before the optimizer step that would apply it."""

    def __init__(self, loss: float, grad_norm: float, source: str = "") -> None:
        super().__init__(f"non-finite loss {loss} (gradient norm {grad_norm})")
        self.loss = loss
        self.grad_norm = grad_norm
        self.source = source


class LearnerUpdate(Protocol):
    """The learner-side half of an algorithm. The learner owns receiving, acks, checkpoints,
    publishing the weights and non-finite handling; the update only trains."""

    model: nn.Module
    """The network whose weights are published."""

    def receive(self, msg: Message, version: int) -> None:
        """Validate one message of the learner's input and keep it (ProtocolError: dropped).
        ``version`` is the learner's current weights version."""

    def train(self, version: int) -> UpdateResult | None:
        """Train on what was received, if it is enough; None otherwise. Raises
        NonFiniteLossError before applying a non-finite step."""

    def may_publish(self) -> bool:
        """Whether this learner publishes weights (DD-PPO: only learner 0, once all learners
        hear each other)."""

    def weights_meta(self) -> dict[str, int]:
        """Extra integers published with the weights (the algorithm's progress)."""

    def state_dict(self) -> dict[str, Any]:
        """The algorithm's state in a checkpoint (networks, optimizers, counters)."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def train_info(self) -> dict[str, float]:
        """Figures for the training metrics that are not per update (learning rates)."""

    def heartbeat_info(self) -> dict[str, Any]:
        """Extra heartbeat fields."""

    def summary(self) -> str:
        """One line for the log when the learner stops ("" for none)."""

    def close(self) -> None:
        """Release what the update holds beyond the learner's sockets (DD-PPO's process
        group); called once when the learner stops."""


# --- parameter server side ---------------------------------------------------------------


@dataclass
class GradientServerSetup:
    """What the parameter server gives its gradient server: the experiment and its model."""

    config: ExperimentConfig
    model: nn.Module
    """Built by the parameter server (seeded with ``config.seed``, as the actors' copies)."""
    observation_space: Any
    action_space: Any
    log: logging.Logger
    train_stats: TrainStats


class GradientServer(Protocol):
    """The parameter-server half of an algorithm whose actors send gradients (A3C). The
    parameter server owns the ``gradients`` stream, drop counting, the checkpoint file and
    storing and publishing every weights version; the gradient server owns the model's
    optimizer, the combining of gradients and its counters."""

    model: nn.Module
    """The network whose weights the parameter server publishes after each update."""
    updates: int
    """Optimizer steps taken (published with the weights, restored from the checkpoint)."""

    def receive(self, msg: Message, version: int) -> bool:
        """Validate one message of the ``gradients`` stream (ProtocolError: dropped) and keep
        or apply it; True when it completed an update, so ``model`` holds a new weights
        version. ``version`` is the server's current weights version."""

    def state_dict(self) -> dict[str, Any]:
        """Its state in the parameter server's checkpoint (model, optimizer, counters), which
        adds the key ``version``."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def train_info(self) -> dict[str, float]:
        """Figures for the training metrics that are not per update (learning rates)."""

    def heartbeat_info(self) -> dict[str, Any]:
        """Extra heartbeat fields."""

    def summary(self) -> str:
        """One line for the log when the parameter server stops ("" for none)."""
