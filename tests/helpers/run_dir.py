"""A supervisor whose roles never start, stopped by its rules, and the run directory it must
leave. Shared by ``tests/run/test_supervisor.py``, ``test_learning.py`` and
``tests/broker/test_broker.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from zrl.config.experiment import ExperimentConfig
from zrl.run.supervisor import Supervisor

RUN_FILES = ("config.yaml", "progress.csv", "eval.csv", "summary.json")


def stop_supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **stop: Any) -> Supervisor:
    cfg = ExperimentConfig.model_validate(
        {
            "name": "stop-test",
            "env": {"id": "CartPole-v1", "num_envs": 1},
            "model": {"hidden": [8]},
            "logging": {"backends": ["csv"]},
            "stop": {"eval_return": None, "wall_time": 60, **stop},
        }
    )
    sup = Supervisor(cfg, run_dir=tmp_path / "run", inproc=True, show_status=False)
    monkeypatch.setattr(sup.pool, "start_roles", lambda plan: None)
    return sup


def check_run_dir(sup: Supervisor, summary: dict[str, Any]) -> list[dict[str, float]]:
    """Every file there, summary.json the summary returned; progress.csv's rows."""
    from zrl.run.metrics import read_csv

    missing = [name for name in RUN_FILES if not (sup.run_dir / name).is_file()]
    assert not missing, f"{missing} missing after a stop ({summary['stop_reason']})"
    assert json.loads((sup.run_dir / "summary.json").read_text()) == summary
    rows = read_csv(sup.run_dir / "progress.csv")
    assert rows, "progress.csv has no row"
    assert rows[-1]["env_steps"] == summary["env_steps"]  # it ends where the summary does
    assert sup.pool.broker is not None and not sup.pool.broker.alive()  # and all stopped
    return rows


def eval_supervisor(tmp_path: Path, **stop: Any) -> Supervisor:
    """A head of a default config with ``stop`` (eval_return 475 unless given), not started,
    whose registry shows ``evaluator-0`` alive, and whose one-role query about the evaluator
    (what the head confirms an evaluation with) answers from those rows."""
    cfg = ExperimentConfig.model_validate({"stop": {"eval_return": 475, **stop}})
    sup = Supervisor(cfg, run_dir=tmp_path / "run", show_status=False)
    (tmp_path / "run").mkdir()
    sup.monitor.status_rows = [
        {"id": "evaluator-0", "role": "evaluator", "state": "alive", "info": {}}
    ]
    # The broker's answer to a STATUS about one role (the head confirms with it).
    rows = sup.monitor.status_rows
    sup.monitor.role_row = lambda rid: next((r for r in rows if r["id"] == rid), None)  # type: ignore[method-assign]
    return sup
