"""A model's weights as named numpy arrays and back: what params stores and WEIGHTS carries."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor, nn


def model_to_arrays(model: nn.Module) -> dict[str, np.ndarray]:
    """``state_dict`` as contiguous CPU numpy copies (safe to ship while training continues)."""
    return {
        name: np.array(tensor.detach().cpu().numpy(), copy=True, order="C")
        for name, tensor in model.state_dict().items()
    }


def non_finite_array(arrays: Mapping[str, np.ndarray]) -> str | None:
    """The name of the first float array of ``arrays`` holding a NaN or an inf, else None.

    Each float array's minimum and maximum, reduced in C with no temporary array: numpy's
    min and max propagate NaN and show -inf and +inf, and unlike a sum they cannot overflow
    on finite values. What params checks once per weights version, and followers on load."""
    for name, array in arrays.items():
        if array.size == 0 or array.dtype.kind not in "fc":
            continue
        if array.dtype.kind == "c":
            finite = bool(np.isfinite(array).all())
        else:
            lowest = np.minimum.reduce(array, axis=None)
            finite = bool(np.isfinite(lowest) and np.isfinite(np.maximum.reduce(array, axis=None)))
        if not finite:
            return name
    return None


def load_arrays(model: nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """Inverse of :func:`model_to_arrays`: load every entry of ``model.state_dict()``.

    All keys, shapes and values are checked before anything is written, so a bad ``arrays``
    raises ``ValueError`` (naming missing/unexpected keys, the mismatched shape or the entry
    holding NaN/inf) and leaves ``model`` untouched.
    """
    expected = model.state_dict()
    missing = sorted(set(expected) - set(arrays))
    unexpected = sorted(set(arrays) - set(expected))
    if missing or unexpected:
        raise ValueError(f"load_arrays: missing keys {missing}, unexpected keys {unexpected}")
    checked: dict[str, np.ndarray] = {}
    for name, current in expected.items():
        array = np.asarray(arrays[name])
        if array.shape != tuple(current.shape):
            raise ValueError(
                f"load_arrays: shape mismatch for {name!r}: got {array.shape}, "
                f"model has {tuple(current.shape)}"
            )
        checked[name] = array
    # One NaN in published weights poisons every action until the next good version.
    bad = non_finite_array(checked)
    if bad is not None:
        raise ValueError(f"load_arrays: {bad!r} holds NaN or inf values")
    tensors: dict[str, Tensor] = {}
    for name, array in checked.items():
        # Arrays decoded straight from a message buffer are read-only; torch warns on those.
        tensors[name] = torch.from_numpy(array if array.flags.writeable else array.copy())
    model.load_state_dict(tensors, strict=True)


class WeightsCopy:
    """A model's weights copied off its device without stopping the host (what a learner
    publishes). On the CPU :meth:`start` copies at once. On a GPU it queues the copies into
    reused page-locked buffers on a stream of its own, after the updates queued so far, and
    makes the update stream wait for them (on the device: the next update cannot change what
    is being copied); :meth:`take` hands the arrays over once the copies are done, and the host
    never waits for the device to publish."""

    def __init__(self) -> None:
        self.buffers: dict[str, Tensor] = {}
        self.stream: torch.cuda.Stream | None = None
        self.done: torch.cuda.Event | None = None
        self.ready: dict[str, np.ndarray] | None = None
        self.meta: dict = {}

    @property
    def busy(self) -> bool:
        """A copy was started and not taken yet."""
        return self.done is not None or self.ready is not None

    def start(self, model: nn.Module, meta: dict) -> None:
        """Copy ``model``'s state_dict as it will be once the updates queued so far are done;
        ``meta`` travels with it to :meth:`take`. A copy not taken yet is dropped for it."""
        self.meta = dict(meta)
        state = model.state_dict()
        device = next((t.device for t in state.values()), torch.device("cpu"))
        if device.type != "cuda":
            self.done, self.ready = None, model_to_arrays(model)
            return
        update = torch.cuda.current_stream(device)
        if self.stream is None:
            self.stream = torch.cuda.Stream(device)
        self.stream.wait_stream(update)
        with torch.cuda.stream(self.stream):
            for name, tensor in state.items():
                buffer = self.buffers.get(name)
                if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
                    buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                    self.buffers[name] = buffer
                buffer.copy_(tensor.detach(), non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record(self.stream)
        update.wait_event(self.done)
        self.ready = None

    def take(self, wait: bool = False) -> tuple[dict[str, np.ndarray], dict] | None:
        """The copied arrays (contiguous numpy copies, safe to send) and their meta once the
        copy is done (``wait``: wait for it); None while it runs or when none was started."""
        if self.done is not None:
            if not wait and not self.done.query():
                return None
            self.done.synchronize()
            self.ready = {n: np.array(b.numpy(), copy=True) for n, b in self.buffers.items()}
            self.done = None
        if self.ready is None:
            return None
        arrays, self.ready = self.ready, None
        return arrays, self.meta
