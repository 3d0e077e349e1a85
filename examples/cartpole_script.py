"""An experiment script: the user's own env and model factories shipped to every role.

    zrl run examples/cartpole_script.py
    python examples/cartpole_script.py          # the same

Roles on other hosts need only zrl installed: the broker sends them this script's
factories (as cloudpickle bytes over CURVE-authenticated sockets).
"""

import gymnasium as gym
import torch
from torch import nn

import zrl


def make_env() -> gym.Env:
    # Any gymnasium env constructor works; wrappers included.
    return gym.wrappers.TimeAwareObservation(gym.make("CartPole-v1"), normalize_time=True)


class WideQNet(nn.Module):
    """A plain (non-dueling) Q-network: observation -> one value per action."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Discrete):
        super().__init__()
        obs_dim = int(observation_space.shape[0])
        self.net = nn.Sequential(
            nn.Linear(obs_dim, 128),
            nn.ReLU(),
            nn.Linear(128, 128),
            nn.ReLU(),
            nn.Linear(128, int(action_space.n)),
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float())


experiment = zrl.Experiment(
    "../configs/cartpole_apex_dqn.yaml",
    env=make_env,
    model=WideQNet,
    overrides=["name=cartpole_script", "env.vectorization=sync", "env.num_envs=8"],
)

if __name__ == "__main__":
    experiment.run()
