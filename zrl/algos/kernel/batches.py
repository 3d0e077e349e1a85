"""Batches on their way to the learner's device, between an update's ``receive`` and ``train``.

``learner.device`` picks the device (:func:`resolve_device`). On a GPU, :class:`HostStaging`
copies each decoded array once into a reused page-locked buffer and from there to the device
on a copy stream of its own, which the update waits on through an event; :class:`PendingBatches`
stages on a background thread, so the next batch is copied while the current one trains. On
the CPU, :func:`to_device` wraps the arrays as they are. Observations stay as they came (uint8
frames too): the model scales them on the device (``zrl.nets.encoders.scale_obs``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from zrl.transport import protocol as P


class DeviceError(ValueError):
    """A ``learner.device`` this machine does not have; user-facing."""


def resolve_device(name: str, key: str = "learner.device") -> torch.device:
    """``auto`` -> ``cuda`` if torch sees a GPU, else ``cpu``; ``cuda[:i]`` must exist (the
    error names the config ``key`` that asked for it)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"{key}={name!r}, but torch sees no GPU here (torch "
                f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); use cpu or auto"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"{key}={name!r}, but torch sees {torch.cuda.device_count()} GPU(s)")
    return device


def wants_channels_last(memory_format: str, device: torch.device) -> bool:
    """Whether a learner on ``device`` lays its CNNs out channels-last for
    ``learner.memory_format`` (``auto``: on the CPU only, where oneDNN's convolutions are
    faster that way; on a GPU in float32 they are not reliably so)."""
    return memory_format == "channels_last" or (memory_format == "auto" and device.type == "cpu")


def to_device(arrays: Mapping[str, np.ndarray], device: torch.device) -> dict[str, Tensor]:
    """Tensors of ``arrays`` on ``device``. On the CPU they wrap the arrays (copied only when
    read-only, as arrays decoded from a message are); on a GPU they are copied through pinned
    memory without blocking the caller (a fresh pinned copy per array: :class:`HostStaging`
    reuses its buffers instead)."""
    out: dict[str, Tensor] = {}
    for name, arr in arrays.items():
        host = torch.from_numpy(arr if arr.flags.writeable else np.array(arr))
        if device.type == "cpu":
            out[name] = host
        else:
            out[name] = host.pin_memory().to(device, non_blocking=True)
    return out


class InFlight(NamedTuple):
    """Tensors on their way to the device: usable on a stream once it waited on ``ready``."""

    tensors: dict[str, Tensor]
    ready: torch.cuda.Event | None
    """Recorded on the copy stream after the copies; None on the CPU (nothing in flight)."""
    device: torch.device

    def wait(self) -> dict[str, Tensor]:
        """The tensors, for the calling thread's current stream: it waits (on the device, the
        host does not) for the copies, and the allocator keeps their memory until that
        stream's work on them is done (``Tensor.record_stream``)."""
        if self.ready is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(self.ready)
            for tensor in self.tensors.values():
                tensor.record_stream(stream)
        return self.tensors


@dataclass
class _Slots:
    """The host buffers of one (name, shape, dtype): reused in turn, each once the device
    copy out of it last time (its event) completed."""

    buffers: list[Tensor]
    copied: list[torch.cuda.Event | None]
    next: int = 0


@dataclass
class HostStaging:
    """Reusable host buffers that batches pass through on their way to ``device``.

    :meth:`stage` copies each array into a buffer kept for its (name, shape, dtype):
    page-locked when ``pin`` (the default on a GPU; pinning needs CUDA), so the device copy
    out of it runs without blocking the host. Each key has ``slots`` buffers used in turn, so
    with 2 the next batch is staged while the last one's copy is in flight; a buffer is
    written again only once its copy completed. At most ``max_keys`` keys are kept (the least
    recently used goes first: a batch of fresh unrolls changes shape with the stale ones).

    :meth:`move` stages and copies on ``stream``, a CUDA stream of its own, with
    ``non_blocking=True``; the :class:`InFlight` it returns gives the tensors to the stream
    that uses them. On the CPU it is :func:`to_device`: the arrays wrapped, nothing staged.
    Not thread-safe: one thread stages (the learner's, or :class:`PendingBatches`' mover).
    """

    device: torch.device
    pin: bool | None = None
    slots: int = 2
    max_keys: int = 32
    stream: torch.cuda.Stream | None = field(init=False, default=None)
    _slots: dict[tuple[str, tuple[int, ...], np.dtype], _Slots] = field(
        init=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        self.device = torch.device(self.device)
        if self.slots < 1 or self.max_keys < 1:
            raise ValueError(
                f"HostStaging needs slots >= 1 and max_keys >= 1, got "
                f"slots={self.slots}, max_keys={self.max_keys}"
            )
        if self.pin is None:
            self.pin = self.device.type == "cuda"
        if self.device.type == "cuda":
            self.stream = torch.cuda.Stream(self.device)

    @property
    def buffers(self) -> int:
        """How many host buffers it holds."""
        return sum(len(s.buffers) for s in self._slots.values())

    def stage(
        self, arrays: Mapping[str, np.ndarray], rows: np.ndarray | None = None
    ) -> dict[str, Tensor]:
        """Each of ``arrays`` (its ``rows``, given) copied into a host buffer of its own: one
        host copy, read-only arrays too. The buffers are reused: a result is good until the
        same key is staged ``slots`` more times."""
        return {name: slots.buffers[i] for name, (slots, i) in self._stage(arrays, rows).items()}

    def move(self, arrays: Mapping[str, np.ndarray], rows: np.ndarray | None = None) -> InFlight:
        """``arrays`` (their ``rows``, given) on their way to the device."""
        if self.stream is None:
            chosen = arrays if rows is None else {n: a[rows] for n, a in arrays.items()}
            return InFlight(to_device(chosen, self.device), None, self.device)
        staged = self._stage(arrays, rows)
        ready = torch.cuda.Event()
        with torch.cuda.stream(self.stream):
            tensors = {
                name: slots.buffers[i].to(self.device, non_blocking=True)
                for name, (slots, i) in staged.items()
            }
            ready.record(self.stream)
        for slots, i in staged.values():  # each buffer free again once this copy is done
            slots.copied[i] = ready
        return InFlight(tensors, ready, self.device)

    def _stage(
        self, arrays: Mapping[str, np.ndarray], rows: np.ndarray | None
    ) -> dict[str, tuple[_Slots, int]]:
        """:meth:`stage`, naming each array's slots and the buffer it took."""
        staged: dict[str, tuple[_Slots, int]] = {}
        for name, arr in arrays.items():
            shape = arr.shape if rows is None else (len(rows), *arr.shape[1:])
            slots, i = self._take(name, shape, arr.dtype)
            out = slots.buffers[i].numpy()
            if rows is None:
                np.copyto(out, arr)
            else:  # rows are in range; "clip" lets take write into out unbuffered
                np.take(arr, rows, axis=0, out=out, mode="clip")
            staged[name] = (slots, i)
        return staged

    def _take(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> tuple[_Slots, int]:
        """The slots of (name, shape, dtype) and the index of the buffer to write next, free
        (its last copy done)."""
        key = (name, tuple(shape), dtype)
        slots = self._slots.pop(key, None)  # re-inserted last: the most recently used
        if slots is None:
            while len(self._slots) >= self.max_keys:
                self._slots.pop(next(iter(self._slots)))  # pinned memory in flight is kept
            slots = _Slots([], [])  # by torch's host allocator until its copy is done
        self._slots[key] = slots
        i = slots.next
        slots.next = (i + 1) % self.slots
        if i == len(slots.buffers):
            torch_dtype = torch.from_numpy(np.empty(0, dtype)).dtype
            slots.buffers.append(torch.empty(shape, dtype=torch_dtype, pin_memory=bool(self.pin)))
            slots.copied.append(None)
        copied = slots.copied[i]
        if copied is not None:
            copied.synchronize()
            slots.copied[i] = None
        return slots, i


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

    ``background`` (the default on a GPU): a thread stages each batch as it is added and
    starts its copy (:class:`HostStaging`), and :meth:`pop` has the update's stream wait for
    it, so the copy of batch n+1 overlaps the update on batch n."""

    def __init__(self, device: torch.device | str = "cpu", background: bool | None = None) -> None:
        self.device = torch.device(device)
        self.staging = HostStaging(self.device)
        self._queue: deque[tuple[str, np.ndarray, np.ndarray, Future[InFlight]]] = deque()
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
            moved = self._mover.submit(self.staging.move, arrays)
        else:
            moved = Future()
            moved.set_result(self.staging.move(arrays))
        self._queue.append((shard, np.ascontiguousarray(msg.arrays["key"]), versions, moved))

    def pop(self) -> DeviceBatch | None:
        """The oldest batch (taken out: a batch whose update raises is dropped, not retried)."""
        if not self._queue:
            return None
        shard, keys, versions, moved = self._queue.popleft()
        return DeviceBatch(shard, keys, moved.result().wait(), versions)

    def close(self) -> None:
        if self._mover is not None:
            self._mover.shutdown(wait=False, cancel_futures=True)
