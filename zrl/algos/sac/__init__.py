"""SAC (Haarnoja et al. 2018) with twin critics and a learned temperature, distributed the
Ape-X way: actors sample the squashed-Gaussian policy, n-step transitions in replay.

- ``losses``: the pure math (soft targets, one update, the default target entropy).
- ``policy``: the actor side (``SACPolicy``: samples of the squashed-Gaussian policy).
- ``update``: the learner side (``SACLearnerUpdate``: the critics, the actor, the
  temperature).

The policy and the update are built on what SAC shares with Ape-X DDPG
(``zrl.algos.kernel.continuous``); the record on ``zrl.algos.kernel.records.box_off_policy``.
"""

from zrl.algos.kernel.records import box_off_policy
from zrl.algos.sac.config import SACConfig

ALGORITHM = box_off_policy(
    "sac",
    "SAC: squashed-Gaussian actors, n-step replay, twin critics, learned temperature",
    policy="zrl.algos.sac.policy:SACPolicy",
    update="zrl.algos.sac.update:SACLearnerUpdate",
    model="zrl.nets.continuous:sac_model_for",
    config={"sac": SACConfig},
)
