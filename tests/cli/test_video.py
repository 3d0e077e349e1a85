"""``zrl eval --video DIR``: a run's saved policy plays greedy episodes that gymnasium's
RecordVideo writes as mp4 files, one per episode; envs that cannot be recorded are refused
with a message naming why."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from typer.testing import CliRunner

from zrl.algos.models import build_model
from zrl.cli.main import app
from zrl.config.experiment import ExperimentConfig


def saved_run(tmp_path: Path, env_id: str, **env: object) -> Path:
    """A run directory holding only what ``zrl run`` leaves for ``zrl eval``: model.pt with
    an untrained PPO model's weights and the config."""
    cfg = ExperimentConfig.model_validate(
        {
            "name": "video-test",
            "algo": "ppo",
            "env": {"id": env_id, **env},
            "roles": {"replay": 0},
        }
    )
    probe = gym.make(env_id)
    model = build_model(probe.observation_space, probe.action_space, cfg.model, cfg.algo)
    probe.close()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    torch.save(
        {
            "weights": dict(model.state_dict()),
            "version": 1,
            "config": json.dumps(cfg.model_dump(mode="json")),
            "factory_refs": {},
        },
        run_dir / "model.pt",
    )
    return run_dir


def test_eval_records_one_video_per_episode(tmp_path: Path) -> None:
    run_dir = saved_run(tmp_path, "CartPole-v1")
    videos = tmp_path / "videos"
    result = CliRunner().invoke(
        app, ["eval", str(run_dir), "-n", "2", "--video", str(videos)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    files = sorted(videos.glob("*.mp4"))
    assert [f.name for f in files] == ["video-test-0-episode-0.mp4", "video-test-1-episode-0.mp4"]
    assert all(f.stat().st_size > 1000 for f in files)
    assert "videos: 2 mp4 files" in result.output
    assert result.output.strip().splitlines()[-1].startswith("mean ")


def test_multiagent_envs_are_refused_with_a_reason(tmp_path: Path) -> None:
    cfg = ExperimentConfig.model_validate(
        {
            "name": "video-test",
            "algo": "ppo",
            "env": {"id": "pettingzoo/tictactoe_v3"},
            "roles": {"replay": 0},
        }
    )
    from zrl.roles.evaluation import video_envs

    with pytest.raises(ValueError, match="multi-agent"):
        video_envs(cfg, None, tmp_path, 1)
