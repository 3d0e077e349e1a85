"""APPO, asynchronous PPO (Sample Factory, Petrenko et al. 2020; RLlib's APPO): IMPALA's
wiring (actors that never wait, unrolls through a FIFO replay queue, unrolls more than
``appo.max_lag`` versions old dropped) with a learner that optimizes PPO's clipped surrogate
objective on V-trace advantages, ``appo.epochs`` passes of ``appo.minibatches`` per batch.

- ``losses``: the pure math (the clipped surrogate on ``zrl.algos.impala.vtrace`` targets).
- the actor side, the wiring and the model: IMPALA's (``zrl.algos.kernel.sampling``'s categorical
  policy, ``zrl.nets.recurrent.actor_critic_for``), recurrent with ``model.core`` as IMPALA's.
- ``update``: the learner side (``AppoUpdate``).

``roles.learners: N > 1``: data-parallel learners, as IMPALA's (``zrl.algos.impala``), each
taking ``appo.epochs x appo.minibatches`` steps per batch on the group's averaged gradients.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from zrl.algos import impala
from zrl.algos.appo.config import AppoConfig

if TYPE_CHECKING:
    from zrl.config.experiment import ExperimentConfig


def check_config(cfg: ExperimentConfig) -> None:
    impala.check_config(cfg)
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


# IMPALA's record with another learner: its wiring, actor policy and model.
ALGORITHM = replace(
    impala.ALGORITHM,
    name="appo",
    summary="APPO: asynchronous actors, unrolls through a FIFO queue, PPO clip on V-trace",
    update="zrl.algos.appo.update:AppoUpdate",
    config={"appo": AppoConfig},
    check_config=check_config,
)
