"""PPO (Schulman et al. 2017), and DD-PPO (Wijmans et al. 2020) with several learners: actors
publish rollouts to every learner; a round is one rollout per actor; ``ppo.mode: sync`` trains
each round on one weights version, ``async`` on rollouts up to ``ppo.max_lag`` versions old.

- ``zrl.algos.kernel.policy_gradient``: the pure math (clipped surrogate, gradient averaging).
- ``rounds``: which rollouts form a round (``RoundBuffer``) and the round's tensors.
- ``update``: the learner side (``PPOUpdate``; DD-PPO's gradient mean over a
  ``torch.distributed`` group is ``zrl.distributed.learner_group``).
- ``policy``: the actor side (``PPOPolicy``: the categorical policy, one round at a time).

With ``model.core: lstm`` or ``gru`` the actor-critic is recurrent (``zrl.nets.recurrent``): actors
send each rollout with the state it started from and its episode starts, and the learner
unrolls the core over whole env rows from that state (``rounds.recurrent_round_tensors``).
On a 1-D Box action space the model is the diagonal Gaussian actor-critic
(``zrl.nets.gaussian``) and the actors send ``continuous_unroll`` rollouts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrl.algos.api.algorithm import Algorithm, Pieces, Wiring
from zrl.algos.ppo.config import (
    KEY_ALIASES,
    PBT_HYPERPARAMETERS,
    PPOConfig,
)

if TYPE_CHECKING:
    from zrl.config.experiment import ExperimentConfig


def check_config(cfg: ExperimentConfig) -> None:
    mb = cfg.section(PPOConfig).minibatch_size
    learners = cfg.learners_per_policy()  # DD-PPO's, per learning policy
    if cfg.model.core == "none":
        if learners > 1 and mb % learners:
            raise ValueError(
                f"ppo.minibatch_size ({mb}) must split evenly across {learners} learners"
            )
        return
    if cfg.actor.env_groups != 1:
        raise ValueError(
            f"actor.env_groups: {cfg.actor.env_groups}: recurrent PPO (model.core: "
            f"{cfg.model.core}) acts on all of an actor's envs at once; set actor.env_groups: 1"
        )
    # Recurrent minibatches are whole env rows of actor.trajectory_length steps.
    rows = max(1, mb // cfg.actor.trajectory_length)
    if learners > 1 and rows % learners:
        raise ValueError(
            f"recurrent DD-PPO splits each minibatch's {rows} env rows (ppo.minibatch_size "
            f"{mb} // actor.trajectory_length {cfg.actor.trajectory_length}) across "
            f"roles.learners ({learners}): make the rows a multiple of the learners"
        )


def pieces() -> Pieces:
    """The heavy pieces (torch), imported when a process first uses one."""
    from zrl.algos.ppo.policy import make_policy
    from zrl.algos.ppo.update import PPOUpdate
    from zrl.nets.gaussian import policy_model_for

    return Pieces(policy=make_policy, update=PPOUpdate, model=policy_model_for)


ALGORITHM = Algorithm(
    name="ppo",
    summary="PPO / DD-PPO: rollouts to every learner, clipped surrogate, optional allreduce",
    pieces=pieces,
    wiring=Wiring(actions="any", experience="rollouts", learner_input="rollouts"),
    recurrent=True,
    both_seats=True,
    population=PBT_HYPERPARAMETERS,
    data_parallel=True,
    config={"ppo": PPOConfig},
    sections=("learner",),
    check_config=check_config,
    key_aliases=KEY_ALIASES,
)
