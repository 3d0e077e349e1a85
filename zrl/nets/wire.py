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
    tensors: dict[str, Tensor] = {}
    for name, current in expected.items():
        array = np.asarray(arrays[name])
        if array.shape != tuple(current.shape):
            raise ValueError(
                f"load_arrays: shape mismatch for {name!r}: got {array.shape}, "
                f"model has {tuple(current.shape)}"
            )
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            # One NaN in published weights poisons every action until the next good version.
            raise ValueError(f"load_arrays: {name!r} holds NaN or inf values")
        if not array.flags.writeable:
            # Arrays decoded straight from a message buffer are read-only; torch warns on those.
            array = array.copy()
        tensors[name] = torch.from_numpy(array)
    model.load_state_dict(tensors, strict=True)
