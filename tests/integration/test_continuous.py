"""Ape-X DDPG and SAC for real: `zrl run` on Pendulum-v1, every role its own process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zrl.testing.processes import REPO, kill_pids, zrl_processes

# A uniformly random policy scores about -1200 to -1500 on Pendulum-v1; an untrained
# deterministic one (torque ~0) about -1200. Both configs reach -200 in ~20 s unloaded.
BEATS_RANDOM = {"sac": -900.0, "apex_ddpg": -900.0}
CONFIGS = {"sac": "pendulum_sac.yaml", "apex_ddpg": "pendulum_apex_ddpg.yaml"}


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "apex_ddpg"])
def test_continuous_run_learns_and_cleans_up(algo: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "zrl", "run", str(REPO / "configs" / CONFIGS[algo]),
        "--run-dir", str(run_dir), "--set", "stop.wall_time=60",
        "--set", "stop.eval_window=1",  # one evaluation at the target will do: it is a smoke test
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        out, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            kill_pids([proc.pid])
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] in ("eval_return", "wall_time"), summary
    assert summary["evaluations"] >= 2, summary
    # Clearly beats a random policy: learning happened.
    assert summary["best_eval_return"] > BEATS_RANDOM[algo], (summary, text[-3000:])
    assert summary["updates"] > 500, summary
    logs = {p.name for p in (run_dir / "logs").iterdir()}
    assert {"actor-0.log", "replay-0.log", "learner-0.log", "evaluator-0.log"} <= logs
    # Nothing non-finite happened on the way.
    for name in ("actor-0.log", "learner-0.log"):
        log = (run_dir / "logs" / name).read_text()
        assert "non-finite" not in log and "Traceback" not in log, log[-3000:]

    # Every child is gone.
    broker = (run_dir / "broker_address").read_text().strip()
    time.sleep(0.5)
    left = zrl_processes(broker)
    assert not left, [p.cmdline() for p in left]

    # The saved policy plays with Box actions (greedy, clipped to the bounds).
    ev = subprocess.run(
        [sys.executable, "-m", "zrl", "eval", str(run_dir), "--episodes", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    mean = float(ev.stdout.strip().splitlines()[-1].split()[1])
    assert mean > BEATS_RANDOM[algo] - 300, ev.stdout
