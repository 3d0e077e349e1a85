"""The replay shard's experience layout of teams (``Wiring.team``, QMIX): one row per game."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from zrl.envs.multiagent.spaces import AgentObservationSpace
from zrl.replay.layout import experience_layout
from zrl.transport import messages as M
from zrl.transport import protocol as P

SLOT = AgentObservationSpace((4,), 0, 6)  # 10 floats a slot


def team_layout(num_envs: int = 6, team: int = 3):
    return experience_layout(
        "transitions",
        actions="discrete",
        observation_space=SLOT,
        action_space=gym.spaces.Discrete(5),
        num_envs=num_envs,
        trajectory_length=4,
        team=team,
    )


def test_team_layout_sizes_from_the_spaces():
    layout = team_layout()
    assert layout.schema is M.TRANSITIONS
    assert layout.sizes == {"O": (30,), "E": 2, "T": 4}
    assert layout.num_actions == 5**3
    example = layout.example()
    assert example.arrays["obs"].shape == (2, 4, 30)
    assert layout.check(example) == {"E": 2, "T": 4, "O": (30,)}


def test_team_layout_refuses_slot_rows_and_joint_actions_out_of_range():
    layout = team_layout()
    per_slot = experience_layout(
        "transitions",
        actions="discrete",
        observation_space=SLOT,
        action_space=gym.spaces.Discrete(5),
        num_envs=6,
        trajectory_length=4,
    )
    with pytest.raises(P.ProtocolError):
        layout.check(per_slot.example())  # a slot's width and rows, not a team's
    msg = layout.example()
    msg.arrays["action"][0, 0] = 5**3
    with pytest.raises(P.ProtocolError, match=r"outside \[0, 125\)"):
        layout.check(msg)


def test_team_layout_needs_whole_games_of_flat_transitions():
    with pytest.raises(ValueError, match="not whole games of 4 agents"):
        team_layout(num_envs=6, team=4)
    with pytest.raises(ValueError, match="team layouts"):
        experience_layout(
            "unroll",
            actions="discrete",
            observation_space=SLOT,
            action_space=gym.spaces.Discrete(5),
            num_envs=6,
            trajectory_length=4,
            team=3,
        )
    assert np.dtype(team_layout().obs_dtype) == np.float32
