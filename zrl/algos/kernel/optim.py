"""The optimizer step every algorithm takes: Adam, and a step that refuses NaN/inf: at once
(:func:`checked_step`, which reads the loss back to the host) or on the device
(:func:`deferred_step`, which reads nothing back: a GPU learner's)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from zrl.algos.api.learner import NonFiniteLossError


def make_adam(
    params: Iterable[Any], lr: float, eps: float = 1e-8, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """Adam, fused where this torch supports it on the CPU (fewer kernel launches per step);
    ``weight_decay`` adds ``weight_decay * w`` to each gradient (L2 regularisation)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, eps=eps, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr, eps=eps, weight_decay=weight_decay)


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


class StepFn(Protocol):
    """An optimizer step as the algorithms' math takes it (``step=``): :func:`checked_step`,
    or a learner group's step on the gradients averaged over the group
    (``zrl.algos.kernel.batch_update.BatchUpdate.optimizer_step``)."""

    def __call__(
        self,
        optimizer: torch.optim.Optimizer,
        loss: Tensor,
        parameters: Sequence[Tensor],
        grad_clip: float,
    ) -> float: ...


def defers_checks(optimizer: torch.optim.Optimizer, device: torch.device) -> bool:
    """Whether an update on ``device`` with ``optimizer`` checks finiteness on the device
    (:func:`deferred_step`): on a GPU, with a fused optimizer (which can skip a step there)."""
    return device.type == "cuda" and bool(optimizer.defaults.get("fused"))


def deferred_step(
    optimizer: torch.optim.Optimizer,
    loss: Tensor,
    parameters: Sequence[Tensor],
    grad_clip: float,
    finite: Tensor,
) -> tuple[Tensor, Tensor]:
    """:func:`checked_step` without reading anything back to the host: ``zero_grad``,
    backward, clip to global L2 norm ``grad_clip``, then a step that the device skips (the
    weights, the moments and the step count untouched) unless ``finite`` (a 0-d bool tensor)
    holds and the loss and the pre-clip norm are finite. Returns ``(grad_norm, finite)``,
    both 0-d tensors on the device, ``finite`` the AND of the three: the caller passes it on
    to its next step (one NaN skips the rest of a batch) and reads it later.

    ``optimizer`` must be fused (``make_adam`` on a GPU): its step takes the skip as
    ``found_inf``, as mixed precision's ``GradScaler`` hands it."""
    if not optimizer.defaults.get("fused"):
        raise ValueError(f"deferred_step needs a fused optimizer, got {type(optimizer).__name__}")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(parameters, grad_clip)
    finite = finite & torch.isfinite(loss.detach()) & torch.isfinite(grad_norm)
    optimizer.found_inf = (~finite).float()  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]
    return grad_norm, finite
