"""`zrl run --resume`: a stopped run continues from its checkpoints.

The first run trains CartPole and checkpoints every few seconds (and on its way out). The
second run resumes the same run directory: the learner continues from its checkpoint
(updates, weights version), the replay shard from its snapshot (every item), and the run's
counters (env steps) from where the first run stopped.

Each run is stopped with Ctrl-C (SIGINT) as soon as it has done what the test needs (the
learner trained and checkpointed), not after a fixed wall time: on two shared cores the
roles' start-up alone varies from 5 to 20 s. The wall time is only a safety net.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import zmq

from zrl.replay.snapshot import load_state
from zrl.roles.errors import RoleError
from zrl.roles.registry_client import registry_request
from zrl.run.rundir import ACROSS_SEGMENTS
from zrl.testing.processes import REPO, kill_pids, note_run, run_keys, zrl_processes
from zrl.transport import protocol as P

CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"

Rows = dict[str, dict[str, Any]]


def info_sum(rows: Rows, prefix: str, key: str) -> int:
    return sum(
        int(r.get("info", {}).get(key, 0) or 0)
        for rid, r in rows.items()
        if rid.startswith(prefix) and r["state"] == "alive"
    )


def zrl_run_until(
    args: list[str], run_dir: Path, log: Path, done: Callable[[Rows], bool], timeout: float
) -> None:
    """One `zrl run`, stopped with SIGINT once ``done(status rows)``; killed by PID if it
    overruns or the test fails."""
    address = run_dir / "broker_address"
    address.unlink(missing_ok=True)  # the resumed run writes its own
    ctx = zmq.Context()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zrl", "run", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=log.parent,
        )
    interrupted = False
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if not address.exists():
                continue
            try:
                addr = note_run(address.read_text().strip(), run_dir)
                reply = registry_request(ctx, addr, P.Message(P.STATUS), 5.0, run_keys(addr))
            except RoleError:
                continue
            if done({r["id"]: r for r in reply.meta.get("roles", [])}):
                proc.send_signal(signal.SIGINT)
                interrupted = True
                break
        proc.wait(timeout=max(deadline - time.monotonic(), 60))
    finally:
        if proc.poll() is None:
            kill_pids([proc.pid], grace=15)
        ctx.destroy(linger=0)
    # Ctrl-C's exit code when our SIGINT stopped it, else its stop rule's.
    assert proc.returncode == (130 if interrupted else 0), log.read_text(errors="replace")[-3000:]


def assert_no_processes_left(run_dir: Path) -> None:
    broker = (run_dir / "broker_address").read_text().strip()
    deadline = time.monotonic() + 5
    while (left := zrl_processes(broker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    names = [p.cmdline() for p in left]
    for p in left:  # children of our run that outlived it: never leave them running
        p.kill()
    psutil.wait_procs(left, timeout=5)
    assert not names, names


@pytest.mark.slow
def test_resume_continues_learner_replay_and_counters(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints"

    def first_done(rows: Rows) -> bool:  # trained, and checkpointed at least once on a timer
        return info_sum(rows, "learner-", "updates") >= 200 and (ckpt / "learner-0.pt").exists()

    zrl_run_until(
        [
            str(CONFIG),
            "--run-dir",
            str(run_dir),
            "--set",
            "stop.wall_time=90",
            "--set",
            "checkpoint.interval=4",
            "--set",
            "stop.eval_return=null",
        ],
        run_dir,
        tmp_path / "first.log",
        first_done,
        timeout=120,
    )
    first = json.loads((run_dir / "summary.json").read_text())
    assert first["stop_reason"] == "interrupted" and first["error"] is None, first
    assert first["updates"] > 0 and first["env_steps"] > 0, first
    assert first["weights_version"] is not None and first["weights_version"] > 1, first
    assert "resumed_from" not in first["heartbeats"]["learner-0"], first["heartbeats"]
    assert "restored_items" not in first["heartbeats"]["replay-0"], first["heartbeats"]
    assert_no_processes_left(run_dir)

    # What the first run left behind: its last checkpoint and replay snapshot.
    learner_ckpt = torch.load(ckpt / "learner-0.pt", map_location="cpu", weights_only=True)
    saved_updates = int(learner_ckpt["updates"])
    saved_version = int(learner_ckpt["weights_version"])
    # The learner checkpoints on its way out, after the summary's last figures were taken.
    assert saved_updates >= first["updates"] > 0
    snapshot = load_state(ckpt / "replay-0.snapshot")  # numpy .npz, never a pickle
    table = snapshot["table"]
    snapshot_items = int(table["inserts"]) - int(table["first_key"])
    assert snapshot_items > 0 and snapshot_items == min(table["inserts"], snapshot["capacity"])
    assert snapshot["limiter"]["inserts"] == table["inserts"]
    assert not list(ckpt.glob("*.tmp")), "temporary checkpoint files left behind"

    # The resumed run: stopped once the learner trained well past its checkpoint and the
    # actors added env steps.
    def second_done(rows: Rows) -> bool:
        return (
            info_sum(rows, "learner-", "updates") > saved_updates + 300
            and info_sum(rows, "actor-", "env_steps") > 2000
        )

    zrl_run_until(
        ["--resume", str(run_dir), "--set", "stop.wall_time=90"],
        run_dir,
        tmp_path / "second.log",
        second_done,
        timeout=120,
    )
    second = json.loads((run_dir / "summary.json").read_text())
    assert second["stop_reason"] == "interrupted" and second["error"] is None, second
    # It keeps the first run's summary, as that run wrote it.
    earlier = {k: v for k, v in first.items() if k not in ACROSS_SEGMENTS}
    assert second["segment"] == 2 and second["segments"] == [earlier], second["segments"]
    assert second["total_wall_time"] == pytest.approx(first["wall_time"] + second["wall_time"])
    # progress.csv ended with the first run's figures at its stop: counted on from there.
    assert second["resumed_at_env_steps"] == first["env_steps"]

    # The learner resumed from its checkpoint, the shard from its snapshot (the ones above).
    learner, replay = second["heartbeats"]["learner-0"], second["heartbeats"]["replay-0"]
    assert learner["resumed_from"] == saved_updates, learner
    assert learner["resumed_version"] == saved_version, learner
    assert replay["restored_items"] == snapshot_items, replay

    # The run went on from there: more updates than the checkpoint, a newer version than the
    # first run ended with, more env steps (which count on from the first run's).
    assert second["updates"] > saved_updates >= first["updates"], (first, second)
    assert second["weights_version"] > max(saved_version, first["weights_version"]), (
        first,
        second,
    )
    assert second["env_steps"] > first["env_steps"], (first, second)
    progress = (run_dir / "progress.csv").read_text().splitlines()
    steps = [int(line.split(",")[1]) for line in progress[1:] if line and line[0].isdigit()]
    assert steps == sorted(steps), "env steps went backwards across the resume"
    learner_ckpt = torch.load(ckpt / "learner-0.pt", map_location="cpu", weights_only=True)
    assert int(learner_ckpt["updates"]) >= second["updates"]
    assert_no_processes_left(run_dir)
