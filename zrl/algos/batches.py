"""Sampled transition batches between a learner update's ``receive`` and its ``train``."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from zrl.transport import protocol as P


class SampledBatch(NamedTuple):
    shard: str
    """The replay shard that sampled it: the new priorities of ``keys`` go back there."""
    keys: np.ndarray
    tensors: dict[str, Tensor]
    """Every array but ``key``, as (writable) tensors."""


class PendingBatches:
    """A FIFO of validated BATCH messages of replay transitions."""

    def __init__(self) -> None:
        self._queue: deque[SampledBatch] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, msg: P.Message) -> None:
        """Keep a BATCH whose arrays the caller validated; ProtocolError without a shard id."""
        shard = msg.meta.get("shard")
        if not isinstance(shard, str):
            raise P.ProtocolError("batch without a shard id")
        tensors = {k: torch.from_numpy(np.array(v)) for k, v in msg.arrays.items() if k != "key"}
        self._queue.append(SampledBatch(shard, np.ascontiguousarray(msg.arrays["key"]), tensors))

    def pop(self) -> SampledBatch | None:
        """The oldest batch (taken out: a batch whose update raises is dropped, not retried)."""
        return self._queue.popleft() if self._queue else None
