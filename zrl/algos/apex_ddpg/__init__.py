"""Ape-X DDPG (Horgan et al. 2018), with TD3's twin critics, delayed policy updates and target
smoothing as options (``ddpg.*``): Gaussian-noise actors with an Ape-X spread of noise scales,
n-step transitions in replay.

- ``losses``: the pure math (critic targets, one update, initial priorities).
- ``zrl.algos.continuous``: the actor side and the learner side, shared with SAC.
"""

from zrl.algos.api import Algorithm

ALGORITHM = Algorithm.box_off_policy(
    "apex_ddpg",
    "Ape-X DDPG / TD3: Gaussian-noise actors, n-step replay, deterministic policy",
    model="zrl.continuous_models:ddpg_model_for",
    section="ddpg",
)
