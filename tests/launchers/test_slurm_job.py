"""launchers/slurm.sbatch on a real one-node Slurm cluster (the ``slurm_cluster`` fixture):
`sbatch` it with a small CartPole Ape-X run, see the evaluator reach the target, end the job,
and find none of its processes left."""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path

import pytest

from zrl.testing import slurm
from zrl.testing.probes import wait_for
from zrl.testing.processes import REPO, zrl_processes
from zrl.transport.sockets import free_port_range

SBATCH = REPO / "launchers" / "slurm.sbatch"
CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
TARGET = 150.0  # as tests/integration/test_apex_cartpole.py: 475 takes too long on 2 cores
TRAIN_TIMEOUT_S = 150  # submission to an evaluation at TARGET (about 25 s on an idle machine)
BROKER_PORTS = 12  # the broker's base port and the 11 after it (docs/launchers.md)
EVAL_LINE = re.compile(r"\beval of weights v\d+: (-?[0-9.]+)")


def test_the_cluster_runs_a_batch_job_and_cancels_it(
    slurm_cluster: slurm.SlurmCluster, tmp_path: Path
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
        "--nodes=1", "--cpus-per-task=2", "--time=2", f"--chdir={tmp_path}",
        "--output=job.out", str(script),
    )  # fmt: skip
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


def _run_to_the_target(cluster: slurm.SlurmCluster, job: int, log_dir: Path) -> str | None:
    """Wait until the evaluator logged TARGET, end the job, and return its final state.

    Today nothing enforces the config's `stop` under sbatch: the job would run until its
    --time, so the test cancels it (what a user does) once the target shows. When
    `zrl start broker --run-dir` enforces `stop` itself, this becomes
    ``cluster.wait_job(job, TRAIN_TIMEOUT_S)`` and the job ends COMPLETED on its own.
    """

    def reached_or_ended() -> bool:
        if cluster.job_state(job) not in slurm.ACTIVE_STATES:
            return True  # ended early (a crash): the caller's asserts show why
        return max(_evaluations(log_dir), default=0.0) >= TARGET

    wait_for(reached_or_ended, timeout=TRAIN_TIMEOUT_S, interval=0.5,
             message=f"no evaluation at {TARGET} within {TRAIN_TIMEOUT_S}s")  # fmt: skip
    cluster.scancel(job)
    return cluster.wait_job(job, timeout=slurm.KILL_WAIT_S + 30)


@pytest.mark.slow
@pytest.mark.timeout(TRAIN_TIMEOUT_S + 120)
def test_sbatch_trains_cartpole_and_leaves_nothing(
    slurm_cluster: slurm.SlurmCluster, tmp_path: Path
) -> None:
    port = free_port_range(BROKER_PORTS, host="0.0.0.0")  # the job's broker binds 0.0.0.0
    env = {
        "CONFIG": str(CONFIG),
        "PORT": str(port),
        "ACTORS_PER_NODE": "2",
        # what a head that enforces `stop` will read; ignored by today's broker
        "EXTRA_SET": f"stop.eval_return={TARGET:g} stop.eval_window=1 stop.wall_time=120",
        "PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    try:
        socket.gethostbyname(slurm_cluster.node)
    except OSError:
        env["BROKER_HOST"] = "127.0.0.1"  # the script's default, `hostname`, must resolve
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    job = slurm_cluster.sbatch(
        "--nodes=1", "--cpus-per-task=2", "--time=5", f"--chdir={job_dir}", str(SBATCH), env=env
    )
    log_dir = job_dir / f"zrl-{job}"

    state = _run_to_the_target(slurm_cluster, job, log_dir)
    report = _job_report(job_dir, job)
    assert state == "CANCELLED", f"job {job} ended {state}\n{report}"
    evaluations = _evaluations(log_dir)
    assert max(evaluations, default=0.0) >= TARGET, report
    assert len(evaluations) >= 2, report  # a curve, not one lucky evaluation

    # Every role ran and registered with the broker at the job's address.
    out = (job_dir / f"zrl-{job}.out").read_text()
    assert f"zrl: broker tcp://{env.get('BROKER_HOST', slurm_cluster.node)}:{port}" in out, out
    assert "zrl: stopping" in out, out  # the script's exit trap ran
    for role in ("params-0", "replay-0", "learner-0", "evaluator-0", "actor-0", "actor-1"):
        log = log_dir / f"{role}.log"
        assert log.exists(), report
        assert f"registered as {role}" in log.read_text(), report

    # Nothing of the job is left: no process in the job, none naming its broker port.
    assert not slurm_cluster.processes(job), [p.cmdline() for p in slurm_cluster.processes(job)]
    left = zrl_processes(f":{port}")
    assert not left, [p.cmdline() for p in left]
