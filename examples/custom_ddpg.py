"""Your own Ape-X DDPG networks: a deterministic policy and twin critics on Pendulum.

    zrl run examples/custom_ddpg.py
    python examples/custom_ddpg.py              # the same

The learner accepts only a ``zrl.nets.continuous.DDPGModel``, so subclass it. Skip its
``__init__`` (which builds zrl's MLPs) and set what zrl uses:

- ``obs_dim``, ``act_dim``: ints, checked against every replay batch.
- ``policy``: ``policy(obs [B, obs_dim]) -> actions [B, act_dim]`` inside the bounds, with
  float32 buffers ``action_low`` / ``action_high`` ``[act_dim]`` (batch checks, TD3 smoothing).
- ``q1``, ``q2``: ``q(obs [B, obs_dim], actions [B, act_dim]) -> [B]``; ``q2 = None`` is
  plain DDPG, a second critic is TD3's clipped double-Q (the model decides, not ``ddpg.twin``).

Policy and critics must not share parameters: each has its own optimizer. ``act`` and
``q_values`` come from DDPGModel; exploration noise is added by the actors.
"""

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import zrl
from zrl.nets.continuous import DDPGModel


class TanhPolicy(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, 64),
            nn.ReLU(),
            nn.Linear(64, 64),
            nn.ReLU(),
            nn.Linear(64, act_dim),
            nn.Tanh(),
        )
        self.register_buffer("action_low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("action_high", torch.as_tensor(high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        y = self.net(obs.float())  # in [-1, 1]
        return self.action_low + (y + 1.0) * 0.5 * (self.action_high - self.action_low)


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


class MyDDPG(DDPGModel):
    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box, twin=True):
        nn.Module.__init__(self)  # not DDPGModel.__init__: the networks are ours
        self.obs_dim = int(np.prod(observation_space.shape))
        self.act_dim = int(action_space.shape[0])
        self.policy = TanhPolicy(self.obs_dim, self.act_dim, action_space.low, action_space.high)
        self.q1 = Critic(self.obs_dim, self.act_dim)
        self.q2 = Critic(self.obs_dim, self.act_dim) if twin else None


experiment = zrl.Experiment(
    "../configs/pendulum_apex_ddpg.yaml",
    model=MyDDPG,
    overrides=["name=custom_ddpg", "ddpg.twin=true"],  # twin=true only documents the run
)

if __name__ == "__main__":
    experiment.run()
