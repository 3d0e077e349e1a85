"""Your own SAC networks: a squashed-Gaussian policy and twin critics on Pendulum.

    zrl run examples/custom_sac.py
    python examples/custom_sac.py               # the same

The learner accepts only a ``zrl.nets.continuous.SACModel``, so subclass it. Skip its
``__init__`` (which builds zrl's MLPs) and set what zrl uses:

- ``obs_dim``, ``act_dim``: ints, checked against every replay batch.
- ``policy``: ``policy(obs, deterministic=False, with_logp=True) -> (actions [B, act_dim],
  logp [B] or None)``: reparameterised samples inside the bounds and their log-density
  (``deterministic``: the mean action; ``with_logp=False`` may return None), with float32
  buffers ``action_low`` / ``action_high`` ``[act_dim]``.
- ``q1``, ``q2``: ``q(obs [B, obs_dim], actions [B, act_dim]) -> [B]``, both required.

Policy and critics must not share parameters: each has its own optimizer. ``act``,
``sample`` and ``q_values`` come from SACModel.
"""

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import zrl
from zrl.nets.continuous import SACModel, squashed_gaussian_logp


class GaussianPolicy(nn.Module):
    """``a = bias + scale * tanh(u)``, ``u ~ N(mu(s), exp(log_std(s))^2)``."""

    def __init__(self, obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray):
        super().__init__()
        self.torso = nn.Sequential(nn.Linear(obs_dim, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.mu = nn.Linear(64, act_dim)
        self.log_std = nn.Linear(64, act_dim)
        self.register_buffer("action_low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("action_high", torch.as_tensor(high, dtype=torch.float32))

    def forward(
        self, obs: torch.Tensor, deterministic: bool = False, with_logp: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self.torso(obs.float())
        mu, log_std = self.mu(x), self.log_std(x).clamp(-5.0, 2.0)
        u = mu if deterministic else mu + log_std.exp() * torch.randn_like(mu)
        scale = (self.action_high - self.action_low) / 2
        actions = self.action_low + scale * (torch.tanh(u) + 1.0)
        actions = torch.minimum(torch.maximum(actions, self.action_low), self.action_high)
        logp = squashed_gaussian_logp(u, mu, log_std, scale) if with_logp else None
        return actions, logp


class Critic(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim + act_dim, 64),
            nn.ReLU(),
            nn.Linear(64, 64),
            nn.ReLU(),
            nn.Linear(64, 1),
        )

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs.float(), actions.float()], dim=1))[:, 0]


class MySAC(SACModel):
    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box):
        nn.Module.__init__(self)  # not SACModel.__init__: the networks are ours
        self.obs_dim = int(np.prod(observation_space.shape))
        self.act_dim = int(action_space.shape[0])
        self.policy = GaussianPolicy(
            self.obs_dim, self.act_dim, action_space.low, action_space.high
        )
        self.q1 = Critic(self.obs_dim, self.act_dim)
        self.q2 = Critic(self.obs_dim, self.act_dim)


experiment = zrl.Experiment(
    "../configs/pendulum_sac.yaml",
    model=MySAC,
    overrides=["name=custom_sac"],
)

if __name__ == "__main__":
    experiment.run()
