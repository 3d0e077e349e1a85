"""IMPALA, A3C and PPO for real: `zrl run` on CartPole with every role its own process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, kill_pids
from tests.integration.test_apex_cartpole import RANDOM_POLICY_RETURN, zrl_processes


def run_zrl(tmp_path: Path, config: str, *overrides: str, wall_time: int = 60) -> dict:
    """`zrl run` to 475 or ``wall_time``; returns the summary, with the run dir under "dir"."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "zrl", "run", str(REPO / "configs" / config),
           "--run-dir", str(run_dir), "--set", f"stop.wall_time={wall_time}"]  # fmt: skip
    for item in overrides:
        cmd += ["--set", item]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        out, _ = proc.communicate(timeout=wall_time + 90)
    finally:
        if proc.poll() is None:
            kill_pids([proc.pid])
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    # Clearly beats a random policy (about 22): learning happened.
    assert summary["best_eval_return"] > 5 * RANDOM_POLICY_RETURN, (summary, text[-3000:])
    broker = (run_dir / "broker_address").read_text().strip()
    time.sleep(0.5)
    left = zrl_processes(broker)
    assert not left, [p.cmdline() for p in left]
    summary["dir"] = run_dir
    return summary


@pytest.mark.slow
def test_ppo_sync_rounds_never_mix_versions(tmp_path: Path) -> None:
    summary = run_zrl(tmp_path, "cartpole_ppo.yaml")
    log = (summary["dir"] / "logs" / "learner-0.log").read_text()
    closing = [line for line in log.splitlines() if "mixed-version rounds" in line]
    assert closing, log[-2000:]
    assert "(sync)" in closing[-1]
    assert "mixed-version rounds 0," in closing[-1], closing[-1]
    rounds = int(re.search(r": (\d+) rounds", closing[-1]).group(1))  # type: ignore[union-attr]
    assert rounds >= 10, closing[-1]


@pytest.mark.slow
def test_ppo_async_and_dd_ppo_learners_stay_in_lockstep(tmp_path: Path) -> None:
    summary = run_zrl(
        tmp_path, "cartpole_ppo.yaml", "ppo.mode=async", "roles.learners=2", wall_time=45
    )
    logs = summary["dir"] / "logs"
    leader = [ln for ln in (logs / "learner-0.log").read_text().splitlines() if "rounds (" in ln]
    follower = [ln for ln in (logs / "learner-1.log").read_text().splitlines() if "rounds (" in ln]
    assert leader and follower
    assert "(async)" in leader[-1] and "allreduce timeouts 0" in leader[-1], leader[-1]
    # Averaged gradients applied by both: the follower's weights equal the leader's.
    assert "weight drift 0," in follower[-1], follower[-1]


@pytest.mark.slow
def test_impala_learns_through_the_fifo_queue(tmp_path: Path) -> None:
    summary = run_zrl(tmp_path, "cartpole_impala.yaml")
    log = (summary["dir"] / "logs" / "learner-0.log").read_text()
    closing = [line for line in log.splitlines() if "stale unrolls dropped" in line]
    assert closing, log[-2000:]
    assert summary["updates"] > 50, summary


@pytest.mark.slow
def test_a3c_workers_gradients_applied_by_params(tmp_path: Path) -> None:
    summary = run_zrl(tmp_path, "cartpole_a3c.yaml", wall_time=60)
    log = (summary["dir"] / "logs" / "params-0.log").read_text()
    closing = [line for line in log.splitlines() if "gradients," in line and "updates from" in line]
    assert closing, log[-2000:]
    updates = int(re.search(r": (\d+) updates", closing[-1]).group(1))  # type: ignore[union-attr]
    assert updates > 100, closing[-1]
