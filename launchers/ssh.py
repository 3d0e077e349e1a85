#!/usr/bin/env python3
"""Start a zrl experiment on several hosts over ssh, stream its output, end with its head.

    python launchers/ssh.py HOSTS_FILE --config CONFIG [--broker-host H] [--port P]
        [--keys DIR | --insecure] [--run-dir DIR] [--log-dir DIR] [--python PYTHON]
        [--set KEY=VALUE ...] [--dry-run] [--ssh-option SSH_ARGS...]
        (--ssh-option takes every argument after it)

Hosts file: one line per host, ``#`` starts a comment::

    # name  ssh target        roles (role or role=count)
    node1   root@10.0.0.1     broker params learner replay=1
    node2   root@10.0.0.2     actor=4 evaluator
    node3   10.0.0.3          actor=4

The name is a label (the ``[node2 host]`` output prefix, and the host's name in the run's
placement). The ssh target is anything ``ssh`` accepts (``host``, ``user@host``, an alias from
``~/.ssh/config``). Roles are ``broker``, ``params``, ``replay``, ``learner``, ``evaluator``,
``league``, ``actor``; exactly one host runs the broker, at most one runs params, one the
evaluator and one the league. Indices are global: actors are numbered 0.. across hosts in
file order (so their seeds and Ape-X epsilons differ), and so are replay shards and learners.

What it does:

1. Resolves the config locally (``--set`` overrides applied; ``roles.*`` counts and the
   ``hosts`` placement set from the hosts file; ``checkpoint.dir`` defaulted to
   ``RUN_DIR/checkpoints``) and fails before touching any host if it is invalid.
2. Starts the experiment's **head** on the broker's host over ssh (the resolved config travels
   inside the ssh command): ``zrl start broker --run-dir RUN_DIR --config ... --bind ...``, the
   broker plus ``zrl run``'s supervisor with every role elsewhere. It writes RUN_DIR on that
   host (progress.csv, eval.csv, summary.json, model.pt), waits for every role to register,
   and enforces the config's ``stop`` by telling every role to stop. The launcher waits until
   ``zrl status``, run on that host, gets an answer.
3. Starts one **host agent** per host with roles, the broker's host included:
   ``zrl host --broker ADDR ... ROLE=N@FIRST ...``. The agent starts that host's roles, logs
   each to a file on that host (``--log-dir``/HOST/ROLE-I.log; it prints where), restarts
   one that crashes, and exits 0 once the broker says the experiment stopped.
4. Prints every line of the head and the agents prefixed ``[node1 head]``, ``[node2 host]``.
5. Ends when the head exits: waits (at most ``AGENT_EXIT_WAIT_S``) for the agents to exit by
   themselves, stops what is left, and exits with the head's exit code (0: the run ended as
   its config says; 1: it failed). On Ctrl-C/SIGTERM/SIGHUP it stops the head first (which
   stops every role and writes the run directory), then the agents the same way.

How remote processes are made to die: each one runs under a small POSIX-shell wrapper
that starts the head or agent in the background, prints its PID, and watches the ssh
session's stdin. The launcher never writes to that stdin; it closes it to stop the process.
End of file there (the launcher closed it, the launcher died, or the connection dropped)
makes the wrapper send SIGTERM, and SIGKILL ``--grace`` seconds later (``--head-grace`` for
the head, which needs the time to stop the run everywhere). On SIGTERM the head and the
agents stop their own children. A process still running after that is killed with a second
``ssh TARGET kill -KILL PID``. No pty is needed (``ssh -tt`` would mangle output and grab
the local terminal).

The remote login shell must be POSIX-like (sh, bash, dash, zsh, ksh) and ``PYTHON -m
zrl`` must work there. The broker address other hosts use is ``--broker-host`` or the
host part of the broker's ssh target; set ``--broker-host`` when that target is an ssh
alias the other hosts cannot resolve.

Only the standard library and zrl (to validate the config) are used.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import IO, TextIO

ROLES = ("broker", "params", "replay", "learner", "evaluator", "league", "actor")
"""Hosts-file roles, in the order indices are given (the order of ``zrl run``'s placement)."""
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
AGENT_EXIT_WAIT_S = 30.0
"""After the head: how long the agents get to exit by themselves (they hear the stop from the
broker while the head keeps it up, so this is a bound, not a wait)."""
HEAD_FINISH_S = 60.0
"""After every agent exited 0 (the stop reached them): how long the head gets to write the run
directory and exit before the launcher stops it."""


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
    """One ssh session: the head (``zrl start broker --run-dir``) on the broker's host, or one
    host's agent (``zrl host``) with its ``ROLE=N@FIRST`` specs."""

    host: HostSpec
    kind: str
    """``head`` or ``host``."""
    specs: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``host head`` / ``host host``: the output prefix, and how the launcher names it."""
        return f"{self.host.name} {self.kind}"


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


def role_indices(hosts: Sequence[HostSpec]) -> dict[str, list[tuple[str, int]]]:
    """{host name: its (role, index) pairs}, the broker aside. Indices are global per role,
    in file order, as ``zrl run``'s placement numbers the ``hosts`` of a config."""
    placed: dict[str, list[tuple[str, int]]] = {h.name: [] for h in hosts}
    for role in ROLES[1:]:
        index = 0
        for host in hosts:
            for _ in range(host.roles.get(role, 0)):
                placed[host.name].append((role, index))
                index += 1
    return placed


def host_specs(roles: Sequence[tuple[str, int]]) -> list[str]:
    """``zrl host`` specs for one host's (role, index) pairs: ``actor=4@2`` is four actors from
    index 2 (one host's roles of a kind have consecutive indices)."""
    specs: dict[str, tuple[int, int]] = {}
    for role, index in roles:
        count, first = specs.get(role, (0, index))
        specs[role] = (count + 1, first)
    return [f"{role}={count}@{first}" for role, (count, first) in specs.items()]


def plan_launches(hosts: Sequence[HostSpec]) -> list[Launch]:
    """The head first, then one agent per host with roles other than the broker, in file
    order."""
    head = next(Launch(h, "head") for h in hosts if "broker" in h.roles)
    placed = role_indices(hosts)
    agents = [Launch(h, "host", tuple(host_specs(placed[h.name]))) for h in hosts]
    return [head, *(a for a in agents if a.specs)]


def role_counts(hosts: Sequence[HostSpec]) -> dict[str, int]:
    """How many of each role the hosts file starts (all roles, zero when absent)."""
    return {role: sum(h.roles.get(role, 0) for h in hosts) for role in ROLES}


def placement_json(hosts: Sequence[HostSpec]) -> str:
    """The config's ``hosts`` section for this hosts file, as JSON (which ``--set`` reads as
    YAML): the head then names each host in its waiting notices and in summary.json."""
    return json.dumps(
        [
            {
                "name": h.name,
                "roles": {CONFIG_COUNTS[r]: n for r, n in h.roles.items() if r != "broker"},
            }
            for h in hosts
            if any(r != "broker" for r in h.roles)
        ],
        separators=(",", ":"),
    )


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
    run_dir: str | None = None
    log_dir: str | None = None
    python: str = "python3"
    log_level: str = "INFO"
    grace: float = 10.0
    head_grace: float = 60.0
    broker_timeout: float = 60.0
    connect_timeout: float = 120.0
    ssh: str = "ssh"
    ssh_options: list[str] = field(default_factory=list)
    env_factory: str | None = None
    model_factory: str | None = None
    env_id: str | None = None


def default_run_dir(name: str, now: datetime | None = None) -> str:
    """``runs/<config name>-<timestamp>``, relative to the head's working directory (the ssh
    login directory of the broker's host)."""
    return f"runs/{name}-{(now or datetime.now()):%Y%m%d-%H%M%S}"


class Plan:
    """The exact commands of a launch, built (and checked) before anything starts."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.launches = plan_launches(opts.hosts)
        self.head_launch = self.launches[0]
        self.agent_launches = self.launches[1:]
        self.broker_host = opts.broker_host or target_host(self.head_launch.host.target)
        self.broker_address = tcp_address(self.broker_host, opts.port)
        loopback = is_loopback_host(self.broker_host)
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
        self.run_dir = ""
        self.checkpoint_root = ""
        """Every agent's --checkpoint-root: the config's checkpoint.dir."""
        self.config_text: str | None = None
        """The resolved config shipped to the head (None with --remote-config)."""
        self.head_sets: list[str] = []
        """--set options of the head (with --remote-config: the user's, then the launcher's)."""
        if opts.remote_config:
            self._plan_remote_config()
        else:
            self._resolve_config()
        self.log_dir = opts.log_dir or f"zrl-logs/{PurePosixPath(self.run_dir).name}"

    def _launch_sets(self, checkpoint_dir: str | None) -> list[str]:
        """What the launcher sets in the config: the role counts and placement of the hosts
        file, the address the hosts reach the broker at, and (when the config has none) a
        checkpoint directory relative to each role's working directory, which every role
        accepts (see --checkpoint-root) whatever the host's login directory is."""
        counts = role_counts(self.opts.hosts)
        advertise = self.broker_host.strip("[]")
        sets = [f"roles.{CONFIG_COUNTS[r]}={counts[r]}" for r in CONFIG_COUNTS]
        sets += [f"hosts={placement_json(self.opts.hosts)}", f"broker.advertise={advertise}"]
        if checkpoint_dir is None:
            sets.append(f"checkpoint.dir={self.run_dir}/checkpoints")
        return sets

    def _resolve_config(self) -> None:
        """Resolving here means a bad config or override fails before any host is touched."""
        from zrl.config.experiment import config_to_yaml, load_config

        o = self.opts
        if o.config.suffix == ".py":
            raise LaunchError(
                f"{o.config} is an experiment script: copy it (and what it imports) to the "
                "broker host and pass its path there with --remote-config"
            )
        cfg = load_config(o.config, o.overrides)
        self.run_dir = o.run_dir or default_run_dir(cfg.name)
        cfg = load_config(o.config, [*o.overrides, *self._launch_sets(cfg.checkpoint.dir)])
        self.config_text = config_to_yaml(cfg)
        self.checkpoint_root = str(cfg.checkpoint.dir)

    def _plan_remote_config(self) -> None:
        """CONFIG is a path on the broker's host: the launcher's settings travel as --set. Its
        ``checkpoint.dir`` is RUN_DIR/checkpoints unless a --set here names one."""
        o = self.opts
        self.run_dir = o.run_dir or default_run_dir(o.config.stem)
        given = [s.split("=", 1)[1] for s in o.overrides if s.startswith("checkpoint.dir=")]
        sets = self._launch_sets(given[-1] if given else None)
        self.head_sets = [*o.overrides, *sets]
        self.checkpoint_root = given[-1] if given else f"{self.run_dir}/checkpoints"

    # commands ------------------------------------------------------------------------

    def _common(self) -> list[str]:
        common = []
        if self.opts.keys is not None:
            common += ["--keys", self.opts.keys]
        return common + ["--log-level", self.opts.log_level]

    def head_command(self) -> str:
        """The shell-quoted ``zrl start broker --run-dir`` command line of the head."""
        o = self.opts
        head = zrl_command(
            o.python, "start", "broker", "--run-dir", self.run_dir, "--bind", self.bind_address
        )
        factories = [("--env-factory", o.env_factory), ("--model-factory", o.model_factory)]
        head += [arg for option, ref in factories if ref for arg in (option, ref)]
        if self.config_text is not None:
            config = '--config "$cfg"'  # the temporary file remote_script writes
        else:
            config = "--config " + shlex.quote(str(o.config))
        sets = [f"--set={item}" for item in self.head_sets]
        tail = [*sets, *self._common(), *(["--insecure"] if o.insecure else [])]
        return f"{shlex.join(head)} {config} {shlex.join(tail)}"

    def agent_command(self, launch: Launch) -> str:
        """The shell-quoted ``zrl host`` command line of one host's agent."""
        o = self.opts
        cmd = zrl_command(
            o.python,
            "host",
            "--broker",
            self.broker_address,
            "--connect-timeout",
            f"{o.connect_timeout:g}",
            "--log-dir",
            f"{self.log_dir}/{launch.host.name}",
            "--checkpoint-root",
            self.checkpoint_root,
            *self._common(),
            *self._references(),
            *launch.specs,
        )
        return shlex.join(cmd)

    def _references(self) -> list[str]:
        """What the agents' roles may import when the broker names it without keys: the env
        and model factories and a module env id (``zrl host --env-factory ...``)."""
        o = self.opts
        refs = (
            ("--env-factory", o.env_factory),
            ("--model-factory", o.model_factory),
            ("--env-id", o.env_id),
        )
        return [arg for option, ref in refs if ref for arg in (option, ref)]

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
        """The local ssh command that runs the head or an agent under its watchdog."""
        if launch.kind == "head":
            script = remote_script(
                self.head_command(), grace=self.opts.head_grace, config_text=self.config_text
            )
        else:
            script = remote_script(self.agent_command(launch), grace=self.opts.grace)
        return self.ssh_argv(launch.host.target, script)

    def status_argv(self) -> list[str]:
        """``zrl status`` on the broker's host: asks the broker the way the roles will."""
        keys = ["--keys", self.opts.keys] if self.opts.keys is not None else []
        cmd = zrl_command(
            self.opts.python, "status", "--broker", self.broker_address, "--timeout", "2", *keys
        )
        return self.ssh_argv(self.head_launch.host.target, shlex.join(cmd))

    def kill_argv(self, target: str, pid: int | str) -> list[str]:
        """The last resort for a process that outlived its watchdog."""
        return self.ssh_argv(target, f"kill -KILL {pid}")

    def describe(self) -> str:
        """Every command of the launch, as ``--dry-run`` prints it (copy-pasteable)."""
        head = self.head_launch
        out = [
            f"# broker address {self.broker_address} (the broker binds {self.bind_address})",
            f"# run directory {self.run_dir} on {head.host.name}; role logs in "
            f"{self.log_dir}/HOST/ on each host",
            f"# {head.label} ({head.host.target})",
            shlex.join(self.launch_argv(head)),
            f"# then, every {STATUS_INTERVAL_S:g}s for up to {self.opts.broker_timeout:g}s "
            "until the broker answers:",
            shlex.join(self.status_argv()),
        ]
        for launch in self.agent_launches:
            out += [
                f"# {launch.label} ({launch.host.target}): {' '.join(launch.specs)}",
                shlex.join(self.launch_argv(launch)),
            ]
        out += [
            "# the launch ends when the head exits (its exit code is the launcher's); the agents "
            f"then get {AGENT_EXIT_WAIT_S:g}s to exit by themselves",
            "# a process is stopped by closing its ssh session's stdin (the remote wrapper sends "
            f"SIGTERM, SIGKILL {self.opts.grace:g}s later,",
            f"# {self.opts.head_grace:g}s for the head); one still there after that is killed "
            "with:",
            shlex.join(self.kill_argv("TARGET", "PID")),
        ]
        return "\n".join(out)


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
    """One ssh session running the head or an agent under its watchdog."""

    def __init__(self, launch: Launch, argv: list[str], output: Output) -> None:
        self.launch = launch
        self.argv = argv
        self.output = output
        self.pid: int | None = None
        self.reported = False
        # Own session: a terminal's Ctrl-C reaches the launcher only, which then stops
        # things in order instead of every ssh dropping its connection at once.
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
        """Ask the remote watchdog to stop the process (end of file on its stdin)."""
        stdin = self.proc.stdin
        if stdin is not None and not stdin.closed:
            try:
                stdin.close()
            except OSError:
                pass


class Launcher:
    """Runs a plan: the head, readiness, the agents, output, and an end that leaves nothing."""

    def __init__(self, plan: Plan, out: TextIO = sys.stdout) -> None:
        self.plan = plan
        self.output = Output(out)
        self.remotes: list[Remote] = []
        self.head: Remote | None = None
        self.failed = False
        """The launch itself went wrong (a start error, agents that all failed): exit 1."""
        self.stop_requested = threading.Event()
        self.force = threading.Event()
        self.stop_signal: int | None = None
        """The signal that asked this launcher to stop (SIGINT: Ctrl-C), if one did."""

    @property
    def agents(self) -> list[Remote]:
        return [r for r in self.remotes if r is not self.head]

    def say(self, text: str) -> None:
        self.output.line("launcher", text)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stop_requested.is_set():
            self.force.set()  # a second Ctrl-C: kill now instead of waiting
        self.stop_signal = self.stop_signal or signum
        self.stop_requested.set()

    def _install_signals(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _start(self, launch: Launch) -> Remote:
        remote = Remote(launch, self.plan.launch_argv(launch), self.output)
        self.remotes.append(remote)
        return remote

    def _wait_for_broker(self, head: Remote) -> bool:
        """Poll ``zrl status`` on the broker's host; False when stopped or the head died."""
        deadline = time.monotonic() + self.plan.opts.broker_timeout
        argv = self.plan.status_argv()
        last = ""
        while not self.stop_requested.is_set():
            if not head.running():
                raise LaunchError(f"the head exited (code {head.proc.returncode}) at start")
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
        """Launch, stream until the head exits or a stop is asked for, end. The head's exit
        code (128 + the signal's number when a signal stopped the launcher and the run had not
        failed: 130 for Ctrl-C); 1 when the launch itself failed."""
        self._install_signals()
        plan = self.plan
        head = plan.head_launch
        try:
            self.say(
                f"starting the head on {head.host.name}: broker {plan.broker_address}, run "
                f"directory {plan.run_dir} (on {head.host.name})"
            )
            self.head = self._start(head)
            if self._wait_for_broker(self.head):
                self.say(
                    f"the broker answers; starting the host agents (role logs in "
                    f"{plan.log_dir}/HOST/ on each host)"
                )
                for launch in plan.agent_launches:
                    self._start(launch)
                self._monitor()
        except LaunchError as exc:
            self.say(f"error: {exc}")
            self.failed = True
        finally:
            self.shutdown()
        code = self.head.proc.returncode if self.head is not None else None
        if self.failed or code is None:
            return 1
        self.say(f"run directory: {plan.run_dir} on {head.host.name}")
        if self.stop_signal is not None and code != 1:
            # Stopped by our signal (the head heard it as the SIGTERM we sent): the signal's
            # code, as a shell counts it (130 for Ctrl-C); a failed run stays a failure.
            return 128 + self.stop_signal
        return code

    def _report_exits(self, verb: str) -> None:
        for r in self.remotes:
            if not r.reported and not r.running():
                r.reported = True
                r.reader.join(timeout=1)  # its last lines first
                self.say(f"{r.launch.label} {verb} (code {r.proc.returncode})")

    def _monitor(self) -> None:
        """Report exits until the head exits or a stop is asked for. Agents that have all
        exited stop the head: at once when one failed, else when it has not finished within
        HEAD_FINISH_S (they exit 0 when the broker says the experiment stopped)."""
        assert self.head is not None
        agents_ended: float | None = None
        while not self.stop_requested.wait(0.2):
            self._report_exits("exited")
            if not self.head.running():
                return
            agents = self.agents
            if not agents or any(a.running() for a in agents):
                continue
            if any(a.proc.returncode for a in agents):
                self.say("every host agent has exited, not all cleanly: stopping the head")
                self.failed = True
                return
            agents_ended = agents_ended or time.monotonic()
            if time.monotonic() - agents_ended > HEAD_FINISH_S:
                self.say(
                    f"the head did not end within {HEAD_FINISH_S:g}s of the last host "
                    "agent: stopping it"
                )
                self.failed = True
                return
        self.say("stop requested: stopping the head (it stops every role), then the host agents")

    def shutdown(self) -> None:
        """The head first: told to stop (SIGTERM) it stops every role through the broker and
        writes the run directory. The agents hear that stop from the broker and exit by
        themselves; those still running after AGENT_EXIT_WAIT_S are stopped, then the head."""
        if self.head is not None and self.head.running():
            self.head.close_stdin()
        deadline = time.monotonic() + AGENT_EXIT_WAIT_S
        while any(a.running() for a in self.agents) and time.monotonic() < deadline:
            if self.force.wait(0.1):
                break
            self._report_exits("exited")
        self._stop(self.agents, self.plan.opts.grace)
        if self.head is not None:
            self._stop([self.head], self.plan.opts.head_grace)
        for r in self.remotes:
            r.reader.join(timeout=2)  # the last lines of output before we return
        self._report_exits("stopped")

    def _stop(self, remotes: list[Remote], grace: float) -> None:
        remotes = [r for r in remotes if r.running()]
        if not remotes:
            return
        for r in remotes:
            r.close_stdin()
        # The remote watchdog escalates to SIGKILL after its grace; allow the round trip.
        deadline = time.monotonic() + grace + 3
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
        "--set",
        "-s",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Override a config key (repeatable), as `zrl run --set`.",
    )
    p.add_argument("--broker-host", help="Address other hosts reach the broker at.")
    p.add_argument("--bind-host", help="Broker bind host (default 0.0.0.0, loopback if local).")
    p.add_argument("--port", type=int, default=5555, help="Broker base port.")
    p.add_argument("--keys", help="Key directory, at this path on every host (`zrl keys init`).")
    p.add_argument(
        "--insecure", action="store_true", help="Let the broker bind a public address without keys."
    )
    p.add_argument(
        "--run-dir",
        help="The head's run directory on the broker's host (default runs/<config name>-"
        "<timestamp>, relative to the ssh login directory).",
    )
    p.add_argument(
        "--log-dir",
        help="Role logs on each host go to LOG_DIR/<host name>/ (default zrl-logs/<run "
        "directory name>, relative to the ssh login directory).",
    )
    p.add_argument("--python", default="python3", help="Python on the remote hosts.")
    p.add_argument("--log-level", default="INFO", help="Log level of the head, agents and roles.")
    p.add_argument(
        "--grace", type=float, default=10.0, help="Seconds from SIGTERM to SIGKILL at stop."
    )
    p.add_argument(
        "--head-grace",
        type=float,
        default=60.0,
        help="The same for the head, which stops every role and writes the run directory.",
    )
    p.add_argument(
        "--broker-timeout", type=float, default=60.0, help="Seconds to wait for the broker."
    )
    p.add_argument(
        "--connect-timeout", type=float, default=120.0, help="Agents' and roles' --connect-timeout."
    )
    p.add_argument(
        "--env-factory",
        help="Env factory package.module:name: the head's, and the agents' roles may import it.",
    )
    p.add_argument(
        "--model-factory",
        help="Model factory package.module:name: the head's, and the agents' roles may import it.",
    )
    p.add_argument(
        "--env-id",
        help="A module env.id (package.module:Env-v0) the agents' roles may import.",
    )
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
            run_dir=args.run_dir,
            log_dir=args.log_dir,
            python=args.python,
            log_level=args.log_level,
            grace=args.grace,
            head_grace=args.head_grace,
            broker_timeout=args.broker_timeout,
            connect_timeout=args.connect_timeout,
            ssh=args.ssh,
            ssh_options=ssh_options,
            env_factory=args.env_factory,
            model_factory=args.model_factory,
            env_id=args.env_id,
        )
        plan = Plan(opts)
    except (HostsFileError, LaunchError, ValueError) as exc:  # zrl's ConfigError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(plan.describe(), file=out)
        return 0
    return Launcher(plan, out).run()


if __name__ == "__main__":
    sys.exit(main())
