"""``ApexDDPGPolicy``: the Ape-X DDPG actor on the kernel's
:class:`~zrl.algos.kernel.continuous.ContinuousPolicy` (warm-up, bounds, initial priorities,
shared with SAC): the deterministic policy's action plus Gaussian noise, its scale a fraction
of the action half-range spread over the env slots the Ape-X way
(``noise_sigma ** (1 + noise_alpha * k / (N - 1))``,
:func:`zrl.algos.kernel.exploration.apex_epsilons`).
"""

from __future__ import annotations

import numpy as np
import torch

from zrl.algos.apex_ddpg.config import DDPGConfig
from zrl.algos.api.actor import ActorSetup
from zrl.algos.kernel.continuous import ContinuousPolicy
from zrl.algos.kernel.exploration import apex_epsilons


class ApexDDPGPolicy(ContinuousPolicy):
    """Gaussian noise around the deterministic policy, a scale per env slot."""

    def __init__(self, setup: ActorSetup) -> None:
        warmup = setup.config.section(DDPGConfig).warmup_steps
        super().__init__(setup, warmup_steps=warmup)

    def noise_sigmas(self, setup: ActorSetup) -> np.ndarray:
        cfg = setup.config
        d = cfg.section(DDPGConfig)
        slots = max(cfg.roles.count("actors"), setup.actor_index + 1) * setup.num_envs
        all_sigmas = apex_epsilons(slots, d.noise_sigma, d.noise_alpha)
        first = setup.actor_index * setup.num_envs
        return all_sigmas[first : first + setup.num_envs].astype(np.float32)

    def explore(self, obs: np.ndarray, rows: slice) -> np.ndarray:
        mu = self.model.act(torch.from_numpy(obs)).numpy()
        noise = self.rng.standard_normal(mu.shape).astype(np.float32)
        return mu + noise * self.sigmas[rows, None] * self.half_range  # type: ignore[no-any-return]

    def train_info(self) -> dict[str, float]:
        """The Gaussian noise scale (fraction of the half-range) of this actor's env slots,
        and whether it is still warming up."""
        out: dict[str, float] = {}
        if len(self.sigmas):
            out = {
                "noise_sigma_min": float(self.sigmas.min()),
                "noise_sigma_max": float(self.sigmas.max()),
            }
        return {**out, **super().train_info()}
