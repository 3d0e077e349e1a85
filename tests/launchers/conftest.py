"""Fixtures of the launcher tests: the ssh launcher as a module, a real sshd on loopback, and a
real one-node Slurm cluster."""

from __future__ import annotations

import getpass
import importlib.util
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from zrl.testing import slurm
from zrl.testing.processes import REPO, kill_pids

SSHD = Path("/usr/sbin/sshd")


@pytest.fixture(scope="session")
def ssh_launcher() -> ModuleType:
    """launchers/ssh.py is a script, not a package module: load it from its path."""
    name = "zrl_launchers_ssh"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "launchers" / "ssh.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Sshd:
    """A throwaway sshd: log in as ``user@127.0.0.1`` with ``ssh_options``."""

    port: int
    user: str
    client_key: Path
    log: Path

    @property
    def target(self) -> str:
        return f"{self.user}@127.0.0.1"

    @property
    def ssh_options(self) -> list[str]:
        return [
            "-p", str(self.port), "-i", str(self.client_key),
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes",
        ]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real OpenSSH server on a free loopback port, with its own host and client keys."""
    if not SSHD.exists():
        pytest.skip("openssh-server not installed (CI installs it)")
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (openssh-client; CI installs it)")
    try:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir
    except OSError as exc:
        pytest.skip(f"sshd needs /run/sshd: {exc}")
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "client_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True
        )
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    port = _free_port()
    config = d / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin yes\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        f"StrictModes no\nPidFile {d / 'sshd.pid'}\n"
    )
    log = d / "sshd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(SSHD), "-D", "-f", str(config), "-e"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = Sshd(port, getpass.getuser(), d / "client_key", log)
    try:
        deadline = time.monotonic() + 15
        while True:
            probe = subprocess.run(
                ["ssh", *server.ssh_options, "-o", "BatchMode=yes", server.target, "true"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=15,
            )
            if probe.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"sshd did not let us in: {probe.stderr.decode(errors='replace')}\n"
                    f"sshd log:\n{log.read_text(errors='replace')}"
                )
            time.sleep(0.2)
        yield server
    finally:
        kill_pids([proc.pid])


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm.SlurmCluster]:
    """A real one-node Slurm cluster (munged, slurmctld, slurmd) owned by this module's tests;
    every daemon and job process is stopped by PID at teardown."""
    reason = slurm.missing()
    if reason is not None:
        pytest.skip(f"{reason} (CI installs it)")
    with slurm.slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
