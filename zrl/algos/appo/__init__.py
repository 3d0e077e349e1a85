"""APPO, asynchronous PPO (Sample Factory, Petrenko et al. 2020; RLlib's APPO): IMPALA's
wiring (actors that never wait, unrolls through a FIFO replay queue, unrolls more than
``appo.max_lag`` versions old dropped) with a learner that optimizes PPO's clipped surrogate
objective on V-trace advantages, ``appo.epochs`` passes of ``appo.minibatches`` per batch.

- ``losses``: the pure math (the clipped surrogate on ``zrl.algos.kernel.vtrace`` targets).
- the actor side, the wiring and the model: IMPALA's, from the kernel's record of the unroll
  algorithms (``zrl.algos.kernel.records.unroll_algorithm``: ``zrl.algos.kernel.sampling``'s
  categorical policy, ``zrl.nets.gaussian.policy_model_for``), recurrent with ``model.core``.
- ``update``: the learner side (``AppoUpdate``, on ``zrl.algos.kernel.unrolls`` as IMPALA's).

``roles.learners: N > 1``: data-parallel learners, as IMPALA's, each taking ``appo.epochs x
appo.minibatches`` steps per batch on the group's averaged gradients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrl.algos.appo.config import KEY_ALIASES, AppoConfig
from zrl.algos.kernel.records import check_learner_group, check_recurrent, unroll_algorithm

if TYPE_CHECKING:
    from zrl.algos.appo.update import AppoUpdate
    from zrl.config.experiment import ExperimentConfig


def check_config(cfg: ExperimentConfig) -> None:
    check_recurrent(cfg)
    check_learner_group(cfg)
    learners = cfg.learners_per_policy()
    if learners > 1 and cfg.section(AppoConfig).normalize_returns:
        raise ValueError(
            f"appo.normalize_returns with roles.learners ({learners}): each learner would "
            "gather the return statistics from its own batches, and their weights would "
            "part; set appo.normalize_returns: false or roles.learners: 1"
        )
    minibatches = cfg.section(AppoConfig).minibatches
    if minibatches > cfg.replay.batch_size:
        raise ValueError(
            f"appo.minibatches ({minibatches}) must be at most replay.batch_size "
            f"({cfg.replay.batch_size}): a minibatch holds whole unrolls"
        )


def update() -> type[AppoUpdate]:
    """The learner update (torch), imported when a learner first builds one."""
    from zrl.algos.appo.update import AppoUpdate

    return AppoUpdate


# The unroll algorithms' record (IMPALA's wiring, actor policy and model) with its learner.
ALGORITHM = unroll_algorithm(
    "appo",
    "APPO: asynchronous actors, unrolls through a FIFO queue, PPO clip on V-trace",
    update=update,
    config={"appo": AppoConfig},
    check_config=check_config,
    key_aliases=KEY_ALIASES,
)
