"""SAC (Haarnoja et al. 2018) with twin critics and a learned temperature, distributed the
Ape-X way: actors sample the squashed-Gaussian policy, n-step transitions in replay.

- ``losses``: the pure math (soft targets, one update, the default target entropy).
- ``policy``: the actor side (``SACPolicy``: samples of the squashed-Gaussian policy).
- ``update``: the learner side (``SACLearnerUpdate``: the critics, the actor, the
  temperature).

The policy and the update are built on what SAC shares with Ape-X DDPG
(``zrl.algos.kernel.continuous``); the record on ``zrl.algos.kernel.records.box_off_policy``.
"""

from zrl.algos.api.algorithm import Pieces
from zrl.algos.kernel.records import box_off_policy
from zrl.algos.sac.config import KEY_ALIASES, SHARED_KEY_ALIASES, SACConfig


def pieces() -> Pieces:
    """The heavy pieces (torch), imported when a process first uses one."""
    from zrl.algos.sac.policy import SACPolicy
    from zrl.algos.sac.update import SACLearnerUpdate
    from zrl.nets.continuous import sac_model_for

    return Pieces(policy=SACPolicy, update=SACLearnerUpdate, model=sac_model_for)


ALGORITHM = box_off_policy(
    "sac",
    "SAC: squashed-Gaussian actors, n-step replay, twin critics, learned temperature",
    pieces=pieces,
    config={"sac": SACConfig},
    key_aliases=KEY_ALIASES,
    shared_key_aliases=SHARED_KEY_ALIASES,
)
