"""``SACPolicy``: the SAC actor on the kernel's
:class:`~zrl.algos.kernel.continuous.ContinuousPolicy` (warm-up, bounds, initial priorities,
shared with Ape-X DDPG): a sample of the squashed-Gaussian policy; it explores by the policy's
own entropy (``learner/entropy``, ``alpha``), with no noise of its own.
"""

from __future__ import annotations

import numpy as np
import torch

from zrl.algos.api.actor import ActorSetup
from zrl.algos.kernel.continuous import ContinuousPolicy
from zrl.algos.sac.config import SACConfig


class SACPolicy(ContinuousPolicy):
    """Samples of the squashed-Gaussian policy."""

    def __init__(self, setup: ActorSetup) -> None:
        warmup = setup.config.section(SACConfig).warmup_steps
        super().__init__(setup, warmup_steps=warmup)

    def explore(self, obs: np.ndarray, rows: slice) -> np.ndarray:
        return self.model.act(torch.from_numpy(obs), deterministic=False).numpy()  # type: ignore[no-any-return]
