"""Ape-X DDPG (Horgan et al. 2018), with TD3's twin critics, delayed policy updates and target
smoothing as options (``ddpg.*``): Gaussian-noise actors with an Ape-X spread of noise scales,
n-step transitions in replay.

- ``losses``: the pure math (critic targets, one update, initial priorities).
- ``zrl.algos.continuous``: the actor side and the learner side, shared with SAC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrl.algos.api import Algorithm, Wiring

if TYPE_CHECKING:
    from zrl.config import ExperimentConfig


def check_config(cfg: ExperimentConfig) -> None:
    """What every off-policy algorithm for Box actions needs (SAC uses it too)."""
    r = cfg.roles
    if r.replay == 0 and (r.actors > 0 or r.learners > 0):
        raise ValueError(f"{cfg.algo} learns from transitions in replay: set roles.replay >= 1")
    if cfg.replay.table == "fifo":
        raise ValueError(
            f"{cfg.algo} samples transitions: set replay.table: uniform or prioritized"
        )


ALGORITHM = Algorithm(
    name="apex_ddpg",
    summary="Ape-X DDPG / TD3: Gaussian-noise actors, n-step replay, deterministic policy",
    wiring=Wiring(
        actions="box",
        experience="replay",
        replay_item="transitions",
        replay_tables=("uniform", "prioritized"),
        learner_input="batches",
    ),
    policy="zrl.algos.continuous:ContinuousPolicy",
    update="zrl.algos.continuous:ContinuousUpdate",
    model="zrl.continuous_models:continuous_model_for",
    sections=("replay", "learner", "ddpg"),
    check_config=check_config,
)
