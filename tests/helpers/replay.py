"""The replay server's test config (CartPole, 2 envs, 5-step trajectories, 3-step returns). Shared
by ``tests/roles/test_replay.py`` and ``tests/transport/test_gaps.py``."""

from __future__ import annotations

from typing import Any

from zrl.config.experiment import ExperimentConfig


def replay_config(**replay: Any) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "replay-test",
            "seed": 3,
            "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0},
            # The layout of ``trajectory()``: 2 CartPole envs, 5 steps.
            "env": {"id": "CartPole-v1", "num_envs": 2},
            "actor": {"trajectory_length": 5},
            "replay": {
                "capacity": 500,
                "min_size": 50,
                "batch_size": 16,
                "samples_per_insert": 4,
                "samples_per_insert_tolerance": 64,
                "n_step": 3,
                "gamma": 0.9,
                **replay,
            },
        }
    )
