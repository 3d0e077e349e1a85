"""The ``impala:`` section of an experiment config (IMPALA).

Pydantic only (no torch, no numpy): the package's ``ALGORITHM`` names it (``Algorithm.config``),
so ``zrl.config.experiment`` validates it, and the CLI stays fast.
"""

from __future__ import annotations

from pydantic import Field

from zrl.config.base import Section
from zrl.config.help import other_names


class ImpalaConfig(Section):
    """IMPALA (Espeholt et al. 2018): unrolls through a FIFO replay table, V-trace learner."""

    gamma: float = Field(0.99, ge=0, le=1)
    rho_bar: float = Field(1.0, gt=0)
    """Clip of the importance weights in the V-trace targets."""
    c_bar: float = Field(1.0, gt=0)
    """Clip of the trace-cutting coefficients."""
    vtrace_lambda: float = Field(1.0, ge=0, le=1)
    """Scales the traces, c_t = lambda * min(c_bar, ratio): below 1 the targets are
    lambda-returns (less variance, more bias), as GAE's lambda."""
    entropy_coef: float = Field(0.01, ge=0)
    value_coef: float = Field(0.5, ge=0)
    max_lag: int = Field(20, ge=0)
    """Unrolls collected with weights more than this many versions behind the learner's are
    dropped and counted (status: stale_unrolls), never used."""
    epochs: int = Field(1, ge=1)
    """V-trace updates on each batch (RLlib's and Sample Factory's num_epochs): 1 is the
    paper's IMPALA; more train on each unroll again, V-trace correcting for the policy having
    moved, so actors spend less CPU per update."""


KEY_ALIASES: dict[str, str] = other_names(
    lr="learner.lr",
    rollout="actor.trajectory_length",
    batch_size="replay.batch_size",
    gae_lambda="impala.vtrace_lambda",
)
"""What users of SB3, CleanRL, RLlib and Sample Factory call its keys: an unknown key with one
of these names in a config of this algorithm is suggested the zrl key (``zrl.config.help``)."""
