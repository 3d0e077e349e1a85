"""IMPALA (Espeholt et al. 2018): actors that never wait, unrolls through a FIFO replay queue,
a V-trace actor-critic learner that drops unrolls more than ``impala.max_lag`` versions old.

- ``vtrace``: the pure math (V-trace targets, the loss, one update).
- ``policy``: the actor side (``zrl.algos.kernel.sampling.make_categorical_policy``: the categorical
  policy shared with PPO, recurrent with ``model.core``).
- ``update``: the learner side (``ImpalaUpdate``).

With ``model.core: lstm`` or ``gru`` the actor-critic is recurrent (``zrl.nets.recurrent``): actors
send each unroll with the state it started from and its episode starts
(``RecurrentCategoricalPolicy``), the FIFO stores them with it, and the learner unrolls the
core from that state (``zrl.algos.kernel.unrolls.unroll_outputs``).

With ``roles.learners: N > 1`` the learners train data-parallel (``zrl.algos.kernel.unrolls``,
``zrl.distributed.learner_group``): each takes its own batches from the replay shards (the broker's
``batches`` stream deals them out in turn), all N form one ``torch.distributed`` group, every
step averages their gradients, and learner 0 alone publishes the weights.

On a 1-D Box action space the model is the diagonal Gaussian actor-critic
(``zrl.nets.gaussian.policy_model_for`` picks it from the env's action space), its actors
``GaussianPolicy`` and its unrolls ``continuous_unroll``s; V-trace and the loss use the
Gaussian's log-densities and entropies, summed over the action dims.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrl.algos.api.algorithm import Algorithm, Wiring
from zrl.algos.impala.config import ImpalaConfig

if TYPE_CHECKING:
    from zrl.config.experiment import ExperimentConfig


def check_recurrent(cfg: ExperimentConfig) -> None:
    """What a recurrent IMPALA/APPO actor (``model.core``) cannot do: act without its model,
    or act for a group of its envs at a time."""
    core, name = cfg.model.core, cfg.algo
    if core == "none":
        return
    if cfg.actor.random_policy:
        raise ValueError(
            f"actor.random_policy: a recurrent {name} policy (model.core: {core}) always runs "
            "its model; set actor.random_policy: false or model.core: none"
        )
    if cfg.actor.env_groups != 1:
        raise ValueError(
            f"actor.env_groups: {cfg.actor.env_groups}: recurrent {name} (model.core: {core}) "
            "acts on all of an actor's envs at once; set actor.env_groups: 1"
        )


def check_learner_group(cfg: ExperimentConfig) -> None:
    """What several IMPALA/APPO learners of one policy (``roles.learners > 1``, a group
    averaging its gradients) need beyond a batch in flight for each learner (checked for
    every algorithm): no statistics that each would gather from its own batches."""
    learners, name = cfg.learners_per_policy(), cfg.algo
    if learners < 2:
        return
    if cfg.model.normalize_input:
        raise ValueError(
            f"model.normalize_input with roles.learners ({learners}): each {name} learner "
            "would gather the input statistics from its own batches, and their weights would "
            "part; set model.normalize_input: false or roles.learners: 1"
        )


def check_config(cfg: ExperimentConfig) -> None:
    check_recurrent(cfg)
    check_learner_group(cfg)


ALGORITHM = Algorithm(
    name="impala",
    summary="IMPALA: asynchronous actors, unrolls through a FIFO queue, V-trace learner",
    wiring=Wiring.replayed("any", "unroll", ("fifo",)),
    policy="zrl.algos.kernel.sampling:make_categorical_policy",
    update="zrl.algos.impala.update:ImpalaUpdate",
    model="zrl.nets.gaussian:policy_model_for",
    recurrent=True,
    random_actions=True,
    remote_inference=True,
    data_parallel=True,
    config={"impala": ImpalaConfig},
    sections=("replay", "learner"),
    check_config=check_config,
)
