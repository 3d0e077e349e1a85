"""Batches on their way to the learner's device, between an update's ``receive`` and ``train``.

``learner.device`` picks the device (:func:`resolve_device`). On a GPU, :func:`to_device`
copies through pinned host memory with ``non_blocking=True`` and :class:`PendingBatches`
does it on a background thread, so the next batch is decoded and moved while the current one
trains. Observations stay as they came (uint8 frames too): the model scales them on the device.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from zrl.transport import protocol as P


class DeviceError(ValueError):
    """A ``learner.device`` this machine does not have; user-facing."""


def resolve_device(name: str) -> torch.device:
    """``auto`` -> ``cuda`` if torch sees a GPU, else ``cpu``; ``cuda[:i]`` must exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"learner.device={name!r}, but torch sees no GPU here (torch "
                f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); use cpu or auto"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(
                f"learner.device={name!r}, but torch sees {torch.cuda.device_count()} GPU(s)"
            )
    return device


def learner_device(name: str, learner_input: str) -> torch.device:
    """The device of a learner fed by ``learner_input`` (``Wiring.learner_input``): learners
    of rollouts (PPO, DD-PPO) train on the CPU in this version, so ``auto`` means cpu there."""
    if learner_input == "batches":
        return resolve_device(name)
    if name not in ("auto", "cpu"):
        raise DeviceError(
            f"learner.device={name!r}: learners of {learner_input} train on the CPU in this "
            "version (only learners fed by replay batches move to a GPU); use cpu or auto"
        )
    return torch.device("cpu")


def wants_channels_last(memory_format: str, device: torch.device) -> bool:
    """Whether a learner on ``device`` lays its CNNs out channels-last for
    ``learner.memory_format`` (``auto``: on the CPU only, where oneDNN's convolutions are
    faster that way; on a GPU in float32 they are not reliably so)."""
    return memory_format == "channels_last" or (memory_format == "auto" and device.type == "cpu")


def to_device(arrays: Mapping[str, np.ndarray], device: torch.device) -> dict[str, Tensor]:
    """Tensors of ``arrays`` on ``device``. On the CPU they wrap the arrays (copied only when
    read-only, as arrays decoded from a message are); on a GPU they are copied through pinned
    memory without blocking the caller."""
    out: dict[str, Tensor] = {}
    for name, arr in arrays.items():
        host = torch.from_numpy(arr if arr.flags.writeable else np.array(arr))
        if device.type == "cpu":
            out[name] = host
        else:
            out[name] = host.pin_memory().to(device, non_blocking=True)
    return out


def policy_lags(item_versions: np.ndarray, learner_version: int) -> np.ndarray:
    """How many weights versions each item's policy is behind the learner's
    (``learner_version - item_version``, as float64 for the training figures), for the items
    whose version is known: those at ``M.UNKNOWN_VERSION`` (negative) are left out."""
    versions = np.asarray(item_versions, dtype=np.int64).reshape(-1)
    return (learner_version - versions[versions >= 0]).astype(np.float64)


class DeviceBatch(NamedTuple):
    shard: str
    """The replay shard that sampled it: the new priorities of ``keys`` go back there."""
    keys: np.ndarray
    tensors: dict[str, Tensor]
    """Every array but ``key`` and ``weights_version``, as (writable) tensors on the
    learner's device."""
    versions: np.ndarray
    """Each item's ``weights_version`` (host memory: only the policy lag reads it); empty
    for a batch without one."""


class PendingBatches:
    """A FIFO of validated BATCH messages of replay transitions, moved to ``device``.

    ``background`` (the default on a GPU): a thread moves each batch as it is added, and
    :meth:`pop` waits for it, so the copy of batch n+1 overlaps the update on batch n."""

    def __init__(self, device: torch.device | str = "cpu", background: bool | None = None) -> None:
        self.device = torch.device(device)
        self._queue: deque[tuple[str, np.ndarray, np.ndarray, Future[dict[str, Tensor]]]] = deque()
        if background is None:
            background = self.device.type != "cpu"
        self._mover = (
            ThreadPoolExecutor(1, thread_name_prefix="batch-mover") if background else None
        )

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, msg: P.Message) -> None:
        """Keep a BATCH whose arrays the caller validated; ProtocolError without a shard id."""
        shard = msg.meta.get("shard")
        if not isinstance(shard, str):
            raise P.ProtocolError("batch without a shard id")
        arrays = {k: v for k, v in msg.arrays.items() if k not in ("key", "weights_version")}
        versions = msg.arrays.get("weights_version", np.zeros(0, np.int64))
        if self._mover is not None:
            moved = self._mover.submit(to_device, arrays, self.device)
        else:
            moved = Future()
            moved.set_result(to_device(arrays, self.device))
        self._queue.append((shard, np.ascontiguousarray(msg.arrays["key"]), versions, moved))

    def pop(self) -> DeviceBatch | None:
        """The oldest batch (taken out: a batch whose update raises is dropped, not retried)."""
        if not self._queue:
            return None
        shard, keys, versions, moved = self._queue.popleft()
        return DeviceBatch(shard, keys, moved.result(), versions)

    def close(self) -> None:
        if self._mover is not None:
            self._mover.shutdown(wait=False, cancel_futures=True)
