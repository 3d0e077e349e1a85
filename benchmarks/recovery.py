"""Recovery benchmark: how long a `zrl run` takes to serve again after a role is killed, and
what checkpointing costs in throughput.

(1) Recovery. One `zrl run` of ``configs/cartpole_apex_dqn.yaml`` (checkpoints every 3 s, no
    eval target). Once it learns, each role in turn (actor, replay, params, learner,
    evaluator, then the broker) is killed with SIGKILL, and the time from the kill is measured
    until:

    - alive: the role is ``alive`` in the broker's status again, with a new pid (the broker:
      the registry answers from a new pid and every role is alive again);
    - serving: it does its job again: actor sends experience, replay sends batches, params
      holds weights to serve, learner's update count grows, evaluator publishes an
      evaluation, broker: every role registered again;
    - pipeline: the whole run moves (again): the learner's update count grows by 20 (one
      weights publish) and the replay inserts new trajectories, counted from the first status
      after the kill in which both report (a kill that does not stop the pipeline shows
      about the polling interval here).

    The supervisor's restart back-off (1 s for a role's first restart) is part of every figure.
(2) Checkpoint cost. Two consecutive `zrl run`s of the same config and length with
    ``stop.eval_return=null``: ``checkpoint.interval=2`` (learner checkpoint and replay
    snapshot every 2 s) against ``checkpoint.interval=1e6`` (effectively never, only at the
    end). Env steps/s and learner updates/s come from each run's ``progress.csv``, over the
    last half of each run (after the learner's first update).

Everything started here is stopped by PID, also on Ctrl-C or an error. Run from the repo root::

    python benchmarks/recovery.py                   # both parts, about 5 minutes
    python benchmarks/recovery.py --skip-checkpoint-cost --roles actor,replay
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import zmq

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
ROLE_IDS = ("actor-0", "actor-1", "replay-0", "params-0", "learner-0", "evaluator-0")
VICTIMS = {
    "actor": "actor-0",
    "replay": "replay-0",
    "params": "params-0",
    "learner": "learner-0",
    "evaluator": "evaluator-0",
    "broker": "broker",
}
POLL_S = 0.2
RECOVERY_TIMEOUT_S = 60.0


# --- a `zrl run` we own -----------------------------------------------------------------


class Run:
    """One `zrl run` subprocess, its run directory and a status client; stopped by PID."""

    def __init__(self, run_dir: Path, overrides: list[str]) -> None:
        self.run_dir = run_dir
        self.log = open(run_dir.parent / f"{run_dir.name}.log", "wb")  # noqa: SIM115
        cmd = [sys.executable, "-m", "zrl", "run", str(CONFIG), "--run-dir", str(run_dir)]
        for item in overrides:
            cmd += ["--set", item]
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO
        )
        self.ctx = zmq.Context()
        self.addr = ""

    def wait_address(self, timeout: float = 60.0) -> str:
        path = self.run_dir / "broker_address"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"zrl run did not start: see {self.log.name}")
            time.sleep(0.1)
        self.addr = path.read_text().strip()
        return self.addr

    def status(self, timeout: float = 1.0) -> dict[str, Any] | None:
        from zrl.roles.errors import RoleError
        from zrl.roles.registry_client import registry_request
        from zrl.transport import protocol as P

        try:
            return registry_request(self.ctx, self.addr, P.Message(P.STATUS), timeout).meta
        except RoleError:
            return None

    def rows(self) -> dict[str, dict[str, Any]]:
        st = self.status()
        return {r["id"]: r for r in st.get("roles", [])} if st else {}

    def descendants(self) -> set[int]:
        try:
            return {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Ctrl-C, as a user would; then SIGKILL whatever is left of it, by PID."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            left = [p for p in psutil.process_iter(["cmdline"]) if self._ours(p)]
            for p in left:
                p.kill()
            psutil.wait_procs(left, timeout=5)
        finally:
            self.ctx.destroy(linger=0)
            self.log.close()

    def _ours(self, p: psutil.Process) -> bool:
        try:
            return bool(self.addr) and any(self.addr in a for a in p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False


def info(rows: dict[str, dict[str, Any]], rid: str, key: str) -> int | None:
    row = rows.get(rid)
    if row is None or row["state"] != "alive":
        return None
    value = row.get("info", {}).get(key)
    return value if isinstance(value, int) else None


def wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(POLL_S)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


# --- (1) recovery -------------------------------------------------------------------------


@dataclass
class Recovery:
    role: str
    alive_s: float | None = None
    serving_s: float | None = None
    pipeline_s: float | None = None
    notes: list[str] = field(default_factory=list)


def serving(role: str, rows: dict[str, dict[str, Any]], base: dict[str, int]) -> bool:
    """Whether the restarted ``role`` does its job again (see the module docstring)."""
    rid = VICTIMS[role]
    if role == "actor":
        row = rows.get(rid, {})
        return (
            row.get("state") == "alive" and row["streams"].get("experience", {}).get("sent", 0) > 0
        )
    if role == "replay":
        return (info(rows, rid, "batches") or 0) > 0
    if role == "params":
        return (info(rows, rid, "weights_version") or 0) > 0
    if role == "learner":
        u = info(rows, rid, "updates")
        if u is None:
            return False
        base.setdefault("resumed", u)
        return u > base["resumed"]
    if role == "evaluator":
        return (info(rows, rid, "evaluations") or 0) > 0
    return all(rows.get(i, {}).get("state") == "alive" for i in ROLE_IDS)


def measure(run: Run, role: str) -> Recovery:
    rec = Recovery(role)
    rid = VICTIMS[role]
    st = run.status(2.0)
    assert st is not None, "the broker does not answer"
    rows = {r["id"]: r for r in st["roles"]}
    old_pid = st["broker"]["pid"] if role == "broker" else rows[rid]["pid"]
    if old_pid not in run.descendants():
        raise RuntimeError(f"pid {old_pid} of {rid} is not a process of our run")
    os.kill(old_pid, signal.SIGKILL)
    t0 = time.monotonic()
    base: dict[str, int] = {}
    first_updates: int | None = None
    first_traj: int | None = None
    while time.monotonic() - t0 < RECOVERY_TIMEOUT_S and run.alive():
        time.sleep(POLL_S)
        now = time.monotonic() - t0
        st = run.status(1.0)
        if st is None:
            continue
        rows = {r["id"]: r for r in st["roles"]}
        if rec.alive_s is None:
            if role == "broker":
                back = st["broker"]["pid"] != old_pid
            else:
                back = rows.get(rid, {}).get("state") == "alive" and rows[rid]["pid"] != old_pid
            if back:
                rec.alive_s = now
        if rec.alive_s is not None and rec.serving_s is None and serving(role, rows, base):
            rec.serving_s = now
        updates = info(rows, "learner-0", "updates")
        traj = info(rows, "replay-0", "trajectories")
        if first_updates is None and updates is not None:
            first_updates = updates
        if first_traj is None and traj is not None:
            first_traj = traj
        moving = (
            updates is not None
            and first_updates is not None
            and updates >= first_updates + 20
            and traj is not None
            and first_traj is not None
            and traj > first_traj
        )
        if moving and rec.pipeline_s is None:
            rec.pipeline_s = now
        if rec.serving_s is not None and rec.pipeline_s is not None:
            break
    if not run.alive():
        rec.notes.append("the run ended")
    if rec.pipeline_s is None:
        rec.notes.append(f"pipeline not moving after {RECOVERY_TIMEOUT_S:g}s")
    return rec


def actor_log_notes(run_dir: Path) -> list[str]:
    notes = []
    for name in ("actor-0", "actor-1"):
        path = run_dir / "logs" / f"{name}.log"
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                if "no insert ack" in line or "counted as lost" in line:
                    notes.append(f"{name}: {line.split(': ', 1)[-1]}")
    return notes


def recovery_part(work: Path, roles: list[str]) -> None:
    from zrl.run import children

    print("== recovery after kill -9 under `zrl run` ==")
    print(
        f"supervisor restart back-off: roles {children.RESTART_BACKOFF_S[0]:g} s for the first "
        f"restart (then {', '.join(f'{s:g}' for s in children.RESTART_BACKOFF_S[1:])} s), "
        f"budget {children.RESTART_BUDGET}"
    )
    run = Run(
        work / "recovery", ["stop.wall_time=900", "stop.eval_return=null", "checkpoint.interval=3"]
    )
    results: list[Recovery] = []
    t_start = time.monotonic()
    try:
        run.wait_address()
        wait(
            lambda: all(
                r.get("state") == "alive" for r in [run.rows().get(i, {}) for i in ROLE_IDS]
            ),
            90,
            "every role alive",
        )
        print(f"every role alive {time.monotonic() - t_start:.1f} s after `zrl run` started")
        wait(lambda: (info(run.rows(), "learner-0", "updates") or 0) > 200, 90, "learning")
        for role in roles:
            if not run.alive():
                break
            # Settle: the pipeline moves before each kill.
            u0 = info(run.rows(), "learner-0", "updates") or 0
            wait(
                lambda u0=u0: (info(run.rows(), "learner-0", "updates") or 0) > u0 + 50,
                90,
                f"learning before killing {role}",
            )
            rec = measure(run, role)
            results.append(rec)
            print(
                f"  {role:<10} alive {fmt(rec.alive_s)}  serving {fmt(rec.serving_s)}  "
                f"pipeline {fmt(rec.pipeline_s)}  {'; '.join(rec.notes)}",
                flush=True,
            )
    finally:
        run.stop()
    summary = json.loads((run.run_dir / "summary.json").read_text())
    print()
    print(f"{'role':<10} {'alive again':>12} {'serving again':>14} {'pipeline moving':>16}")
    for rec in results:
        print(
            f"{rec.role:<10} {fmt(rec.alive_s):>12} {fmt(rec.serving_s):>14} "
            f"{fmt(rec.pipeline_s):>16}  {'; '.join(rec.notes)}"
        )
    print("(seconds from SIGKILL; alive: new pid alive in `zrl status`; serving: see docstring;")
    print(" pipeline: learner +20 updates and new trajectories inserted)")
    print(f"summary restarts: {summary.get('restarts')}, stop reason {summary.get('stop_reason')}")
    for note in actor_log_notes(run.run_dir):
        print(f"  {note}")
    print()


def fmt(seconds: float | None) -> str:
    return "timeout" if seconds is None else f"{seconds:.1f} s"


# --- (2) checkpoint cost ------------------------------------------------------------------


def rates(progress: Path, window: float) -> tuple[float, float, float]:
    """(env steps/s, updates/s, seconds measured) over the last ``window`` seconds of a run,
    all of it after the learner's first update (the same steady stretch for every run)."""
    with open(progress, newline="") as f:
        rows = [r for r in csv.DictReader(f)]
    rows = [r for r in rows if float(r["updates"] or 0) > 0]
    if len(rows) < 2:
        return 0.0, 0.0, 0.0
    end = float(rows[-1]["time"])
    rows = [r for r in rows if float(r["time"]) >= end - window]
    a, b = rows[0], rows[-1]
    dt = float(b["time"]) - float(a["time"])
    return (
        (float(b["env_steps"]) - float(a["env_steps"])) / dt,
        (float(b["updates"]) - float(a["updates"])) / dt,
        dt,
    )


def checkpoint_part(work: Path, seconds: float) -> None:
    window = seconds / 2
    print(
        f"== checkpoint cost: two consecutive `zrl run`s of {seconds:g} s, rates over the "
        f"last {window:g} s of each =="
    )
    table = []
    for label, interval in (("every 2 s", "2"), ("off (1e6 s)", "1e6")):
        run = Run(
            work / f"ckpt-{interval}",
            [
                f"stop.wall_time={seconds:g}",
                "stop.eval_return=null",
                f"checkpoint.interval={interval}",
            ],
        )
        try:
            run.wait_address()
            run.proc.wait(timeout=seconds + 120)
        finally:
            run.stop()
        steps, updates, dt = rates(run.run_dir / "progress.csv", window)
        ckpt = run.run_dir / "checkpoints"
        sizes = {p.name: p.stat().st_size for p in ckpt.iterdir()} if ckpt.exists() else {}
        table.append((label, steps, updates, dt, sizes))
        print(
            f"  checkpoints {label}: {steps:,.0f} env steps/s, {updates:,.1f} updates/s "
            f"over {dt:.0f} s",
            flush=True,
        )
    print()
    base_steps, base_updates = table[1][1], table[1][2]
    print(f"{'checkpoints':<12} {'env steps/s':>12} {'updates/s':>10} {'vs off':>14} {'files':>30}")
    for label, steps, updates, _, sizes in table:
        rel = (
            f"{steps / base_steps:.2f} / {updates / base_updates:.2f}"
            if base_steps and base_updates
            else "-"
        )
        files = ", ".join(f"{k} {v / 2**20:.1f} MB" for k, v in sorted(sizes.items()))
        print(f"{label:<12} {steps:>12,.0f} {updates:>10,.1f} {rel:>14}   {files}")
    print(
        "(vs off: env steps/s ratio / updates/s ratio; one run each on a shared machine: "
        "expect a few percent of noise)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--roles", default=",".join(VICTIMS), help="roles to kill, in order")
    parser.add_argument("--seconds", type=float, default=40.0, help="length of each cost run")
    parser.add_argument("--skip-recovery", action="store_true")
    parser.add_argument("--skip-checkpoint-cost", action="store_true")
    args = parser.parse_args()
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    unknown = set(roles) - set(VICTIMS)
    if unknown:
        parser.error(f"unknown roles {sorted(unknown)}; choose from {', '.join(VICTIMS)}")
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="zrl-recovery-") as tmp:
        work = Path(tmp)
        if not args.skip_recovery:
            recovery_part(work, roles)
        if not args.skip_checkpoint_cost:
            checkpoint_part(work, args.seconds)


if __name__ == "__main__":
    main()
