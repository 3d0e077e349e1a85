#!/usr/bin/env python3
"""Start a zrl experiment on several hosts over ssh, stream its output, stop it on Ctrl-C.

    python launchers/ssh.py HOSTS_FILE --config CONFIG [--broker-host H] [--port P]
        [--keys DIR | --insecure] [--python PYTHON] [--set KEY=VALUE ...] [--dry-run]
        [--ssh-option SSH_ARGS...]            (--ssh-option takes every argument after it)

Hosts file: one line per host, ``#`` starts a comment::

    # name  ssh target        roles (role or role=count)
    node1   root@10.0.0.1     broker params learner replay=1
    node2   root@10.0.0.2     actor=4 evaluator
    node3   10.0.0.3          actor=4

The name is only a label (the ``[node2 actor-3]`` output prefix). The ssh target is
anything ``ssh`` accepts (``host``, ``user@host``, an alias from ``~/.ssh/config``).
Roles are ``broker``, ``params``, ``replay``, ``learner``, ``evaluator``, ``league``,
``actor``; exactly one host runs the broker, at most one runs params, one the evaluator and
one the league.
Indices are global: actors are numbered 0.. across hosts in file order (so their seeds
and Ape-X epsilons differ), and so are replay shards and learners.

What it does:

1. Resolves the config locally (``--set`` overrides applied, ``roles.*`` counts set to
   what the hosts file starts) and fails before touching any host if it is invalid.
2. Starts the broker on its host over ssh (the resolved config travels inside the ssh
   command) and waits until ``zrl status``, run on that host, gets an answer.
3. Starts every other role with ``zrl start ROLE --broker ADDR --index I``.
4. Prints every line of every remote process prefixed with ``[host role-i]``.
5. On Ctrl-C/SIGTERM/SIGHUP stops the roles, then the broker, and makes sure they die.

How remote processes are made to die: each one runs under a small POSIX-shell wrapper
that starts the role in the background, prints its PID, and watches the ssh session's
stdin. The launcher never writes to that stdin; it closes it to stop the role. End of
file there (the launcher closed it, the launcher died, or the connection dropped) makes
the wrapper send SIGTERM, and SIGKILL ``--grace`` seconds later. A role still running
after that is killed with a second ``ssh TARGET kill -KILL PID``. No pty is needed
(``ssh -tt`` would mangle output and grab the local terminal).

The remote login shell must be POSIX-like (sh, bash, dash, zsh, ksh) and ``PYTHON -m
zrl`` must work there. The broker address other hosts use is ``--broker-host`` or the
host part of the broker's ssh target; set ``--broker-host`` when that target is an ssh
alias the other hosts cannot resolve. The roles only start and stop: the ``stop``
section of the config is enforced by ``zrl run`` alone, so stop a launch with Ctrl-C.

Only the standard library and zrl (to validate the config) are used.
"""

from __future__ import annotations

import argparse
import ipaddress
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TextIO

ROLES = ("broker", "params", "replay", "learner", "evaluator", "league", "actor")
"""Start order: the broker first; actors last, so the roles they feed are already up."""
SINGLETONS = ("broker", "params", "evaluator", "league")
"""Roles an experiment runs at most once (the broker exactly once)."""
CONFIG_COUNTS = {
    "actor": "actors",
    "replay": "replay",
    "params": "params",
    "learner": "learners",
    "evaluator": "evaluator",
    "league": "league",
}
"""Hosts-file role -> ``roles.*`` key of the config (actors size their epsilons by it)."""
PID_MARKER = "@zrl-launch pid="
CONFIG_EOF = "ZRL_CONFIG_EOF"
DEFAULT_SSH_OPTIONS = (
    "-T",  # no pty: clean output, and the local terminal stays ours
    "-o",
    "BatchMode=yes",  # a password prompt from N concurrent sessions would hang them all
    "-o",
    "ServerAliveInterval=10",  # a dead connection ends the session, and so the role
    "-o",
    "ServerAliveCountMax=3",
)
STATUS_INTERVAL_S = 0.5
REMOTE_KILL_TIMEOUT_S = 15.0


class HostsFileError(ValueError):
    """A hosts file that cannot be used; the message names the file and line."""


class LaunchError(RuntimeError):
    """The launch cannot go on (bad options, broker never answered); user-facing."""


# --- hosts file -------------------------------------------------------------------------


@dataclass(frozen=True)
class HostSpec:
    """One line of the hosts file."""

    name: str
    target: str
    roles: dict[str, int]
    line: int


@dataclass(frozen=True)
class Launch:
    """One remote process to start: a role, its global index (None for the broker), its host."""

    host: HostSpec
    role: str
    index: int | None

    @property
    def label(self) -> str:
        """``host role-i``: the output prefix, and how the launcher names the process."""
        name = self.role if self.index is None else f"{self.role}-{self.index}"
        return f"{self.host.name} {name}"


def parse_hosts(text: str, source: str = "hosts") -> list[HostSpec]:
    """Parse a hosts file; every error names ``source:line`` so a typo is found at once."""
    hosts: list[HostSpec] = []
    seen: dict[str, int] = {}
    totals: dict[str, list[int]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        fields = line.split()
        if len(fields) < 2:
            raise HostsFileError(
                f"{where}: expected 'HOST [user@]ssh-target ROLE[=COUNT] ...', got {line!r}"
            )
        name, target, tokens = fields[0], fields[1], fields[2:]
        if "=" in name or name in ROLES:
            raise HostsFileError(f"{where}: the first field must be the host's name, got {name!r}")
        if "=" in target or target in ROLES:
            raise HostsFileError(
                f"{where}: the second field must be the ssh target ([user@]host), got {target!r}"
            )
        if name in seen:
            raise HostsFileError(f"{where}: host {name!r} is already defined on line {seen[name]}")
        seen[name] = number
        roles: dict[str, int] = {}
        for token in tokens:
            role, has_count, count_text = token.partition("=")
            if role not in ROLES:
                raise HostsFileError(
                    f"{where}: unknown role {role!r} (roles are {', '.join(ROLES)})"
                )
            if role in roles:
                raise HostsFileError(f"{where}: role {role!r} is given twice for host {name!r}")
            count = 1
            if has_count:
                try:
                    count = int(count_text)
                except ValueError:
                    count = -1
                if count < 1:
                    raise HostsFileError(
                        f"{where}: {token!r}: the count must be a whole number >= 1"
                    )
            if role in SINGLETONS and count != 1:
                raise HostsFileError(f"{where}: {token!r}: an experiment runs one {role}")
            roles[role] = count
            totals.setdefault(role, []).append(number)
        if not roles:
            raise HostsFileError(f"{where}: host {name!r} has no roles")
        hosts.append(HostSpec(name, target, roles, number))
    if not hosts:
        raise HostsFileError(f"{source}: no hosts (one line per host: HOST TARGET ROLES...)")
    for role in SINGLETONS:
        lines = totals.get(role, [])
        if len(lines) > 1:
            raise HostsFileError(
                f"{source}:{lines[1]}: {role} is already on line {lines[0]}; "
                f"an experiment runs one {role}"
            )
    if "broker" not in totals:
        raise HostsFileError(f"{source}: no host runs the broker (add 'broker' to one line)")
    return hosts


def plan_launches(hosts: Sequence[HostSpec]) -> list[Launch]:
    """Every process to start, the broker first, indices global per role in file order."""
    launches: list[Launch] = []
    for role in ROLES:
        index = 0
        for host in hosts:
            for _ in range(host.roles.get(role, 0)):
                launches.append(Launch(host, role, None if role == "broker" else index))
                index += 1
    return launches


def role_counts(hosts: Sequence[HostSpec]) -> dict[str, int]:
    """How many of each role the hosts file starts (all roles, zero when absent)."""
    return {role: sum(h.roles.get(role, 0) for h in hosts) for role in ROLES}


# --- addresses --------------------------------------------------------------------------


def target_host(target: str) -> str:
    """The host part of an ssh target: ``user@host`` -> ``host``, ``ssh://u@h:22`` -> ``h``."""
    if target.startswith("ssh://"):
        return urllib.parse.urlsplit(target).hostname or target
    return target.rsplit("@", 1)[-1]


def is_loopback_host(host: str) -> bool:
    """Loopback addresses only this machine reaches (the broker then needs no --insecure)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tcp_address(host: str, port: int) -> str:
    """``tcp://HOST:PORT``, with IPv6 literals bracketed."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


# --- remote commands --------------------------------------------------------------------


def zrl_command(python: str, *args: str) -> list[str]:
    """``PYTHON -m zrl ARGS``; PYTHON may be a path or a short command line."""
    return [*shlex.split(python), "-m", "zrl", *args]


def remote_script(command: str, *, grace: float, config_text: str | None = None) -> str:
    """The shell script one ssh session runs: the role plus its stdin watchdog.

    ``command`` is already shell-quoted; with ``config_text`` it may use ``"$cfg"``, a
    temporary file on the remote host holding that text (removed when the role exits).
    The watchdog turns end-of-file on the session's stdin into SIGTERM then SIGKILL, so
    a role dies however the launcher or the connection ends."""
    lines = ["exec 3<&0"]  # background jobs get /dev/null as stdin: keep ours on fd 3
    if config_text is not None:
        if any(line.strip() == CONFIG_EOF for line in config_text.splitlines()):
            raise LaunchError(f"the config contains a line {CONFIG_EOF!r}")
        lines += [
            'cfg=$(mktemp "${TMPDIR:-/tmp}/zrl-config.XXXXXX") || exit 1',
            f'cat >"$cfg" <<\\{CONFIG_EOF}',
            config_text.rstrip("\n"),
            CONFIG_EOF,
        ]
    lines += [
        f"PYTHONUNBUFFERED=1 {command} </dev/null 3<&- 2>&1 &",
        "pid=$!",
        f'echo "{PID_MARKER}$pid"',
        f"(cat <&3 >/dev/null 2>&1; kill -TERM $pid 2>/dev/null; sleep {grace:g}; "
        "kill -KILL $pid 2>/dev/null) >/dev/null 2>&1 &",
        "wd=$!",
        "exec 3<&-",
        "wait $pid",
        "rc=$?",
        "kill $wd 2>/dev/null",
    ]
    if config_text is not None:
        lines.append('rm -f "$cfg"')
    lines.append("exit $rc")
    return "\n".join(lines) + "\n"


@dataclass
class Options:
    """Everything the launch needs, from the command line."""

    hosts: list[HostSpec]
    config: Path
    remote_config: bool = False
    overrides: list[str] = field(default_factory=list)
    broker_host: str | None = None
    bind_host: str | None = None
    port: int = 5555
    keys: str | None = None
    insecure: bool = False
    python: str = "python3"
    log_level: str = "INFO"
    grace: float = 10.0
    broker_timeout: float = 60.0
    connect_timeout: float = 120.0
    ssh: str = "ssh"
    ssh_options: list[str] = field(default_factory=list)


class Plan:
    """The exact commands of a launch, built (and checked) before anything starts."""

    def __init__(self, opts: Options, config_text: str | None) -> None:
        self.opts = opts
        self.launches = plan_launches(opts.hosts)
        broker = self.launches[0]
        self.broker_launch = broker
        host = opts.broker_host or target_host(broker.host.target)
        self.broker_address = tcp_address(host, opts.port)
        loopback = is_loopback_host(host)
        if loopback:
            far = [h.name for h in opts.hosts if not is_loopback_host(target_host(h.target))]
            if far:
                raise LaunchError(
                    f"the broker address {self.broker_address} is a loopback address, which "
                    f"{', '.join(far)} cannot reach: pass --broker-host"
                )
        bind_host = opts.bind_host or ("127.0.0.1" if loopback else "0.0.0.0")
        self.bind_address = tcp_address(bind_host, opts.port)
        if not is_loopback_host(bind_host) and opts.keys is None and not opts.insecure:
            raise LaunchError(
                f"the broker would bind {self.bind_address}, reachable from other hosts, and no "
                "keys are configured: anyone on the network could join this experiment. Pass "
                "--keys DIR (a `zrl keys init` directory present on every host), or --insecure "
                "to accept that."
            )
        self.config_text = config_text
        # The roles take checkpoint.dir from the broker only under a root given locally (a
        # forged WELCOME must not point them at files elsewhere): the user's own config names it.
        self.checkpoint_root = checkpoint_dir(config_text)

    # commands ------------------------------------------------------------------------

    def _common(self) -> list[str]:
        common = []
        if self.opts.keys is not None:
            common += ["--keys", self.opts.keys]
        return common + ["--log-level", self.opts.log_level]

    def role_command(self, launch: Launch) -> str:
        """The shell-quoted ``zrl start`` command line of one process."""
        o = self.opts
        if launch.role == "broker":
            head = zrl_command(o.python, "start", "broker", "--bind", self.bind_address)
            if self.config_text is not None:
                config = '--config "$cfg"'  # the temporary file remote_script writes
                sets: list[str] = []
            else:
                config = "--config " + shlex.quote(str(o.config))
                counts = role_counts(o.hosts)
                sets = [f"--set=roles.{CONFIG_COUNTS[r]}={counts[r]}" for r in CONFIG_COUNTS]
                sets = [f"--set={item}" for item in o.overrides] + sets
            tail = [*sets, *self._common(), *(["--insecure"] if o.insecure else [])]
            return f"{shlex.join(head)} {config} {shlex.join(tail)}"
        cmd = zrl_command(
            o.python, "start", launch.role, "--broker", self.broker_address,
            "--index", str(launch.index), "--connect-timeout", f"{o.connect_timeout:g}",
            *(["--checkpoint-root", self.checkpoint_root] if self.checkpoint_root else []),
            *self._common(),
        )  # fmt: skip
        return shlex.join(cmd)

    def ssh_argv(self, target: str, remote_command: str) -> list[str]:
        """``ssh [user options] [defaults] TARGET COMMAND``: ssh keeps the first value it
        sees for an option, so the user's options come first and win over the defaults."""
        return [
            *shlex.split(self.opts.ssh),
            *self.opts.ssh_options,
            *DEFAULT_SSH_OPTIONS,
            target,
            remote_command,
        ]

    def launch_argv(self, launch: Launch) -> list[str]:
        """The local ssh command that runs one role under its watchdog."""
        config = self.config_text if launch.role == "broker" else None
        script = remote_script(self.role_command(launch), grace=self.opts.grace, config_text=config)
        return self.ssh_argv(launch.host.target, script)

    def status_argv(self) -> list[str]:
        """``zrl status`` on the broker's host: asks the broker the way the roles will."""
        keys = ["--keys", self.opts.keys] if self.opts.keys is not None else []
        cmd = zrl_command(
            self.opts.python, "status", "--broker", self.broker_address, "--timeout", "2", *keys
        )
        return self.ssh_argv(self.broker_launch.host.target, shlex.join(cmd))

    def kill_argv(self, target: str, pid: int | str) -> list[str]:
        """The last resort for a role that outlived its watchdog."""
        return self.ssh_argv(target, f"kill -KILL {pid}")

    def describe(self) -> str:
        """Every command of the launch, as ``--dry-run`` prints it (copy-pasteable)."""
        out = [
            f"# broker address {self.broker_address} (the broker binds {self.bind_address})",
            f"# {self.broker_launch.label} ({self.broker_launch.host.target})",
            shlex.join(self.launch_argv(self.broker_launch)),
            f"# then, every {STATUS_INTERVAL_S:g}s for up to {self.opts.broker_timeout:g}s "
            "until the broker answers:",
            shlex.join(self.status_argv()),
        ]
        for launch in self.launches[1:]:
            out += [
                f"# {launch.label} ({launch.host.target})",
                shlex.join(self.launch_argv(launch)),
            ]
        out += [
            "# on Ctrl-C/SIGTERM: the roles, then the broker, are stopped by closing their ssh "
            "session's stdin",
            f"# (the remote wrapper sends SIGTERM, SIGKILL {self.opts.grace:g}s later); a "
            "process still there after that is killed with:",
            shlex.join(self.kill_argv("TARGET", "PID")),
        ]
        return "\n".join(out)


def checkpoint_dir(config_text: str | None) -> str | None:
    """``checkpoint.dir`` of a resolved config, or None (unset, or a --remote-config run:
    then set ZRL_CHECKPOINT_ROOT on the hosts)."""
    if config_text is None:
        return None
    import yaml

    cfg = yaml.safe_load(config_text) or {}
    value = (cfg.get("checkpoint") or {}).get("dir")
    return str(value) if value else None


def resolve_config(opts: Options) -> str | None:
    """The resolved config YAML to ship to the broker host, or None with --remote-config.

    Resolving here means a bad config or override fails before any host is touched, and
    the ``roles.*`` counts match what the hosts file starts (actors size their Ape-X
    epsilons by ``roles.actors``)."""
    if opts.remote_config:
        return None
    from zrl.config import config_to_yaml, load_config

    if opts.config.suffix == ".py":
        raise LaunchError(
            f"{opts.config} is an experiment script: copy it (and what it imports) to the "
            "broker host and pass its path there with --remote-config"
        )
    counts = role_counts(opts.hosts)
    sets = [f"roles.{CONFIG_COUNTS[r]}={counts[r]}" for r in CONFIG_COUNTS]
    return config_to_yaml(load_config(opts.config, [*opts.overrides, *sets]))


# --- running ----------------------------------------------------------------------------


class Output:
    """Prefixed lines from many threads onto one stream, never interleaved mid-line."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def line(self, prefix: str, text: str) -> None:
        with self.lock:
            try:
                self.stream.write(f"[{prefix}] {text}\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # our own output is gone (closed pipe): keep stopping the remotes


class Remote:
    """One ssh session running one role under its watchdog."""

    def __init__(self, launch: Launch, argv: list[str], output: Output) -> None:
        self.launch = launch
        self.argv = argv
        self.output = output
        self.pid: int | None = None
        self.reported = False
        # Own session: a terminal's Ctrl-C reaches the launcher only, which then stops
        # the roles in order instead of every ssh dropping its connection at once.
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, name=launch.label, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        stdout: IO[bytes] | None = self.proc.stdout
        assert stdout is not None
        for raw in stdout:
            text = raw.decode(errors="replace").rstrip("\r\n")
            if text.startswith(PID_MARKER) and self.pid is None:
                try:
                    self.pid = int(text[len(PID_MARKER) :])
                    continue
                except ValueError:
                    pass
            self.output.line(self.launch.label, text)

    def running(self) -> bool:
        return self.proc.poll() is None

    def close_stdin(self) -> None:
        """Ask the remote watchdog to stop the role (end of file on its stdin)."""
        stdin = self.proc.stdin
        if stdin is not None and not stdin.closed:
            try:
                stdin.close()
            except OSError:
                pass


class Launcher:
    """Runs a plan: broker, readiness, roles, output, and a shutdown that leaves nothing."""

    def __init__(self, plan: Plan, out: TextIO = sys.stdout) -> None:
        self.plan = plan
        self.output = Output(out)
        self.remotes: list[Remote] = []
        self.broker: Remote | None = None
        self.stop_requested = threading.Event()
        self.force = threading.Event()

    def say(self, text: str) -> None:
        self.output.line("launcher", text)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stop_requested.is_set():
            self.force.set()  # a second Ctrl-C: kill now instead of waiting
        self.stop_requested.set()

    def _install_signals(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _start(self, launch: Launch) -> Remote:
        remote = Remote(launch, self.plan.launch_argv(launch), self.output)
        self.remotes.append(remote)
        return remote

    def _wait_for_broker(self, broker: Remote) -> bool:
        """Poll ``zrl status`` on the broker host; False when stopped or the broker died."""
        deadline = time.monotonic() + self.plan.opts.broker_timeout
        argv = self.plan.status_argv()
        last = ""
        while not self.stop_requested.is_set():
            if not broker.running():
                raise LaunchError(f"the broker exited (code {broker.proc.returncode}) at start")
            try:
                done = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=20,
                    start_new_session=True,
                )
                if done.returncode == 0:
                    return True
                last = (done.stderr or done.stdout).decode(errors="replace").strip()
            except subprocess.TimeoutExpired:
                last = "zrl status timed out"
            if time.monotonic() > deadline:
                tail = last.splitlines()[-1] if last else "no output"
                raise LaunchError(
                    f"the broker at {self.plan.broker_address} did not answer `zrl status` "
                    f"within {self.plan.opts.broker_timeout:g}s: {tail}"
                )
            self.stop_requested.wait(STATUS_INTERVAL_S)
        return False

    def run(self) -> int:
        """Launch, stream until stopped, stop. 0 after a requested stop, 1 on a failure."""
        self._install_signals()
        code = 0
        try:
            plan = self.plan
            self.say(
                f"starting the broker on {plan.broker_launch.host.name}: {plan.broker_address}"
            )
            self.broker = self._start(plan.broker_launch)
            if self._wait_for_broker(self.broker):
                self.say("the broker answers; starting the roles")
                for launch in plan.launches[1:]:
                    self._start(launch)
                code = self._monitor()
        except LaunchError as exc:
            self.say(f"error: {exc}")
            code = 1
        finally:
            self.shutdown()
        return code

    def _report_exits(self, verb: str) -> None:
        for r in self.remotes:
            if not r.reported and not r.running():
                r.reported = True
                r.reader.join(timeout=1)  # its last lines first
                self.say(f"{r.launch.label} {verb} (code {r.proc.returncode})")

    def _monitor(self) -> int:
        """Report exits until a stop is asked for, the broker dies or every role has ended."""
        while not self.stop_requested.wait(0.2):
            self._report_exits("exited")
            assert self.broker is not None
            if not self.broker.running():
                self.say("the broker is gone: stopping every role")
                return 1
            roles = [r for r in self.remotes if r is not self.broker]
            if roles and not any(r.running() for r in roles):
                self.say("every role has exited: stopping the broker")
                return 1 if any(r.proc.returncode for r in roles) else 0
        self.say("stop requested: stopping the roles, then the broker")
        return 0

    def shutdown(self) -> None:
        """Roles first (they say BYE to a live broker), then the broker."""
        self._stop([r for r in self.remotes if r is not self.broker])
        if self.broker is not None:
            self._stop([self.broker])
        for r in self.remotes:
            r.reader.join(timeout=2)  # the last lines of output before we return
        self._report_exits("stopped")

    def _stop(self, remotes: list[Remote]) -> None:
        if not remotes:
            return
        for r in remotes:
            r.close_stdin()
        # The remote watchdog escalates to SIGKILL after --grace; allow the round trip.
        deadline = time.monotonic() + self.plan.opts.grace + 3
        while any(r.running() for r in remotes) and time.monotonic() < deadline:
            if self.force.wait(0.1):
                break
            self._report_exits("stopped")
        left = [r for r in remotes if r.running()]
        if not left:
            return
        self.say(f"killing what is left: {', '.join(r.launch.label for r in left)}")
        kills = [
            subprocess.Popen(
                self.plan.kill_argv(r.launch.host.target, r.pid),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for r in left
            if r.pid is not None
        ]
        for k in kills:
            try:
                k.wait(timeout=REMOTE_KILL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                k.kill()
                k.wait()
        for r in left:
            if r.running():
                r.proc.terminate()
        for r in left:
            try:
                r.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()


# --- command line -----------------------------------------------------------------------


def split_ssh_options(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Take ``--ssh-option ...`` (everything after it) out of argv.

    Options for ssh start with ``-`` and would confuse argparse, so every argument after
    ``--ssh-option`` goes to ssh as is; ``--ssh-option="-p 2222"`` also works anywhere."""
    rest: list[str] = []
    ssh: list[str] = []
    items = list(argv)
    for i, arg in enumerate(items):
        if arg == "--ssh-option":
            ssh += items[i + 1 :]
            break
        if arg.startswith("--ssh-option="):
            ssh += shlex.split(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return rest, ssh


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="launchers/ssh.py",
        description="Start a zrl experiment on several hosts over ssh (see the module docstring "
        "or docs/launchers.md for the hosts file format).",
    )
    p.add_argument("hosts_file", type=Path, help="Hosts file: HOST [user@]ssh-target ROLE[=N]...")
    p.add_argument("--config", "-c", type=Path, required=True, help="Experiment config (YAML).")
    p.add_argument(
        "--remote-config",
        action="store_true",
        help="CONFIG is a path on the broker host (e.g. an experiment script); do not ship it.",
    )
    p.add_argument(
        "--set", "-s", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="Override a config key (repeatable), as `zrl run --set`.",
    )  # fmt: skip
    p.add_argument("--broker-host", help="Address other hosts reach the broker at.")
    p.add_argument("--bind-host", help="Broker bind host (default 0.0.0.0, loopback if local).")
    p.add_argument("--port", type=int, default=5555, help="Broker base port.")
    p.add_argument("--keys", help="Key directory, at this path on every host (`zrl keys init`).")
    p.add_argument(
        "--insecure", action="store_true", help="Let the broker bind a public address without keys."
    )
    p.add_argument("--python", default="python3", help="Python on the remote hosts.")
    p.add_argument("--log-level", default="INFO", help="Roles' log level.")
    p.add_argument(
        "--grace", type=float, default=10.0, help="Seconds from SIGTERM to SIGKILL at stop."
    )
    p.add_argument(
        "--broker-timeout", type=float, default=60.0, help="Seconds to wait for the broker."
    )
    p.add_argument("--connect-timeout", type=float, default=120.0, help="Roles' --connect-timeout.")
    p.add_argument("--ssh", default="ssh", help="ssh client command.")
    p.add_argument("--dry-run", action="store_true", help="Print every command and exit.")
    p.add_argument(
        "--ssh-option",
        metavar="SSH_ARGS",
        help="Options for every ssh call; takes ALL arguments after it (put it last), "
        "e.g. --ssh-option -p 2222 -i KEY.",
    )
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Parse, plan (all checks before any ssh), then dry-run or launch. Errors exit 2."""
    out = out or sys.stdout
    args_list, ssh_options = split_ssh_options(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(args_list)
    try:
        try:
            text = args.hosts_file.read_text()
        except OSError as exc:
            raise LaunchError(f"cannot read the hosts file: {exc}") from None
        opts = Options(
            hosts=parse_hosts(text, str(args.hosts_file)),
            config=args.config,
            remote_config=args.remote_config,
            overrides=args.overrides,
            broker_host=args.broker_host,
            bind_host=args.bind_host,
            port=args.port,
            keys=args.keys,
            insecure=args.insecure,
            python=args.python,
            log_level=args.log_level,
            grace=args.grace,
            broker_timeout=args.broker_timeout,
            connect_timeout=args.connect_timeout,
            ssh=args.ssh,
            ssh_options=ssh_options,
        )
        plan = Plan(opts, resolve_config(opts))
    except (HostsFileError, LaunchError, ValueError) as exc:  # zrl's ConfigError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(plan.describe(), file=out)
        return 0
    return Launcher(plan, out).run()


if __name__ == "__main__":
    sys.exit(main())
