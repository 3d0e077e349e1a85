"""launchers/slurm.sbatch on a real one-node Slurm cluster (the ``slurm_cluster`` fixture)."""

from __future__ import annotations

from pathlib import Path

from zrl.testing import slurm
from zrl.testing.probes import wait_for


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
