"""The records of algorithm families that share their wiring, actor policy and model, built
for each algorithm from its own parts; and the config checks such a family shares. Light (no
torch): an algorithm package's ``__init__`` builds its ``ALGORITHM`` with it.

- :func:`unroll_algorithm`: IMPALA's and APPO's (actors that never wait, unrolls through a
  FIFO replay queue, the categorical or Gaussian actor policy of
  ``zrl.algos.kernel.sampling``), each with its own learner update; :func:`check_recurrent`
  and :func:`check_learner_group`, what both refuse.
- :func:`box_off_policy`: Ape-X DDPG's and SAC's (Box actions, Ape-X wiring), each with its
  own policy and update on ``zrl.algos.kernel.continuous``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from zrl.algos.api.algorithm import Algorithm, Pieces, Wiring

if TYPE_CHECKING:
    from zrl.algos.api.learner import LearnerSetup, LearnerUpdate
    from zrl.config.base import Section
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


def unroll_algorithm(
    name: str,
    summary: str,
    *,
    update: Callable[[], Callable[[LearnerSetup], LearnerUpdate]],
    config: Mapping[str, type[Section]],
    check_config: Callable[[ExperimentConfig], None],
    key_aliases: Mapping[str, str],
) -> Algorithm:
    """An algorithm of IMPALA's wiring with its own learner update (``update()`` imports and
    returns its class): unrolls through a
    FIFO replay queue (``any`` action space), the actor policy
    ``zrl.algos.kernel.sampling.make_categorical_policy`` (recurrent with ``model.core``,
    random with ``actor.random_policy``, through inference roles), the actor-critic
    ``zrl.nets.gaussian.policy_model_for``, data-parallel learners, the config sections
    replay, learner and its own ``config``."""

    def pieces() -> Pieces:
        from zrl.algos.kernel.sampling import make_categorical_policy
        from zrl.nets.gaussian import policy_model_for

        return Pieces(policy=make_categorical_policy, update=update(), model=policy_model_for)

    return Algorithm(
        name=name,
        summary=summary,
        wiring=Wiring.replayed("any", "unroll", ("fifo",)),
        pieces=pieces,
        recurrent=True,
        random_actions=True,
        remote_inference=True,
        data_parallel=True,
        config=config,
        sections=("replay", "learner"),
        check_config=check_config,
        key_aliases=key_aliases,
    )


def box_off_policy(
    name: str,
    summary: str,
    *,
    pieces: Callable[[], Pieces],
    config: Mapping[str, type[Section]],
    model_options: Callable[[ExperimentConfig], dict[str, Any]] | None = None,
    key_aliases: Mapping[str, str],
    shared_key_aliases: Mapping[str, str],
) -> Algorithm:
    """An algorithm for Box actions with its own ``pieces``, a policy and an update (on
    ``zrl.algos.kernel.continuous``; Ape-X DDPG, SAC) and zrl's network: Ape-X wiring,
    the config sections replay, learner and its own ``config``; data-parallel learners."""
    return Algorithm(
        name=name,
        summary=summary,
        wiring=Wiring.off_policy("box"),
        pieces=pieces,
        config=config,
        sections=("replay", "learner"),
        model_options=model_options,
        data_parallel=True,
        key_aliases=key_aliases,
        shared_key_aliases=shared_key_aliases,
    )
