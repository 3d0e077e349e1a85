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
