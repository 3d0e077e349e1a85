"""The ``r2d2:`` section of an experiment config (R2D2).

Pydantic only (no torch, no numpy): the package's ``ALGORITHM`` names it (``Algorithm.config``),
so ``zrl.config.experiment`` validates it, and the CLI stays fast.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from zrl.config.base import Section


class R2D2Config(Section):
    """R2D2 (Kapturowski et al. 2019): recurrent Q-learning on stored-state sequences.

    n-step, gamma, batch size (sequences), the priority exponent (``replay.alpha``, 0.9 in the
    paper) and the table come from ``replay:``; the target network, gradient clipping and
    publishing from ``learner:``; the per-slot epsilons from ``actor:`` as for Ape-X."""

    sequence_length: int = Field(80, ge=1)
    """Steps per sequence. Sequences start every sequence_length - burn_in steps of an episode,
    so neighbours overlap by burn_in (half, by default) and never cross an episode's end."""
    burn_in: int = Field(40, ge=0)
    """Leading steps of each sequence that only warm the stored state up (no loss, no
    gradient); the trained parts of successive sequences tile each episode once."""
    priority_eta: float = Field(0.9, ge=0, le=1)
    """Sequence priority eta * max|td| + (1 - eta) * mean|td| over its trained steps."""
    rescale_epsilon: float = Field(1e-3, ge=0)
    """Value rescaling h(x) = sign(x)(sqrt(|x| + 1) - 1) + epsilon * x of the targets."""
    zero_state: bool = False
    """Replay every sequence from a zero state instead of the stored one (the paper's
    ablation); the burn-in still applies."""

    @model_validator(mode="after")
    def _burn_in_fits(self) -> R2D2Config:
        if self.burn_in >= self.sequence_length:
            raise ValueError(
                f"burn_in ({self.burn_in}) must be less than sequence_length "
                f"({self.sequence_length})"
            )
        return self
