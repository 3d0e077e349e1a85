"""The whole system for real: `zrl run` on CartPole with every role as its own process."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from zrl.roles.evaluation import SOURCES
from zrl.testing.processes import (
    GUARD_S,
    RANDOM_POLICY_RETURN,
    REPO,
    kill_pids,
    run_zrl,
    tensorboard_tags,
    zrl_processes,
)


@pytest.mark.slow
def test_apex_dqn_run_learns_and_cleans_up(tmp_path: Path) -> None:
    # Exits 0, learns, leaves nothing. 150, not the config's 475: the time to 475 varies from
    # 10 s to a minute with the seed's luck, and CI time is short (benchmarks/ time to 475).
    # Bounded by learner updates (quiet, 150 came after 2,531 updates and 12,000 env steps):
    # on a busy machine the actors outrun a starved learner, so env steps are no measure of
    # its progress there; the wall time is a guard.
    # The head's own imports on its output: the roles fork from the zygote, which logs its own.
    summary = run_zrl(
        tmp_path,
        "cartpole_apex_dqn.yaml",
        "stop.eval_return=150",
        "stop.updates=5000",
        wall_time=400,
        env={"PYTHONPROFILEIMPORTTIME": "1"},
    )
    run_dir = summary["dir"]
    # The head never imports torch (a child of the zygote writes the model files).
    imported = [line.rsplit("|", 1)[-1].strip() for line in summary["output"].splitlines()]
    assert "zrl.run.supervisor" in imported and "torch" not in imported
    assert "model.pt: " in (run_dir / "logs" / "models.log").read_text()
    assert summary["stop_reason"] in ("eval_return", "updates"), summary
    assert summary["evaluations"] >= 3, summary
    assert summary["env_steps"] > 2_000
    assert summary["updates"] > 200

    # The run directory a user is promised.
    for name in (
        "config.yaml",
        "seeds.json",
        "progress.csv",
        "eval.csv",
        "model.pt",
        "learning_curve.png",
        "broker_address",
    ):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tensorboard").iterdir()), "no TensorBoard event file"
    # The learner's training figures reach TensorBoard and train_metrics.csv, the policy lag
    # of its replay items among them.
    learner_tags = {
        "learner/loss",
        "learner/td_error",
        "learner/policy_lag",
        "learner/policy_lag_max",
    }
    # ... and the rest of what docs/running.md's table lists for Ape-X DQN, in TensorBoard.
    apex_tags = {
        "learner/grad_norm",
        "learner/update_ms",
        "learner/lr",
        "learner/td_error_max",
        "learner/q_mean",
        "actor/episode_return",
        "actor/episode_length",
        "actor/epsilon_min",
        "actor/epsilon_max",
        "eval/return_mean",
        "progress/env_steps_per_s",
    }
    with open(run_dir / "train_metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert learner_tags <= {r["tag"] for r in rows}, sorted({r["tag"] for r in rows})
    lags = [float(r["value"]) for r in rows if r["tag"] == "learner/policy_lag"]
    assert all(lag >= 0 for lag in lags) and max(lags) > 0, lags
    tb = tensorboard_tags(run_dir)
    assert learner_tags | apex_tags <= tb, sorted(learner_tags | apex_tags - tb)
    logs = {p.name for p in (run_dir / "logs").iterdir()}
    assert {
        "broker.log",
        "actor-0.log",
        "actor-1.log",
        "replay-0.log",
        "params-0.log",
        "learner-0.log",
        "evaluator-0.log",
    } <= logs
    seeds = json.loads((run_dir / "seeds.json").read_text())
    assert seeds["actors"]["actor-0"] != seeds["actors"]["actor-1"]

    # The saved policy plays as well as the evaluator said, give or take evaluation noise.
    ev = subprocess.run(
        [sys.executable, "-m", "zrl", "eval", str(run_dir), "--episodes", "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ev.returncode == 0, ev.stderr
    assert "mean" in ev.stdout
    # model.pt is the weights that met the stop rule (else the best evaluated), and says so.
    which = "confirmed" if summary["reached_target"] else "best"
    assert summary["model_source"] == which, summary["model_note"]
    first = ev.stdout.splitlines()[0]
    assert first.startswith(f"model.pt: {SOURCES[which]}, weights v"), ev.stdout
    mean = float(ev.stdout.strip().splitlines()[-1].split()[1])
    assert mean > 2 * RANDOM_POLICY_RETURN, ev.stdout


@pytest.mark.waits  # every role in one process trains on one core (the GIL)
@pytest.mark.slow
def test_inproc_mode_runs_every_role_in_one_process(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "zrl",
        "run",
        str(REPO / "configs" / "cartpole_apex_dqn.yaml"),
        "--inproc",
        "--run-dir",
        str(run_dir),
        "--set",
        "evaluator.interval=3",
        # The second evaluation ends it (any return meets -1; the evaluator plays only a new
        # weights version, so the learner has trained by then): on a loaded machine one
        # process with every role can take long to get there, so no short wall time.
        "--set",
        "stop.eval_return=-1",
        "--set",
        "stop.eval_window=2",
        "--set",
        f"stop.wall_time={GUARD_S}",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        out, _ = proc.communicate(timeout=GUARD_S + 90)
    finally:
        if proc.poll() is None:
            kill_pids([proc.pid])
    assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["evaluations"] >= 1, summary
    assert summary["updates"] > 0, summary
    assert (run_dir / "logs" / "inproc.log").is_file()
    # One process: no `zrl start` children were spawned.
    assert not zrl_processes(str(run_dir))
