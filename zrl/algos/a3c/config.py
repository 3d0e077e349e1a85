"""The ``a3c:`` section of an experiment config (A3C).

Pydantic only (no torch, no numpy): the package's ``ALGORITHM`` names it (``Algorithm.config``),
so ``zrl.config.experiment`` validates it, and the CLI stays fast.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from zrl.config.base import Section
from zrl.config.help import other_names


class A3CConfig(Section):
    """A3C (Mnih et al. 2016): workers push gradients, the parameter server applies them."""

    gamma: float = Field(0.99, ge=0, le=1)
    gae_lambda: float = Field(1.0, ge=0, le=1)
    """1.0 gives A3C's n-step returns; lower values use GAE."""
    entropy_coef: float = Field(0.01, ge=0)
    value_coef: float = Field(0.5, ge=0)
    lr: float = Field(1e-3, gt=0)
    """Learning rate of the parameter server's optimizer."""
    grad_clip: float = Field(0.5, gt=0)
    """Global L2 norm the combined gradient is clipped to before each step."""
    reduce: Literal["sum", "mean"] = "mean"
    """How the parameter server combines the gradients of one update."""
    gradients_per_update: int = Field(1, ge=1)
    """Gradients (from any workers) combined into one optimizer step."""
    max_lag: int = Field(8, ge=0)
    """Gradients computed on weights more than this many versions old are dropped and counted."""


KEY_ALIASES: dict[str, str] = other_names(rollout="actor.trajectory_length")
"""What users of SB3, CleanRL, RLlib and Sample Factory call its keys: an unknown key with one
of these names in a config of this algorithm is suggested the zrl key (``zrl.config.help``)."""
