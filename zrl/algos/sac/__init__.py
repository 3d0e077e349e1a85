"""SAC (Haarnoja et al. 2018) with twin critics and a learned temperature, distributed the
Ape-X way: actors sample the squashed-Gaussian policy, n-step transitions in replay.

- ``losses``: the pure math (soft targets, one update, the default target entropy).
- ``zrl.algos.continuous``: the actor side and the learner side, shared with Ape-X DDPG.
"""

from zrl.algos.api.algorithm import Algorithm
from zrl.algos.sac.config import SACConfig

ALGORITHM = Algorithm.box_off_policy(
    "sac",
    "SAC: squashed-Gaussian actors, n-step replay, twin critics, learned temperature",
    model="zrl.nets.continuous:sac_model_for",
    config={"sac": SACConfig},
)
