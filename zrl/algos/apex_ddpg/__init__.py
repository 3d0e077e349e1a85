"""Ape-X DDPG (Horgan et al. 2018), with TD3's twin critics, delayed policy updates and target
smoothing as options (``ddpg.*``): Gaussian-noise actors with an Ape-X spread of noise scales,
n-step transitions in replay.

- ``losses``: the pure math (critic targets, one update, initial priorities).
- ``zrl.algos.continuous``: the actor side and the learner side, shared with SAC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zrl.algos.apex_ddpg.config import DDPGConfig
from zrl.algos.api.algorithm import Algorithm

if TYPE_CHECKING:
    from zrl.config.experiment import ExperimentConfig


def model_options(cfg: ExperimentConfig) -> dict[str, Any]:
    """``ddpg.twin``: TD3's second critic is part of the network."""
    return {"twin": cfg.section(DDPGConfig).twin}


ALGORITHM = Algorithm.box_off_policy(
    "apex_ddpg",
    "Ape-X DDPG / TD3: Gaussian-noise actors, n-step replay, deterministic policy",
    model="zrl.nets.continuous:ddpg_model_for",
    config={"ddpg": DDPGConfig},
    model_options=model_options,
)
