"""Ape-X DDPG (Horgan et al. 2018), with TD3's twin critics, delayed policy updates and target
smoothing as options (``ddpg.*``): Gaussian-noise actors with an Ape-X spread of noise scales,
n-step transitions in replay.

- ``losses``: the pure math (critic targets, target policy smoothing, one update).
- ``policy``: the actor side (``ApexDDPGPolicy``: Gaussian noise, a scale per env slot).
- ``update``: the learner side (``ApexDDPGUpdate``: the critics and the delayed actor).

The policy and the update are built on what Ape-X DDPG shares with SAC
(``zrl.algos.kernel.continuous``: warm-up, bounds, initial priorities, receiving, targets,
checkpoint state); the record on ``zrl.algos.kernel.records.box_off_policy``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zrl.algos.apex_ddpg.config import KEY_ALIASES, SHARED_KEY_ALIASES, DDPGConfig
from zrl.algos.api.algorithm import Pieces
from zrl.algos.kernel.records import box_off_policy

if TYPE_CHECKING:
    from zrl.config.experiment import ExperimentConfig


def model_options(cfg: ExperimentConfig) -> dict[str, Any]:
    """``ddpg.twin``: TD3's second critic is part of the network."""
    return {"twin": cfg.section(DDPGConfig).twin}


def pieces() -> Pieces:
    """The heavy pieces (torch), imported when a process first uses one."""
    from zrl.algos.apex_ddpg.policy import ApexDDPGPolicy
    from zrl.algos.apex_ddpg.update import ApexDDPGUpdate
    from zrl.nets.continuous import ddpg_model_for

    return Pieces(policy=ApexDDPGPolicy, update=ApexDDPGUpdate, model=ddpg_model_for)


ALGORITHM = box_off_policy(
    "apex_ddpg",
    "Ape-X DDPG / TD3: Gaussian-noise actors, n-step replay, deterministic policy",
    pieces=pieces,
    config={"ddpg": DDPGConfig},
    model_options=model_options,
    key_aliases=KEY_ALIASES,
    shared_key_aliases=SHARED_KEY_ALIASES,
)
