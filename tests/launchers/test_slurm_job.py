"""launchers/slurm.sbatch on a real one-node Slurm cluster (the ``slurm_cluster`` fixture):
`sbatch` it with a small CartPole Ape-X run; the head ends the job at the target, its run
directory says so, a role killed with -9 came back, and none of the job's processes is left."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import zmq

from tests.launchers.slurm_cluster import SlurmCluster
from zrl.testing.probes import wait_for
from zrl.testing.processes import REPO, note_run, status_rows, zrl_processes
from zrl.transport.endpoints import free_port_range

SBATCH = REPO / "launchers" / "slurm.sbatch"
CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
TARGET = 60.0  # a random policy scores 22 +- 3 over an evaluation's 20 episodes: 60 is learning
TRAIN_TIMEOUT_S = 150  # submission to an evaluation at TARGET (about 25 s on an idle machine)
BROKER_PORTS = 12  # the broker's base port and the 11 after it (docs/launchers.md)
EVAL_LINE = re.compile(r"\beval of weights v\d+: (-?[0-9.]+)")


def test_the_cluster_runs_a_batch_job_and_cancels_it(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """What slurm.sbatch relies on: the node list, an srun step inside the allocation, and
    scancel stopping every process of the job (which the leak check can see)."""
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        'scontrol show hostnames "$SLURM_JOB_NODELIST"\n'
        "srun --ntasks=2 --cpus-per-task=1 --overlap bash -c 'echo task $SLURM_PROCID'\n"
        "touch started\n"
        "sleep 120\n"
    )
    job = slurm_cluster.sbatch(
        "--nodes=1",
        "--cpus-per-task=2",
        "--time=2",
        f"--chdir={tmp_path}",
        "--output=job.out",
        str(script),
    )
    wait_for(lambda: (tmp_path / "started").exists(), timeout=60, message=slurm_cluster.logs())
    running = [p.cmdline() for p in slurm_cluster.processes(job)]
    assert ["sleep", "120"] in running, running
    slurm_cluster.scancel(job)
    assert slurm_cluster.wait_job(job, timeout=60) == "CANCELLED"
    assert not slurm_cluster.processes(job)
    lines = (tmp_path / "job.out").read_text().splitlines()
    assert lines[0] == slurm_cluster.node
    assert sorted(lines[1:3]) == ["task 0", "task 1"]


def _evaluations(log_dir: Path) -> list[float]:
    """The mean returns the evaluator logged, in order."""
    log = log_dir / "evaluator-0.log"
    return [float(m) for m in EVAL_LINE.findall(log.read_text())] if log.exists() else []


def _job_report(job_dir: Path, job: int) -> str:
    """The job's output and the end of every role's log, for failure messages."""
    parts = []
    for path in [job_dir / f"zrl-{job}.out", *sorted((job_dir / f"zrl-{job}").glob("*.log"))]:
        if path.exists():
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
    return "\n".join(parts)


@pytest.mark.waits  # a multi-host launch: mostly waiting on hosts; a low CartPole target
@pytest.mark.slow
@pytest.mark.timeout(TRAIN_TIMEOUT_S + 120)
def test_sbatch_trains_cartpole_and_leaves_nothing(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    port = free_port_range(BROKER_PORTS, host="0.0.0.0")  # the job's broker binds 0.0.0.0
    env = {
        "CONFIG": str(CONFIG),
        "PORT": str(port),
        "ACTORS_PER_NODE": "2",
        # the head enforces `stop`: the job ends by itself at the target
        "EXTRA_SET": f"stop.eval_return={TARGET:g} stop.eval_window=1 stop.wall_time=120",
        "PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    job = slurm_cluster.sbatch(
        "--nodes=1", "--cpus-per-task=2", "--time=5", f"--chdir={job_dir}", str(SBATCH), env=env
    )
    log_dir = job_dir / f"zrl-{job}"
    out_file = job_dir / f"zrl-{job}.out"

    def broker_line() -> str | None:
        if not out_file.exists():
            return None
        found = re.search(r"^zrl: broker (tcp://\S+) ", out_file.read_text(), re.M)
        return found.group(1) if found else None

    # The node's hostname, or its first address where the hostname resolves to loopback.
    broker = str(wait_for(broker_line, timeout=60, message=slurm_cluster.logs()))
    assert broker.endswith(f":{port}"), broker

    # A role killed with -9 on the agent's host comes back, under the same id.
    def actor_pid() -> int | None:
        # The job made its own keys (authenticated by default): status asks with them.
        note_run(broker, log_dir)
        row = status_rows(zmq.Context.instance(), broker).get("actor-1", {})
        return row.get("pid") if row.get("state") == "alive" else None

    first = wait_for(
        actor_pid,
        timeout=TRAIN_TIMEOUT_S,
        interval=0.5,
        message=f"actor-1 never came up\n{slurm_cluster.logs()}",
    )
    os.kill(int(first), signal.SIGKILL)  # type: ignore[call-overload]
    wait_for(
        lambda: actor_pid() not in (None, first),
        timeout=60,
        interval=0.5,
        message="the agent did not bring actor-1 back",
    )

    state = slurm_cluster.wait_job(job, TRAIN_TIMEOUT_S)
    report = _job_report(job_dir, job)
    assert state == "COMPLETED", f"job {job} ended {state}\n{report}"
    summary = json.loads((log_dir / "run" / "summary.json").read_text())
    assert summary["reached_target"] and summary["stop_reason"] == "eval_return", report
    assert summary["best_eval_return"] >= TARGET, report
    assert summary["restarts"].get("actor-1", 0) >= 1, summary["restarts"]
    assert summary["roles"]["never_came"] == [], summary["roles"]
    assert (log_dir / "run" / "progress.csv").exists() and (log_dir / "run" / "model.pt").exists()
    assert (log_dir / "keys" / "run.secret").is_file(), "the job ran without its own keys"
    evaluations = _evaluations(log_dir)
    assert max(evaluations, default=0.0) >= TARGET, report

    # Every role ran, logged to its file and registered with the broker at the job's address.
    roles = ("params-0", "replay-0", "learner-0", "evaluator-0", "actor-0", "actor-1")
    assert set(roles) <= set(summary["roles"]["took_part"]), summary["roles"]
    assert all((log_dir / f"{role}.log").exists() for role in roles), report
    # The script's own lines (no record carries them): the head's exit code, its exit trap.
    out = out_file.read_text()
    assert "zrl: the head ended (code 0)" in out, out
    assert "zrl: stopping" in out, out

    # Nothing of the job is left: no process in the job, none naming its broker port.
    assert not slurm_cluster.processes(job), [p.cmdline() for p in slurm_cluster.processes(job)]
    left = zrl_processes(f":{port}")
    assert not left, [p.cmdline() for p in left]
