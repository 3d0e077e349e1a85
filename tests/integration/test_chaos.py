"""Chaos: roles killed with SIGKILL while they train, and a broker killed under its roles.

- Under `zrl run`: kill -9 an actor, then the replay shard, then the learner, each once the
  previous one is back; the supervisor restarts each, the learner resumes from its checkpoint
  (never before it), and learning goes on. Then kill -9 the broker: the supervisor restarts
  it too, every role registers again on its own (no role restarts), and the run goes on.
- Without a supervisor: roles started by hand keep running while their broker is killed and
  a new one starts on the same address; they register again on their own, keeping their ids.

Only processes this test started (or their children) are ever signalled, always by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import zmq

from zrl.config.experiment import ExperimentConfig
from zrl.roles.errors import RoleError
from zrl.roles.registry_client import registry_request
from zrl.run.children import Child
from zrl.run.supervisor import Supervisor
from zrl.testing.probes import wait_for
from zrl.testing.processes import (
    REPO,
    end_run,
    run_broker_address,
    run_keys,
    status_rows,
    zrl_status_json,
)
from zrl.transport import protocol as P

CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
ROLE_IDS = {"actor-0", "actor-1", "replay-0", "params-0", "learner-0", "evaluator-0"}


def descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def updates_of(rows: dict[str, dict[str, Any]]) -> int | None:
    row = rows.get("learner-0")
    if row is None or row["state"] != "alive":
        return None
    value = row.get("info", {}).get("updates")
    return value if isinstance(value, int) else None


# --- chaos under zrl run ------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_roles_are_restarted_and_learning_goes_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints" / "learner-0.pt"
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "zrl",
                "run",
                str(CONFIG),
                "--run-dir",
                str(run_dir),
                "--set",
                "stop.wall_time=900",
                "--set",
                "checkpoint.interval=3",
                "--set",
                "stop.eval_return=null",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
        )
    ctx = zmq.Context()
    addr = ""
    kills: list[dict[str, Any]] = []
    seen_after_resume: list[int] = []
    try:
        addr = run_broker_address(proc, run_dir, log)

        def all_alive() -> bool:
            rows = status_rows(ctx, addr)
            return ROLE_IDS <= set(rows) and all(rows[i]["state"] == "alive" for i in ROLE_IDS)

        wait_for(lambda: all_alive() or proc.poll() is not None, timeout=60, interval=0.25)
        assert proc.poll() is None, log.read_text()[-3000:]
        # Learning is under way before the first kill.
        wait_for(lambda: (updates_of(status_rows(ctx, addr)) or 0) > 50, timeout=90)

        for victim in ("actor-0", "replay-0", "learner-0"):
            assert proc.poll() is None, f"the run ended before {victim} was killed"
            status = zrl_status_json(addr)
            rows = {r["id"]: r for r in status["roles"]}
            old_pid = rows[victim]["pid"]
            assert rows[victim]["state"] == "alive"
            assert old_pid in descendants(proc.pid), "not a process of our run"
            event: dict[str, Any] = {"role": victim, "pid": old_pid}
            event["updates_before"] = updates_of(rows)
            if victim == "learner-0":
                # Its last checkpoint before the kill: it may only resume from this or later.
                event["checkpoint_updates"] = int(
                    torch.load(ckpt, map_location="cpu", weights_only=False)["updates"]
                )
            os.kill(old_pid, signal.SIGKILL)
            t_kill = time.monotonic()

            def back(victim: str = victim, old_pid: int = old_pid) -> bool:
                row = status_rows(ctx, addr).get(victim)
                return row is not None and row["state"] == "alive" and row["pid"] != old_pid

            wait_for(lambda: back() or proc.poll() is not None, timeout=90, interval=0.25)
            assert proc.poll() is None, f"the run ended while {victim} was down"
            event["back_s"] = round(time.monotonic() - t_kill, 1)
            new = status_rows(ctx, addr)[victim]
            assert new["pid"] in descendants(proc.pid)
            assert new["restarts"] == 1 and new["id"] == victim
            # Learning goes on: the learner's update count grows again after the restart.
            base = wait_for(lambda: updates_of(status_rows(ctx, addr)), timeout=60)
            assert isinstance(base, int)

            def learning(base: int = base, victim: str = victim) -> bool:
                u = updates_of(status_rows(ctx, addr))
                if u is not None and victim == "learner-0":
                    seen_after_resume.append(u)
                return (u is not None and u > base + 20) or proc.poll() is not None

            # (After a replay restart the actors reopen their windows once they hear the new
            # shard's incarnation, about a second after it is up.)
            wait_for(learning, timeout=120, interval=0.25)
            assert proc.poll() is None, f"the run ended before learning resumed after {victim}"
            event["learning_s"] = round(time.monotonic() - t_kill, 1)
            kills.append(event)

        # Last the broker: the supervisor restarts it, and every role registers again on its
        # own (the same processes: nobody else is restarted), and learning goes on.
        status = zrl_status_json(addr)
        broker_pid = status["broker"]["pid"]
        pids = {r["id"]: r["pid"] for r in status["roles"]}
        assert broker_pid in descendants(proc.pid)
        before = updates_of({r["id"]: r for r in status["roles"]})
        os.kill(broker_pid, signal.SIGKILL)
        t_kill = time.monotonic()

        last_rows: dict[str, Any] = {}

        def broker_back() -> bool:
            try:
                reply = registry_request(ctx, addr, P.Message(P.STATUS), 1.0, run_keys(addr))
            except RoleError:
                return proc.poll() is not None
            rows = {r["id"]: r for r in reply.meta.get("roles", [])}
            last_rows.clear()
            last_rows.update({i: rows.get(i, {}).get("state") for i in ROLE_IDS})
            return reply.meta["broker"]["pid"] != broker_pid and all(
                rows.get(i, {}).get("state") == "alive" for i in ROLE_IDS
            )

        def not_back() -> str:
            """Who had not re-registered, with the tails of their logs (and the broker's)."""
            missing = sorted(i for i in ROLE_IDS if last_rows.get(i) != "alive")
            tails = {
                name: (run_dir / "logs" / f"{name}.log").read_text(errors="replace")[-1500:]
                for name in ["broker", *missing]
                if (run_dir / "logs" / f"{name}.log").exists()
            }
            return f"not back after the broker's restart: {last_rows}\n{tails}"

        # A role re-registers within its heartbeat timeout plus a back-off of at most 5 s; the
        # wait is sized for a 2-core machine at a load of 10, where a role's loop can stall.
        try:
            wait_for(broker_back, timeout=90, interval=0.25)
        except AssertionError:
            raise AssertionError(not_back()) from None
        assert proc.poll() is None, "the run ended when its broker was killed"
        back_s = round(time.monotonic() - t_kill, 1)
        status = zrl_status_json(addr)
        assert status["broker"]["pid"] in descendants(proc.pid)
        assert {r["id"]: r["pid"] for r in status["roles"]} == pids, "a role was restarted"
        assert all(r["state"] == "alive" and r["restarts"] == 0 for r in status["roles"])
        wait_for(
            lambda: (
                (updates_of(status_rows(ctx, addr)) or 0) > (before or 0) + 20
                or proc.poll() is not None
            ),
            timeout=90,
            interval=0.25,
        )
        kills.append(
            {
                "role": "broker",
                "pid": broker_pid,
                "back_s": back_s,
                "learning_s": round(time.monotonic() - t_kill, 1),
                "updates_before": before,
            }
        )
        # The run goes on; stop it now, as Ctrl-C would (the wall time is only a safety net).
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        leftovers = end_run(proc, addr)
        ctx.destroy(linger=0)
    text = log.read_text(errors="replace")
    print("kills:", kills)
    assert leftovers == [], [p.pid for p in leftovers]
    assert proc.returncode == 130, text[-3000:]  # Ctrl-C's exit code
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["error"] is None, summary
    # Each killed process restarted exactly once, nothing else restarted.
    assert summary["restarts"] == {"actor-0": 1, "replay-0": 1, "learner-0": 1, "broker-0": 1}
    # Learning went on through it all.
    assert summary["updates"] > kills[-1]["updates_before"], (summary, kills)
    assert summary["evaluations"] >= 1, summary

    # The learner (restarted once, above) resumed from the checkpoint it had (or a later one),
    # never before it.
    beats = summary["heartbeats"]
    n = beats["learner-0"]["resumed_from"]
    learner_kill = kills[2]
    assert n >= learner_kill["checkpoint_updates"], (n, learner_kill)
    # ... and it never reported fewer updates than it resumed with.
    assert seen_after_resume and min(seen_after_resume) >= n, (n, seen_after_resume[:5])
    # The replay shard restarted from its snapshot.
    assert beats["replay-0"]["restored_items"] > 0, beats["replay-0"]
    assert not list((run_dir / "checkpoints").glob("*.tmp"))


def test_supervisor_restarts_a_dead_broker(tmp_path: Path, monkeypatch) -> None:
    cfg = ExperimentConfig.model_validate({"stop": {"eval_return": None, "wall_time": 60}})
    sup = Supervisor(cfg, run_dir=tmp_path / "run", show_status=False)
    spawned: list[Child] = []
    monkeypatch.setattr(sup.pool, "spawn", spawned.append)

    class Dead:
        def poll(self) -> int:
            return -signal.SIGKILL

    sup.broker_child = Child("broker", 0, tmp_path / "broker.log", proc=Dead())  # type: ignore[arg-type]
    deadline = time.monotonic() + 20  # longer than any restart back-off
    while not spawned and not sup._stop.is_set() and time.monotonic() < deadline:
        sup._check_children()
        time.sleep(0.2)
    assert not sup._stop.is_set(), f"the run was stopped: {sup._fatal}"
    assert spawned and spawned[0].role == "broker"


# Regression (found here, since fixed): supervisor.py Supervisor._stop_children: SIGTERMs every
# role at once although the actors' end-of-stream wait needs the replay shard: the shard exits
# first, each actor waits its full EOS_TIMEOUT_S (5 s) and stops with its in-flight trajectories
# lost ('stopping with 2 trajectories sent but not acknowledged by replay' at every run's end)
def test_supervisor_stops_the_actors_before_the_replay(tmp_path: Path) -> None:
    sup = Supervisor(ExperimentConfig(), run_dir=tmp_path / "run", show_status=False)
    events: list[tuple[str, str]] = []

    class Proc:
        """Exits as soon as it is signalled; records when the supervisor sees that."""

        def __init__(self, name: str) -> None:
            self.name, self.code, self.seen = name, None, False

        def poll(self) -> int | None:
            if self.code is not None and not self.seen:
                self.seen = True
                events.append(("exited", self.name))
            return self.code

        def send_signal(self, sig: int) -> None:
            events.append(("signal", self.name))
            self.code = 0

        def wait(self, timeout: float | None = None) -> int | None:
            return self.poll()

        def kill(self) -> None:
            self.send_signal(signal.SIGKILL)

    for role, index in (
        ("params", 0),
        ("replay", 0),
        ("learner", 0),
        ("evaluator", 0),
        ("actor", 0),
        ("actor", 1),
    ):
        child = Child(role, index, tmp_path / f"{role}-{index}.log")
        child.proc = Proc(child.name)  # type: ignore[assignment]
        sup.children.append(child)
    sup.broker_child = Child("broker", 0, tmp_path / "broker.log", proc=Proc("broker-0"))  # type: ignore[arg-type]
    sup.pool.stop()
    order = [e for e in events if e[0] == "signal"]
    assert order[-1] == ("signal", "broker-0"), events
    actors_gone = max(events.index(("exited", f"actor-{i}")) for i in (0, 1))
    assert actors_gone < events.index(("signal", "replay-0")), events


# --- a broker restart under running roles ------------------------------------------------------


@pytest.mark.waits
@pytest.mark.slow
def test_roles_reregister_with_a_restarted_broker(spawn, broker_addr, zmq_ctx) -> None:
    broker_args = (
        "start",
        "broker",
        "--bind",
        broker_addr,
        "--config",
        str(CONFIG),
        "--set",
        "replay.samples_per_insert=0",  # no learner here: never wait for samples
        "--set",
        "env.num_envs=4",
    )
    broker = spawn(*broker_args)
    roles = {
        "params-0": spawn("start", "params", "--broker", broker_addr, "--index", "0"),
        "replay-0": spawn("start", "replay", "--broker", broker_addr, "--index", "0"),
        "actor-0": spawn("start", "actor", "--broker", broker_addr, "--index", "0"),
    }

    def rows() -> dict[str, dict[str, Any]]:
        return status_rows(zmq_ctx, broker_addr)

    def trajectories() -> int:
        info = rows().get("replay-0", {}).get("info", {})
        return int(info.get("trajectories", 0))

    def registered() -> dict[str, dict[str, Any]] | None:
        r = rows()
        ok = set(roles) <= set(r) and all(r[i]["state"] == "alive" for i in roles)
        return r if ok else None

    before = wait_for(registered, timeout=60, interval=0.25)
    assert isinstance(before, dict)
    assert {i: before[i]["pid"] for i in roles} == {i: p.pid for i, p in roles.items()}
    # Data flows: the shard inserts the actor's trajectories.
    wait_for(lambda: trajectories() >= 3, timeout=60)

    os.kill(broker.pid, signal.SIGKILL)
    broker.wait(timeout=10)
    t_kill = time.monotonic()
    time.sleep(1.0)  # down for a moment: the roles notice nothing yet (heartbeat timeout 3 s)
    broker2 = spawn(*broker_args)
    after = wait_for(registered, timeout=60, interval=0.2)
    reregistered_s = time.monotonic() - t_kill
    assert isinstance(after, dict)
    # The same processes, the same ids: nobody was restarted.
    for rid, proc in roles.items():
        assert proc.poll() is None, f"{rid} exited"
        assert after[rid]["pid"] == proc.pid and after[rid]["id"] == rid
        assert after[rid]["restarts"] == 0
    status = zrl_status_json(broker_addr)
    assert status["broker"]["pid"] == broker2.pid
    assert {r["id"]: r["state"] for r in status["roles"]} == dict.fromkeys(roles, "alive")
    # The new broker knows the parameter server's rpc endpoint again.
    services = registry_request(
        zmq_ctx,
        broker_addr,
        P.Message(P.LOOKUP, meta={"role": "params"}),
        2.0,
        run_keys(broker_addr),
    ).meta["services"]
    assert [s["id"] for s in services] == ["params-0"] and services[0]["rpc"]

    # And the experience stream flows again through the new broker's devices.
    base = after["replay-0"]["info"].get("trajectories", 0)
    wait_for(lambda: trajectories() >= base + 3, timeout=90)
    flowing_s = time.monotonic() - t_kill
    print(f"re-registered {reregistered_s:.1f}s, data flowing {flowing_s:.1f}s after the kill")
    for rid, proc in roles.items():
        assert proc.poll() is None, f"{rid} exited"
