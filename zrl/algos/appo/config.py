"""The ``appo:`` section of an experiment config (APPO).

Pydantic only (no torch, no numpy): the package's ``ALGORITHM`` names it (``Algorithm.config``),
so ``zrl.config.experiment`` validates it, and the CLI stays fast.
"""

from __future__ import annotations

from pydantic import Field

from zrl.config.base import Section
from zrl.config.help import other_names


class AppoConfig(Section):
    """APPO (Sample Factory, Petrenko et al. 2020): IMPALA's asynchronous actors and FIFO queue,
    a learner optimizing PPO's clipped surrogate on V-trace advantages."""

    gamma: float = Field(0.99, ge=0, le=1)
    """Discount factor."""
    rho_bar: float = Field(1.0, gt=0)
    """Clip of the importance weights in the V-trace targets and advantages."""
    c_bar: float = Field(1.0, gt=0)
    """Clip of the V-trace trace-cutting coefficients."""
    vtrace_lambda: float = Field(1.0, ge=0, le=1)
    """Scales the traces, c_t = lambda * min(c_bar, ratio): below 1, lambda-return targets."""
    clip: float = Field(0.1, gt=0)
    """PPO clip of the ratio pi/mu to the behaviour policy: [1 - clip, 1 + clip]."""
    value_clip: float | None = Field(None, gt=0)
    """Clips the value change against the values before the batch's first step; null: off."""
    entropy_coef: float = Field(0.01, ge=0)
    """Weight of the entropy bonus."""
    value_coef: float = Field(0.5, ge=0)
    """Weight of the value loss 0.5 * (v_s - V)^2."""
    normalize_returns: bool = False
    """The value head learns V-trace targets normalized by their running mean and std (Sample
    Factory's Atari default), denormalized to bootstrap: one value-loss scale for any rewards."""
    normalize_advantages: bool = True
    """Normalize the advantages of each minibatch to mean 0, std 1 (over its valid steps)."""
    epochs: int = Field(1, ge=1)
    """Passes over each batch of unrolls (Sample Factory's num_epochs)."""
    minibatches: int = Field(1, ge=1)
    """Minibatches of whole unrolls per epoch, one optimizer step each (at most batch_size)."""
    max_lag: int = Field(20, ge=0)
    """Unrolls more than this many weights versions old are dropped (status: stale_unrolls)."""


KEY_ALIASES: dict[str, str] = other_names(
    lr="learner.lr",
    rollout="actor.trajectory_length",
    batch_size="replay.batch_size",
    gae_lambda="appo.vtrace_lambda",
)
"""What users of SB3, CleanRL, RLlib and Sample Factory call its keys: an unknown key with one
of these names in a config of this algorithm is suggested the zrl key (``zrl.config.help``)."""
