"""A real one-node Slurm cluster on this machine, for testing ``launchers/slurm.sbatch``.

Debian's ``slurm-wlm`` and ``munge`` packages, configured from scratch in a directory of the
caller's: a fresh munge key and ``munged``, a minimal ``slurm.conf`` (one node, this host, with
2 CPUs; one partition; no cgroups, no accounting), ``slurmctld`` and ``slurmd``. Every daemon is
a foreground child process of the caller, on ports chosen free, with its state, spool, pid and
log files under that directory: nothing in ``/etc`` or ``/run`` is read or written, and the
system's own munge or Slurm (if any) is left alone. Slurm's commands reach this cluster through
``SLURM_CONF`` in :meth:`SlurmCluster.env`; it is never set in this process's environment.

Jobs run as root (``SlurmUser=root``): the caller must be root. Cleanup is by PID: the daemons,
then any process still carrying this cluster's ``SLURM_CONF`` in its environment (a job's
``slurmstepd`` and the job's processes inherit it), never a match on a name.

- :func:`missing`: why this machine cannot run the cluster (``None`` when it can).
- :func:`one_node_cluster`: a context manager that starts the cluster, waits until ``sinfo``
  shows the node idle, and stops everything on exit.
- :class:`SlurmCluster`: ``sbatch`` / ``scancel``, a job's state, its processes, the logs.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from zrl.testing.processes import kill_pids
from zrl.transport.endpoints import free_port_range

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
CLIENTS = ("munge", "sinfo", "sbatch", "squeue", "scontrol", "scancel", "srun")
START_TIMEOUT_S = 30.0  # until the node shows idle
KILL_WAIT_S = 10  # slurm.conf KillWait: SIGTERM to SIGKILL when a job is cancelled
# Job states in which the job or its processes may still run (squeue's long names).
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)


def missing() -> str | None:
    """Why a cluster cannot start here, or None: the binaries (``apt-get install slurm-wlm
    munge``; ``.ci/run`` installs them) and root."""
    absent = [p for p in (MUNGED, SLURMCTLD, SLURMD) if not Path(p).exists()]
    absent += [c for c in CLIENTS if shutil.which(c) is None]
    if absent:
        return f"Slurm not installed ({', '.join(absent)} missing; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the test Slurm cluster runs its jobs as root (SlurmUser=root): run as root"
    return None


def slurm_conf(root: Path, node: str, ctld_port: int, slurmd_port: int, munge_socket: Path) -> str:
    """The whole cluster's configuration: one node, this host at 127.0.0.1, 2 CPUs."""
    return f"""\
ClusterName=zrltest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
KillWait={KILL_WAIT_S}
MinJobAge=300
NodeName={node} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    """A running cluster: its directory, ``slurm.conf``, node name and daemon processes."""

    root: Path
    conf: Path
    node: str
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` (and ``extra``): for Slurm's commands,
        and, through ``sbatch --export=ALL``, for the jobs."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **(extra or {})}

    def command(
        self, *argv: str, env: Mapping[str, str] | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (``sinfo``, ``scontrol`` ...) against this cluster; not checked."""
        return subprocess.run(
            list(argv),
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    def sbatch(self, *args: str, env: Mapping[str, str] | None = None) -> int:
        """``sbatch --parsable ARGS...`` with ``env`` added to the exported environment; the
        job id."""
        done = self.command("sbatch", "--parsable", *args, env=env)
        assert done.returncode == 0, f"sbatch failed: {done.stderr}\n{self.logs()}"
        return int(done.stdout.strip().split(";")[0])

    def scancel(self, job: int) -> None:
        done = self.command("scancel", str(job))
        assert done.returncode == 0, f"scancel {job}: {done.stderr}"

    def job_state(self, job: int) -> str | None:
        """The job's state (RUNNING, COMPLETING, COMPLETED, CANCELLED, FAILED, TIMEOUT ...);
        None once slurmctld forgot it (MinJobAge after it ended)."""
        done = self.command("scontrol", "-o", "show", "job", str(job))
        if done.returncode != 0:
            return None
        fields = dict(f.split("=", 1) for f in done.stdout.split() if "=" in f)
        return fields.get("JobState")

    def wait_job(self, job: int, timeout: float) -> str | None:
        """Wait until the job has ended and its processes are cleaned up (not COMPLETING);
        its final state. AssertionError with the daemons' logs on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job)
            if state not in ACTIVE_STATES:
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} still {state} after {timeout}s\n{self.logs()}")
            time.sleep(0.5)

    def processes(self, job: int | None = None) -> list[psutil.Process]:
        """Live processes started through this cluster (their environment holds its
        ``SLURM_CONF``): slurmstepd and jobs; with ``job``, that job's processes only."""
        found = []
        for proc in psutil.process_iter():
            try:
                environ = proc.environ()
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if environ.get("SLURM_CONF") != str(self.conf):
                continue
            if job is None or environ.get("SLURM_JOB_ID") == str(job):
                found.append(proc)
        daemons = {p.pid for p in self.daemons.values()}
        return [p for p in found if p.pid not in daemons and p.pid != os.getpid()]

    def logs(self, tail: int = 3000) -> str:
        """The end of every daemon's log, for failure messages."""
        parts = []
        for name in ("munged", "slurmctld", "slurmd"):
            log = self.root / "log" / f"{name}.log"
            if log.exists():
                parts.append(f"--- {log}\n{log.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job, stop the daemons by PID, then kill whatever the jobs left."""
        if self.daemons.get("slurmctld") and self.daemons["slurmctld"].poll() is None:
            jobs = self.command("squeue", "-h", "-o", "%i").stdout.split()
            for job in jobs:
                self.command("scancel", job)
            deadline = time.monotonic() + KILL_WAIT_S + 10
            while jobs and time.monotonic() < deadline:
                if not self.command("squeue", "-h", "-o", "%i").stdout.split():
                    break
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):  # the order they depend on each other
            if name in self.daemons:
                kill_pids([self.daemons[name].pid])
        left = self.processes()
        for proc in left:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=5)


def _start(
    cluster: SlurmCluster, name: str, argv: list[str], env: Mapping[str, str] | None = None
) -> None:
    with open(cluster.root / "log" / f"{name}.log", "wb") as out:
        cluster.daemons[name] = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=cluster.env(env),
        )


def _wait_until(
    cluster: SlurmCluster,
    what: str,
    probe: Callable[[], subprocess.CompletedProcess[str]],
    ok: Callable[[subprocess.CompletedProcess[str]], bool],
    deadline: float,
) -> None:
    """Run ``probe`` until ``ok`` says yes; fail with the logs when a daemon exits first or
    the deadline passes."""
    while True:
        done = probe()
        if ok(done):
            return
        dead = [name for name, proc in cluster.daemons.items() if proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            why = f"{', '.join(dead)} exited" if dead else f"not within {START_TIMEOUT_S}s"
            raise AssertionError(
                f"Slurm test cluster, waiting for {what}: {why}\n"
                f"last probe: {done.stdout}{done.stderr}\n{cluster.logs()}"
            )
        time.sleep(0.2)


@contextmanager
def one_node_cluster(root: Path) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd with their files under ``root``; yield once ``sinfo``
    shows the node idle; stop everything on exit, however the body ended."""
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o755)  # the socket's directory: munged wants it searchable
    munge_socket = root / "munge" / "munge.sock"
    if len(str(munge_socket)) > 100:  # a unix socket path has at most 107 bytes
        raise ValueError(f"munge socket path too long for a unix socket: {munge_socket}")
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node = socket.gethostname().split(".")[0]
    ctld_port = free_port_range(2, host="0.0.0.0")
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, node, ctld_port, ctld_port + 1, munge_socket))
    cluster = SlurmCluster(root, conf, node)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        _start(
            cluster,
            "munged",
            [
                MUNGED,
                "--foreground",
                "--force",
                f"--socket={munge_socket}",
                f"--key-file={key}",
                f"--pid-file={root / 'munge' / 'munged.pid'}",
                f"--seed-file={root / 'munge' / 'seed'}",
            ],
        )
        _wait_until(
            cluster,
            "munged",
            lambda: cluster.command("munge", "-n", "-S", str(munge_socket)),
            lambda done: done.returncode == 0,
            deadline,
        )
        _start(cluster, "slurmctld", [SLURMCTLD, "-D", "-i"])
        _start(cluster, "slurmd", [SLURMD, "-D", "-N", node])
        _wait_until(
            cluster,
            "the node to be idle",
            lambda: cluster.command("sinfo", "-h", "-N", "-n", node, "-o", "%T"),
            lambda done: done.stdout.strip() == "idle",
            deadline,
        )
        yield cluster
    finally:
        cluster.stop()
