"""Fixtures of the launcher tests: the ssh launcher as a module, a real sshd on loopback, real
sshds on hosts that are network namespaces, and a real one-node Slurm cluster."""

from __future__ import annotations

import getpass
import importlib.util
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from tests.integration.netns import Hosts, netns_available
from tests.launchers.slurm_cluster import SlurmCluster, missing, one_node_cluster
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
        return _client_options(self.client_key, self.port)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _skip_without_openssh() -> None:
    if not SSHD.exists():
        pytest.skip("openssh-server not installed (CI installs it)")
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (openssh-client; CI installs it)")
    try:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir
    except OSError as exc:
        pytest.skip(f"sshd needs /run/sshd: {exc}")


def _make_keys(d: Path) -> None:
    """A host key, a client key, and the client key as the only authorized one, in ``d``."""
    for key in ("host_key", "client_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True
        )
    shutil.copy(d / "client_key.pub", d / "authorized_keys")


def _sshd_config(d: Path, name: str, address: str, port: int) -> Path:
    """An sshd_config that listens on ``address:port`` only and lets the client key in."""
    config = d / f"{name}_config"
    config.write_text(
        f"Port {port}\nListenAddress {address}\nHostKey {d / 'host_key'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin yes\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        f"StrictModes no\nPidFile {d / f'{name}.pid'}\n"
    )
    return config


def _client_options(client_key: Path, port: int) -> list[str]:
    return [
        "-p",
        str(port),
        "-i",
        str(client_key),
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "IdentitiesOnly=yes",
    ]


def _wait_until_ssh_works(
    probe: Callable[[], subprocess.CompletedProcess[bytes]],
    sshd: subprocess.Popen[bytes],
    log: Path,
) -> None:
    deadline = time.monotonic() + 15
    while True:
        done = probe()
        if done.returncode == 0:
            return
        if sshd.poll() is not None or time.monotonic() > deadline:
            pytest.fail(
                f"sshd did not let us in: {done.stderr.decode(errors='replace')}\n"
                f"sshd log:\n{log.read_text(errors='replace')}"
            )
        time.sleep(0.2)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real OpenSSH server on a free loopback port, with its own host and client keys."""
    _skip_without_openssh()
    d = tmp_path_factory.mktemp("sshd")
    _make_keys(d)
    port = _free_port()
    config = _sshd_config(d, "sshd", "127.0.0.1", port)
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
        _wait_until_ssh_works(
            lambda: subprocess.run(
                ["ssh", *server.ssh_options, "-o", "BatchMode=yes", server.target, "true"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=15,
            ),
            proc,
            log,
        )
        yield server
    finally:
        kill_pids([proc.pid])


@dataclass(frozen=True)
class NetnsSshd:
    """Hosts that are network namespaces (:class:`tests.integration.netns.Hosts`): host 0 is
    "your machine" (no sshd: run the launcher there), every other host runs its own sshd on
    its own address. Log in from host 0 as ``target(i)`` with ``ssh_options``."""

    hosts: Hosts
    user: str
    client_key: Path
    sshd_pids: tuple[int, ...]
    port: int = 22

    def target(self, host: int) -> str:
        return f"{self.user}@{self.hosts.addrs[host]}"

    @property
    def ssh_options(self) -> list[str]:
        return _client_options(self.client_key, self.port)


@pytest.fixture
def netns_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsSshd]:
    """Three namespaced hosts on one bridge, an sshd on hosts 1 and 2. At the end every process
    the fixture started is killed by PID and every namespace deleted (a test kills what it
    started over ssh: those processes are not the fixture's)."""
    _skip_without_openssh()
    ok, reason = netns_available()
    if not ok:
        pytest.skip(f"hosts as network namespaces: {reason}")
    d = tmp_path_factory.mktemp("netns-sshd")
    _make_keys(d)
    with Hosts(3) as hosts:
        user, port = getpass.getuser(), 22
        pids = []
        for i in (1, 2):
            config = _sshd_config(d, f"sshd{i}", hosts.addrs[i], port)
            log = d / f"sshd{i}.log"
            proc = hosts.exec(i, str(SSHD), "-D", "-f", str(config), "-e", log=log)
            pids.append(proc.pid)
            _wait_until_ssh_works(
                lambda i=i: subprocess.run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        hosts.names[0],
                        "ssh",
                        *_client_options(d / "client_key", port),
                        "-o",
                        "BatchMode=yes",
                        f"{user}@{hosts.addrs[i]}",
                        "true",
                    ],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=15,
                ),
                proc,
                log,
            )
        servers = NetnsSshd(hosts, user, d / "client_key", tuple(pids), port)
        yield servers


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real one-node Slurm cluster (munged, slurmctld, slurmd) owned by this module's tests;
    every daemon and job process is stopped by PID at teardown."""
    reason = missing()
    if reason is not None:
        pytest.skip(f"{reason} (CI installs it)")
    with one_node_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
