"""A3C (Mnih et al. 2016): each actor is a worker that computes the actor-critic gradient of
its own rollout and pushes it to the parameter server, which applies it (no learner).

- ``zrl.algos.policy_gradient``: the pure math (the A2C loss).
- ``policy``: the actor side (``A3CPolicy``: samples actions, then computes the gradient).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrl.algos.api import Algorithm, Wiring

if TYPE_CHECKING:
    from zrl.config import ExperimentConfig


def check_config(cfg: ExperimentConfig) -> None:
    r = cfg.roles
    if r.replay > 0:
        raise ValueError("a3c sends rollouts past the replay server: set roles.replay: 0")
    if r.learners > 0:
        raise ValueError(
            "a3c workers (actors) compute the gradients and the parameter server applies "
            "them: set roles.learners: 0"
        )
    if r.params == 0:
        raise ValueError("a3c needs the parameter server (roles.params: 1) to apply gradients")


ALGORITHM = Algorithm(
    name="a3c",
    summary="A3C: workers compute gradients, the parameter server applies them",
    wiring=Wiring(actions="discrete", experience="gradients", learner_input=""),
    policy="zrl.algos.a3c.policy:A3CPolicy",
    update="",
    model="zrl.models:actor_critic_for",
    # learner: the parameter server takes learner.torch_threads
    sections=("learner", "a3c"),
    check_config=check_config,
)
