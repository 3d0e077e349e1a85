"""The head's console and its records never contradict the roles (issue 40, item 3: a PPO run
showed ``steps 0 updates 0`` for 90 s while its learner made 400 updates, and its summary.json
said 0 env steps and 0 evaluations).

A real `zrl run configs/cartpole_ppo.yaml`: every status line it printed is a row of
progress.csv (the same records), progress.csv's last row and summary.json hold the roles' own
final counters (the sum of the actors' env steps and the learner's updates in the summary's
``heartbeats``), and summary.json counts the evaluations eval.csv holds."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from zrl.testing.processes import GUARD_S, run_zrl

STATUS_LINE = re.compile(r"^\[\s*\d+s\] steps ([\d,]+) \(.*?\) updates ([\d,]+) ", re.M)


@pytest.mark.slow
@pytest.mark.waits  # bounded by updates, so it may run beside a training (CI's other lane)
def test_the_console_progress_and_summary_agree_with_the_roles(tmp_path: Path) -> None:
    # No return bar (beats=None): what is checked is that the records agree. Bounded by
    # updates (a 25-s CI run made 520 to 800), so a loaded machine shows a training run too.
    summary = run_zrl(
        tmp_path,
        "cartpole_ppo.yaml",
        "stop.eval_return=null",
        "stop.updates=400",
        wall_time=GUARD_S,
        beats=None,
    )
    run_dir, text = summary["dir"], summary["output"]
    with open(run_dir / "progress.csv") as f:
        progress = [(int(r["env_steps"]), int(r["updates"])) for r in csv.DictReader(f)]
    shown = [
        (int(s.replace(",", "")), int(u.replace(",", ""))) for s, u in STATUS_LINE.findall(text)
    ]
    assert shown, text[-3000:]
    # What the console showed is what progress.csv recorded.
    assert set(shown) <= set(progress), (shown, progress)
    # The run trained, and the console saw it.
    assert summary["updates"] > 0 and summary["env_steps"] > 0, summary
    # A run that stepped says when it first did (from metrics or, on a busy bus, heartbeats).
    assert 0 < summary["seconds_to_first_env_step"] < summary["wall_time"], summary
    assert max(shown) > (0, 0), shown
    # summary.json and progress.csv end on the roles' own last counters.
    beats = summary["heartbeats"]
    actors = sum(v.get("env_steps", 0) for k, v in beats.items() if k.startswith("actor-"))
    updates = sum(v.get("updates", 0) for k, v in beats.items() if k.startswith("learner-"))
    assert (summary["env_steps"], summary["updates"]) == (actors, updates), beats
    assert progress[-1] == (actors, updates), progress[-3:]
    # Every evaluation the head took is in eval.csv. (The evaluator's own count may be one
    # short: its last result can go out after its last heartbeat.)
    with open(run_dir / "eval.csv") as f:
        recorded = list(csv.DictReader(f))
    assert summary["evaluations"] == len(recorded) > 0, summary
