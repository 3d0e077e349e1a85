"""A learner of a group killed under ``zrl run``: two DD-PPO or APPO learners train CartPole
in one gloo group; one learner's process is killed with SIGKILL (learner 1, or learner 0,
whose store goes with it), the supervisor restarts it, it rejoins the group on a new
rendezvous generation (the other re-forms instead of stopping), and training goes on.

Only processes this test started (or their children) are ever signalled, always by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq

from zrl.testing.probes import wait_for
from zrl.testing.processes import (
    REPO,
    end_run,
    run_broker_address,
    status_rows,
    zrl_run_command,
)

LEARNERS = ("learner-0", "learner-1")


def info_of(rows: dict[str, dict[str, Any]], role: str) -> dict[str, Any]:
    """The heartbeat info of ``role`` while it is alive ({} otherwise)."""
    row = rows.get(role)
    if row is None or row["state"] != "alive":
        return {}
    info = row.get("info")
    return info if isinstance(info, dict) else {}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "victim"),
    [
        ("cartpole_ppo.yaml", "learner-1"),
        # A new store, found again through the broker. APPO with learner-1 killed takes the
        # path of DD-PPO's case (tests/algos/test_unrolls.py replaces an APPO rank 1).
        ("cartpole_appo.yaml", "learner-0"),
    ],
)
def test_a_killed_learner_rejoins_its_group_and_training_goes_on(
    tmp_path: Path, config: str, victim: str
) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "run.log"
    overrides = [
        "roles.learners=2",
        "stop.wall_time=900",
        "stop.eval_return=null",
        "learner.group_timeout_s=240",  # a restart on a loaded 2-core box takes a while
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            zrl_run_command(REPO / "configs" / config, run_dir, overrides),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
        )
    ctx = zmq.Context()
    addr = ""
    leftovers: list[psutil.Process] = []
    try:
        addr = run_broker_address(proc, run_dir, log, timeout=120)

        def training(base: int) -> bool:
            rows = status_rows(ctx, addr)
            updates = info_of(rows, "learner-0").get("updates")
            return (isinstance(updates, int) and updates > base) or proc.poll() is not None

        def formed() -> bool:
            rows = status_rows(ctx, addr)
            return all(info_of(rows, r).get("group_formed") for r in LEARNERS)

        wait_for(lambda: formed() or proc.poll() is not None, timeout=300, interval=0.25)
        wait_for(lambda: training(20), timeout=300, interval=0.25)
        assert proc.poll() is None, log.read_text()[-3000:]
        rows = status_rows(ctx, addr)
        assert all(info_of(rows, r)["group_generation"] == 1 for r in LEARNERS), rows
        old_pid = rows[victim]["pid"]
        assert old_pid in {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        os.kill(old_pid, signal.SIGKILL)

        def rejoined() -> bool:
            rows = status_rows(ctx, addr)
            new = rows.get(victim, {})
            infos = [info_of(rows, r) for r in LEARNERS]
            return (
                new.get("pid") not in (None, old_pid)
                and all(i.get("group_formed") and i.get("group_generation", 0) >= 2 for i in infos)
                and all(i.get("group_reforms", 0) >= 1 for i in infos)
            ) or proc.poll() is not None

        wait_for(rejoined, timeout=400, interval=0.25)
        assert proc.poll() is None, f"the run ended while {victim} was down: {log}"
        # Training goes on in the re-formed group: learner 0's updates grow past the rejoin.
        base = info_of(status_rows(ctx, addr), "learner-0")["updates"]
        wait_for(lambda: training(base + 20), timeout=300, interval=0.25)
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGINT)  # stop as Ctrl-C would
        proc.wait(timeout=120)
    finally:
        leftovers = end_run(proc, addr)
        ctx.destroy(linger=0)
    assert leftovers == [], [p.pid for p in leftovers]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == {victim: 1}, summary  # the other never stopped
    beats = summary["heartbeats"]
    leader, follower = beats["learner-0"], beats["learner-1"]
    # (Stopping may re-form once more: the learner that stops first fails the other's
    # collective before that one hears the stop.)
    assert leader["group_generation"] >= 2 and follower["group_generation"] >= 2, beats
    for rank, name in enumerate(LEARNERS):
        text = (run_dir / "logs" / f"{name}.log").read_text(errors="replace")
        formed = f"learner group of 2 formed (gloo, rank {rank}) on generation 2"
        assert formed in text, text[-3000:]
    follower_log = (run_dir / "logs" / "learner-1.log").read_text(errors="replace")
    assert "generation 2; rank 0's weights and optimizer taken" in follower_log
