"""The ``impala:`` section of an experiment config (IMPALA).

Pydantic only (no torch, no numpy): the package's ``ALGORITHM`` names it (``Algorithm.config``),
so ``zrl.config.experiment`` validates it, and the CLI stays fast.
"""

from __future__ import annotations

from pydantic import Field

from zrl.algos.api.algorithm import ROLLOUT_KEY_ALIASES
from zrl.config.base import Section


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


KEY_ALIASES: dict[str, str] = {
    "learning_rate": "learner.lr",
    "lr": "learner.lr",
    "gamma": "impala.gamma",
    "discount": "impala.gamma",
    **ROLLOUT_KEY_ALIASES,
    "batch_size": "replay.batch_size",
    "ent_coef": "impala.entropy_coef",
    "entropy_coef": "impala.entropy_coef",
    "ent_coeff": "impala.entropy_coef",
    "entropy_coeff": "impala.entropy_coef",
    "exploration_loss_coeff": "impala.entropy_coef",
    "vf_coef": "impala.value_coef",
    "value_coef": "impala.value_coef",
    "vf_loss_coeff": "impala.value_coef",
    "value_loss_coeff": "impala.value_coef",
    "max_policy_lag": "impala.max_lag",
    "vtrace_rho": "impala.rho_bar",
    "vtrace_c": "impala.c_bar",
    "n_epochs": "impala.epochs",
    "update_epochs": "impala.epochs",
    "num_epochs": "impala.epochs",
    "num_sgd_iter": "impala.epochs",
    "epochs": "impala.epochs",
    "gae_lambda": "impala.vtrace_lambda",
    "lambda": "impala.vtrace_lambda",
}
"""What users of SB3, CleanRL, RLlib and Sample Factory call its keys: an unknown key with one
of these names in a config of this algorithm is suggested the zrl key (``zrl.config.help``)."""
