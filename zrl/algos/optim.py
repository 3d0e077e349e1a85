"""The optimizer step every algorithm takes: Adam, and a step that refuses NaN/inf."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from zrl.algos.api.learner import NonFiniteLossError


def make_adam(params: Iterable[Any], lr: float, eps: float = 1e-8) -> torch.optim.Optimizer:
    """Adam, fused where this torch supports it on the CPU (fewer kernel launches per step)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr, eps=eps)


def clipped_gradients(loss: Tensor, parameters: Sequence[Tensor], grad_clip: float) -> Tensor:
    """Clip the gradients already in ``parameters`` to global L2 norm ``grad_clip``; raise
    :class:`NonFiniteLossError` when the loss or the (pre-clip) norm is NaN/inf. Returns the
    pre-clip norm (a 0-d tensor)."""
    grad_norm = nn.utils.clip_grad_norm_(parameters, grad_clip)
    if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
        # Stepping would write NaN into every weight; the caller decides what to do instead.
        raise NonFiniteLossError(float(loss.item()), float(grad_norm.item()))
    return grad_norm


def checked_step(
    optimizer: torch.optim.Optimizer,
    loss: Tensor,
    parameters: Sequence[Tensor],
    grad_clip: float,
) -> float:
    """``zero_grad``, backward, clip to global L2 norm ``grad_clip``, then step.

    Raises :class:`NonFiniteLossError` before the step when the loss or the (pre-clip) gradient
    norm is NaN/inf, so the weights are untouched. Returns the pre-clip gradient norm.
    """
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = clipped_gradients(loss, parameters, grad_clip)
    optimizer.step()
    return float(grad_norm.item())
