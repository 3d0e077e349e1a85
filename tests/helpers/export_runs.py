"""Run directories for ``zrl export``'s tests: a config and one saved weights file, as
``zrl run`` leaves them for ``zrl eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import Factories
from zrl.nets.wire import model_to_arrays
from zrl.roles.evaluated_weights import Evaluated
from zrl.run.rundir import RunDir
from zrl.testing.fakes import config_model

RUNS = {
    "apex_dqn": {"model": {"hidden": [16]}},
    "ppo_lstm": {
        "algo": "ppo",
        "roles": {"replay": 0},
        "model": {"hidden": [16], "core": "lstm", "core_size": 8},
    },
    "sac": {"algo": "sac", "env": {"id": "Pendulum-v1"}, "model": {"hidden": [16]}},
}


def write_run(run_dir: Path, overrides: dict[str, Any], name: str = "model.pt") -> Any:
    """A run directory as ``zrl run`` leaves it for ``zrl eval``: ``name`` holding the weights
    of ``cfg``'s model (freshly initialised, seed 0) with the config; the model."""
    cfg = ExperimentConfig.model_validate({"name": "export-test", **overrides})
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = config_model(cfg).eval()
    RunDir(run_dir, cfg, Factories()).write_model(
        name, Evaluated(3, model_to_arrays(model), 10.0), "confirmed"
    )
    return model
