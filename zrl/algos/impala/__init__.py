"""IMPALA (Espeholt et al. 2018): actors that never wait, unrolls through a FIFO replay queue,
a V-trace actor-critic learner that drops unrolls more than ``impala.max_lag`` versions old.

- ``losses``: the pure math (the actor-critic loss on V-trace targets, one update); the
  V-trace targets and the forward pass over unrolls are the kernel's
  (``zrl.algos.kernel.vtrace``).
- the actor side, the wiring and the model: the kernel's record of the unroll algorithms
  (``zrl.algos.kernel.records.unroll_algorithm``, shared with APPO): the actor policy
  ``zrl.algos.kernel.sampling.make_categorical_policy`` (the categorical policy shared with
  PPO, recurrent with ``model.core``).
- ``update``: the learner side (``ImpalaUpdate``).

With ``model.core: lstm`` or ``gru`` the actor-critic is recurrent (``zrl.nets.recurrent``): actors
send each unroll with the state it started from and its episode starts
(``RecurrentCategoricalPolicy``), the FIFO stores them with it, and the learner unrolls the
core from that state (``zrl.algos.kernel.unrolls.unroll_outputs``).

With ``roles.learners: N > 1`` the learners train data-parallel (``zrl.algos.kernel.unrolls``,
``zrl.distributed.learner_group``): each takes its own batches from the replay shards (the broker's
``batches`` stream deals them out in turn), all N form one ``torch.distributed`` group, every step
averages their gradients, and learner 0 alone publishes the weights.

On a 1-D Box action space the model is the diagonal Gaussian actor-critic
(``zrl.nets.gaussian.policy_model_for`` picks it from the env's action space), its actors
``GaussianPolicy`` and its unrolls ``continuous_unroll``s; V-trace and the loss use the
Gaussian's log-densities and entropies, summed over the action dims.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrl.algos.impala.config import KEY_ALIASES, ImpalaConfig
from zrl.algos.kernel.records import check_learner_group, check_recurrent, unroll_algorithm

if TYPE_CHECKING:
    from zrl.algos.impala.update import ImpalaUpdate
    from zrl.config.experiment import ExperimentConfig


def check_config(cfg: ExperimentConfig) -> None:
    check_recurrent(cfg)
    check_learner_group(cfg)


def update() -> type[ImpalaUpdate]:
    """The learner update (torch), imported when a learner first builds one."""
    from zrl.algos.impala.update import ImpalaUpdate

    return ImpalaUpdate


ALGORITHM = unroll_algorithm(
    "impala",
    "IMPALA: asynchronous actors, unrolls through a FIFO queue, V-trace learner",
    update=update,
    config={"impala": ImpalaConfig},
    check_config=check_config,
    key_aliases=KEY_ALIASES,
)
