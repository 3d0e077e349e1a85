"""R2D2 for real: `zrl run` of configs/cartpole_novel_r2d2.yaml, every role its own process, on
CartPole without velocities, where a feed-forward policy stays below about 50
(benchmarks/recurrent.py): reaching 200 needs the recurrent state carried by the actors, stored
with the sequences and replayed by the learner. The saved model plays through `zrl eval`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from zrl.testing.processes import run_zrl


@pytest.mark.slow
def test_r2d2_learns_what_it_cannot_see(tmp_path: Path) -> None:
    summary = run_zrl(
        tmp_path, "cartpole_novel_r2d2.yaml", "stop.eval_return=200", wall_time=100, beats=150
    )  # exits 0, learns, leaves nothing
    assert summary["stop_reason"] == "eval_return", summary
    experience = summary["experience"]
    assert experience["trajectories_lost"] == 0, experience

    ev = subprocess.run(
        [sys.executable, "-m", "zrl", "eval", str(summary["dir"]), "--episodes", "5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    mean = float(ev.stdout.strip().splitlines()[-1].split()[1])
    assert mean > 100, ev.stdout
