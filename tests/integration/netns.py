"""Network namespaces as "hosts" for multi-host tests and benchmarks (needs root and iproute2).

``Hosts(n)`` builds, inside its own namespaces only::

    zrl-sw-XXXX   "switch": bridge br0 with one port per host (h0, h1, ...)
    zrl-h0-XXXX   eth0 = 10.213.N.1/24  <-veth->  zrl-sw-XXXX:h0
    zrl-h1-XXXX   eth0 = 10.213.N.2/24  <-veth->  zrl-sw-XXXX:h1
    ...

Each veth pair is created directly between a host namespace and the switch namespace
(``ip -n HOST link add eth0 type veth peer name hI netns SWITCH``), so the root namespace's
interfaces, routes and addresses are never touched. ``lo`` is up in every namespace.

``exec()`` starts a process inside a namespace and remembers it; leaving the context (also
on an exception) kills every started process by PID (SIGTERM, then SIGKILL) and deletes
every namespace, which deletes the veths and the bridge with them. ``ip netns exec`` execs
the command, so the PID of the returned Popen is the command's own (e.g. python's).

Only used by tests and benchmarks; this module imports nothing from zrl.
"""

from __future__ import annotations

import ctypes
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]
SUBNET_PREFIX = "10.213"
IP_TIMEOUT_S = 10.0


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the message has the command and its stderr."""


def _ip(*args: str) -> str:
    cmd = ["ip", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(cmd)}: {exc}") from None
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


@functools.lru_cache(maxsize=1)
def netns_available() -> tuple[bool, str]:
    """Whether this process can build namespaces joined by veths and a bridge; else why not."""
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "network namespaces need root (ip netns add); not running as root"
    if shutil.which("ip") is None:
        return False, "iproute2's `ip` command is not installed"
    suffix = secrets.token_hex(3)
    a, b = f"zrl-probe-a-{suffix}", f"zrl-probe-b-{suffix}"
    made: list[str] = []
    try:
        for ns in (a, b):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("-n", a, "link", "add", "br0", "type", "bridge")
        _ip("-n", b, "link", "add", "eth0", "type", "veth", "peer", "name", "p0", "netns", a)
        _ip("-n", a, "link", "set", "p0", "master", "br0")
    except NetnsError as exc:
        return False, f"cannot build network namespaces here: {exc}"
    finally:
        for ns in made:
            try:
                _ip("netns", "del", ns)
            except NetnsError:
                pass
    return True, "ok"


def _pdeathsig() -> None:
    # Runs in the child before exec: die with the test process even if it is SIGKILLed.
    # (`ip netns exec` then execs the command; the setting survives a non-setuid exec.)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def kill_procs(procs: list[subprocess.Popen[Any]], grace: float = 5.0) -> None:
    """SIGTERM every process still running, wait up to ``grace`` s in all, SIGKILL the rest."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
                pass


class Hosts:
    """``n`` namespaced hosts on one bridged /24; a context manager that always cleans up."""

    def __init__(self, n: int, *, subnet: int | None = None, prefix: str = "zrl") -> None:
        if not 1 <= n <= 250:
            raise ValueError(f"1..250 hosts, not {n}")
        self.n = n
        self.suffix = secrets.token_hex(2)
        # The addresses exist only inside our namespaces, so parallel runs cannot clash even
        # on the same subnet; a random one still keeps logs of parallel runs apart.
        self.subnet = subnet if subnet is not None else 1 + secrets.randbelow(254)
        self.switch = f"{prefix}-sw-{self.suffix}"
        self.names = [f"{prefix}-h{i}-{self.suffix}" for i in range(n)]
        self.addrs = [f"{SUBNET_PREFIX}.{self.subnet}.{i + 1}" for i in range(n)]
        self.procs: list[subprocess.Popen[Any]] = []
        self.proc_ns: dict[int, str] = {}
        self._made: list[str] = []

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> Hosts:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        self._add_ns(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, (ns, addr) in enumerate(zip(self.names, self.addrs, strict=True)):
            self._add_ns(ns)
            port = f"h{i}"
            _ip(
                "-n",
                ns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                self.switch,
            )
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        # With STP off a bridge port forwards as soon as it is up; wait for that anyway.
        for i, ns in enumerate(self.names):
            self._wait_up(ns, f"h{i}")

    def _wait_up(self, ns: str, port: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            host_side = _ip("-n", ns, "link", "show", "eth0")
            switch_side = _ip("-n", self.switch, "-d", "link", "show", port)
            if "LOWER_UP" in host_side and "state forwarding" in switch_side:
                return
            if time.monotonic() > deadline:
                raise NetnsError(f"link of {ns} not up after {timeout}s: {host_side} {switch_side}")
            time.sleep(0.05)

    def close(self) -> None:
        """Kill every started process by PID, then delete every namespace we made. The test is
        over: a role still waiting for acks from a host that is gone gets 2 s, not 5."""
        kill_procs(self.procs, grace=2.0)
        errors = []
        for ns in reversed(self._made):
            try:
                _ip("netns", "del", ns)
            except NetnsError as exc:
                errors.append(str(exc))
        self._made.clear()
        if errors:
            raise NetnsError("; ".join(errors))

    # --- processes ------------------------------------------------------------------------

    def ns(self, host: int | str) -> str:
        return self.names[host] if isinstance(host, int) else host

    def exec(
        self,
        host: int | str,
        *cmd: str,
        log: str | Path | None = None,
        env: dict[str, str] | None = None,
        cwd: Path = REPO,
    ) -> subprocess.Popen[bytes]:
        """Start ``cmd`` inside a host's namespace, in ``cwd`` (output to ``log``); killed at
        cleanup."""
        ns = self.ns(host)
        out: IO[bytes] | int = subprocess.DEVNULL
        if log is not None:
            out = open(log, "ab")  # noqa: SIM115 - the child keeps its own descriptor
        try:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, *cmd],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                env=env,
                preexec_fn=_pdeathsig,
            )
        finally:
            if not isinstance(out, int):
                out.close()
        self.procs.append(proc)
        self.proc_ns[proc.pid] = ns
        return proc

    def zrl(
        self, host: int | str, *args: str, log: str | Path | None = None, cwd: Path = REPO
    ) -> subprocess.Popen[bytes]:
        """``python -m zrl ARGS`` inside a host's namespace, in ``cwd``."""
        return self.exec(host, sys.executable, "-m", "zrl", *args, log=log, cwd=cwd)

    def run(
        self,
        host: int | str,
        *cmd: str,
        timeout: float = 30.0,
        check: bool = False,
        cwd: Path = REPO,
    ) -> subprocess.CompletedProcess[str]:
        """Run a short command inside a host's namespace, in ``cwd``, and return its output."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.ns(host), *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
        if check and done.returncode != 0:
            raise NetnsError(
                f"{' '.join(cmd)} in {self.ns(host)}: exit {done.returncode}: "
                f"{done.stderr.strip()[-2000:]}"
            )
        return done

    def pids_in(self, host: int | str) -> list[int]:
        """PIDs of the processes started in a host's namespace."""
        ns = self.ns(host)
        return [pid for pid, n in self.proc_ns.items() if n == ns]

    def netns_of(self, pid: int) -> str | None:
        """Which of our namespaces a running process is in (by the namespace inode)."""
        try:
            ino = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            return None
        for ns in [self.switch, *self.names]:
            try:
                if os.stat(f"/run/netns/{ns}").st_ino == ino:
                    return ns
            except OSError:
                continue
        return None

    def unplug(self, host: int | str) -> None:
        """Pull a host's cable: delete its veth (both ends); its processes keep running."""
        _ip("-n", self.ns(host), "link", "del", "eth0")

    def kill9(self, host: int | str) -> list[int]:
        """SIGKILL every process we started in a host's namespace; their PIDs."""
        pids = []
        for p in self.procs:
            if self.proc_ns.get(p.pid) == self.ns(host) and p.poll() is None:
                p.kill()
                p.wait(timeout=5)
                pids.append(p.pid)
        return pids
