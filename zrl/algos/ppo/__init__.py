"""PPO (Schulman et al. 2017), and DD-PPO (Wijmans et al. 2020) with several learners: actors
publish rollouts to every learner; a round is one rollout per actor; ``ppo.mode: sync`` trains
each round on one weights version, ``async`` on rollouts up to ``ppo.max_lag`` versions old.

- ``zrl.algos.policy_gradient``: the pure math (clipped surrogate, gradient averaging).
- ``rounds``: which rollouts form a round (``RoundBuffer``) and the round's tensors.
- ``update``: the learner side (``PPOUpdate``), with the DD-PPO allreduce.
- ``policy``: the actor side (``PPOPolicy``: the categorical policy, one round at a time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrl.algos.api import Algorithm, Wiring

if TYPE_CHECKING:
    from zrl.config import ExperimentConfig


def check_config(cfg: ExperimentConfig) -> None:
    r = cfg.roles
    if r.learners > 1 and cfg.ppo.minibatch_size % r.learners:
        raise ValueError(
            f"ppo.minibatch_size ({cfg.ppo.minibatch_size}) must split evenly across "
            f"{r.learners} learners"
        )


ALGORITHM = Algorithm(
    name="ppo",
    summary="PPO / DD-PPO: rollouts to every learner, clipped surrogate, optional allreduce",
    wiring=Wiring(actions="discrete", experience="rollouts", learner_input="rollouts"),
    policy="zrl.algos.ppo.policy:PPOPolicy",
    update="zrl.algos.ppo.update:PPOUpdate",
    model="zrl.recurrent:actor_critic_for",
    recurrent="optional",
    sections=("learner", "ppo"),
    check_config=check_config,
)
