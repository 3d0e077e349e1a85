"""Where the roles of ``zrl run`` run and how they reach the broker, and the security policy
that comes with it.

- ``BrokerAccess``: the broker's addresses (what it binds, how local children reach it, how other
  hosts reach it) and the keys of the run: ``zrl run`` makes its own (``RUN_DIR/keys``)
  unless given some or ``--insecure``; ``zrl start broker --run-dir`` refuses to bind an
  address other hosts can reach without keys (unless ``--insecure``); roles placed on other
  hosts need a broker that binds more than loopback.
- ``placement``: which roles start here and which on each host of ``hosts``.
- ``role_trust_args``: what a role takes from its own command line rather than from the
  broker (the checkpoint root of a role on the head's host, the factory references, a module
  env id); ``remote_commands``: the exact ``zrl host`` line (the per-host agent) for every host
  with placed roles.
- ``advertised_host``: the address other hosts reach the broker at: ``broker.advertise``,
  the bound address, or the interface with the default route, else the only non-loopback
  address. Never a hostname: one that resolves to 127.0.0.1 on the other hosts sends their
  roles to themselves.

No sockets (``advertised_host`` connects a UDP socket, which sends nothing, to learn the
address of the interface with the default route).
"""

from __future__ import annotations

import os
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import Factories, env_id_module
from zrl.transport.endpoints import broker_endpoints, free_port_range, is_loopback, split_tcp
from zrl.transport.security import Keys, init_keys, load_keys


@dataclass
class BrokerAccess:
    """The broker's addresses and the keys every socket of the run uses."""

    bind_addr: str
    """What the broker binds."""
    broker_addr: str
    """How local children and our own sockets reach it (a wildcard bind over loopback)."""
    public_addr: str
    """How roles on other hosts reach it."""
    keys_dir: Path | None
    keys: Keys | None
    insecure: bool
    port_count: int = 0
    """How many ports from the base port the broker binds, where ``of`` chose them because
    they were free (no ``--port`` or ``--bind``); 0 where the user chose them."""

    def choose_other_ports(self) -> None:
        """Move to another range of free ports: another process took the chosen ones between
        ``of`` probing them and the broker binding them."""
        host, _ = split_tcp(self.broker_addr)
        base = free_port_range(self.port_count, host.strip("[]"))
        self.bind_addr, self.broker_addr, self.public_addr = (
            f"{addr.rsplit(':', 1)[0]}:{base}"
            for addr in (self.bind_addr, self.broker_addr, self.public_addr)
        )

    @classmethod
    def of(
        cls,
        cfg: ExperimentConfig,
        *,
        inproc: bool,
        port: int | None,
        keys_dir: Path | None,
        insecure: bool,
        inproc_name: str,
        bind: str | None = None,
        elsewhere: bool = False,
    ) -> BrokerAccess:
        """The addresses of a new run's broker, after the checks of the security policy
        (``ValueError`` says what to change). ``bind``: the base address to bind (``zrl start
        broker --bind``) instead of ``broker.host`` and a free port; ``elsewhere``: every role
        comes from other hosts (a head that starts none)."""
        resolved = Path(keys_dir).resolve() if keys_dir is not None else None
        keys = load_keys(resolved) if resolved is not None and not inproc else None
        n_endpoints = len(broker_endpoints("tcp://127.0.0.1:1", cfg.broker.streams))
        port_count = 0
        if inproc:
            broker_addr = f"inproc://zrl-{os.getpid()}-{inproc_name}"
            bind_addr = public_addr = broker_addr
        else:
            if bind is not None:
                host, base = split_tcp(bind)
            else:
                host = cfg.broker.host
                base = port or free_port_range(
                    n_endpoints, "127.0.0.1" if host in WILDCARDS else host
                )
                port_count = 0 if port else n_endpoints
            bind_addr = f"tcp://{host}:{base}"
            # Local children and our own sockets reach a wildcard bind over loopback.
            broker_addr = f"tcp://{'127.0.0.1' if host in WILDCARDS else host}:{base}"
            public_addr = broker_addr
        remote_roles = any(sum(h.roles.values()) for h in cfg.hosts)
        if not inproc and (remote_roles or elsewhere):
            if is_loopback(bind_addr) and not elsewhere:
                raise ValueError(
                    f"roles are placed on other hosts but the broker binds {bind_addr}, which "
                    "they cannot reach: set broker.host (e.g. --set broker.host=0.0.0.0)"
                )
            if not is_loopback(bind_addr):
                public_addr = f"tcp://{advertised_host(host, cfg.broker.advertise)}:{base}"
        # zrl run makes its own keys when given none (Supervisor.wants_run_keys); a head whose
        # roles all come from other hosts needs keys those hosts hold.
        if elsewhere and not is_loopback(bind_addr) and keys_dir is None and not insecure:
            raise ValueError(
                f"the broker would bind {bind_addr}, reachable from other hosts, without "
                "keys: pass --keys DIR (see `zrl keys init`), or --insecure to accept that"
            )
        return cls(bind_addr, broker_addr, public_addr, resolved, keys, insecure, port_count)

    def use_run_keys(self, run_dir: Path) -> None:
        """Give this run its own keys (in ``RUN_DIR/keys``, mode 0700) rather than asking the
        user for some: every socket of a run is authenticated unless the user says not."""
        directory = run_dir / "keys"
        if not (directory / "server.key_secret").is_file():  # a resumed run keeps its own
            init_keys(directory)
        self.keys_dir = directory.resolve()
        self.keys = load_keys(self.keys_dir)


WILDCARDS = ("0.0.0.0", "*")


def advertised_host(host: str, advertise: str | None) -> str:
    """The address roles on other hosts reach the broker at (see the module docstring);
    ``ValueError`` names what to set when no such address can be told."""
    if advertise:
        return advertise
    if host not in WILDCARDS:
        return host
    try:  # the address of the interface with the default route (sends nothing)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            return str(s.getsockname()[0])
    except OSError:
        pass
    addresses = non_loopback_addresses()
    if len(addresses) == 1:
        return addresses[0]
    if not addresses:
        raise ValueError(
            "this machine has no address but loopback, so roles on other hosts cannot reach "
            "the broker: connect it to their network, or set broker.advertise to an address "
            "they reach it at"
        )
    raise ValueError(
        f"no default route, and several addresses could be the one other hosts reach "
        f"({', '.join(addresses)}): set broker.advertise (e.g. --set "
        f"broker.advertise={addresses[0]})"
    )


def non_loopback_addresses() -> list[str]:
    """This machine's IPv4 addresses outside 127.0.0.0/8 (interfaces that are up)."""
    import psutil

    up = {name for name, st in psutil.net_if_stats().items() if st.isup}
    return sorted(
        a.address
        for name, addrs in psutil.net_if_addrs().items()
        if name in up
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    )


def placement(
    cfg: ExperimentConfig,
) -> tuple[list[tuple[str, int]], dict[str, list[tuple[str, int]]]]:
    """(local roles, {host name: its roles}) as (role, index) pairs.

    Indices are global per role kind: local roles take the first ones, then each host in
    the order the config lists them, so seeds and exploration stay distinct."""
    order = (
        ("params", "params"),
        ("replay", "replay"),
        ("learners", "learner"),
        ("evaluator", "evaluator"),
        ("league", "league"),
        ("inference", "inference"),
        ("pbt", "pbt"),
        ("actors", "actor"),
    )
    local: list[tuple[str, int]] = []
    remote: dict[str, list[tuple[str, int]]] = {h.name: [] for h in cfg.hosts}
    for key, role in order:
        for host, indices in cfg.indices_by_host(key).items():
            (local if host is None else remote[host]).extend((role, i) for i in indices)
    return local, remote


def role_trust_args(cfg: ExperimentConfig, factories: Factories, *, here: bool = True) -> list[str]:
    """What a role takes from its own command line rather than from the broker (see
    zrl.roles.trust: checked_checkpoint_dir, factories_from, checked_env_id): the checkpoint
    root (``here``: for a role on the head's host only; on another host the head's path means
    nothing, and the role keeps its files under its own working directory), the factory
    references of this run and its env id when that names a module."""
    args: list[str] = []
    if cfg.checkpoint.dir is not None and here:
        args += ["--checkpoint-root", str(cfg.checkpoint.dir)]
    if env_id_module(cfg.env.id) is not None:
        args += [f"--env-id={cfg.env.id}"]
    return args + factory_args(factories)


def factory_args(factories: Factories) -> list[str]:
    """The ``--env-factory``/``--model-factory`` options for the references of a run."""
    refs = factories.references
    args = [f"--env-factory={refs['env']}"] if "env" in refs else []
    return args + ([f"--model-factory={refs['model']}"] if "model" in refs else [])


def host_specs(roles: list[tuple[str, int]]) -> list[str]:
    """``zrl host`` role specs (``actor=4@2``: four actors from index 2) for one host's
    (role, index) pairs, which ``placement`` numbers consecutively per role."""
    specs: list[str] = []
    for role, index in roles:
        if specs and specs[-1].startswith(f"{role}="):
            count, first = specs[-1].split("=", 1)[1].split("@")
            if int(first) + int(count) == index:
                specs[-1] = f"{role}={int(count) + 1}@{first}"
                continue
        specs.append(f"{role}=1@{index}")
    return specs


def remote_commands(
    cfg: ExperimentConfig,
    factories: Factories,
    access: BrokerAccess,
    remote: dict[str, list[tuple[str, int]]] | None = None,
) -> dict[str, str]:
    """The ``zrl host`` line (the per-host agent: starts, restarts and stops the roles) for
    every host with roles placed on it (``remote``: the head's own placement, default the
    config's ``hosts``)."""
    keys = f" --keys {shlex.quote(str(access.keys_dir))}" if access.keys_dir is not None else ""
    trust = "".join(f" {shlex.quote(a)}" for a in role_trust_args(cfg, factories, here=False))
    addresses = {h.name: h.address for h in cfg.hosts}
    commands = {}
    for host, roles in (remote if remote is not None else placement(cfg)[1]).items():
        if not roles:
            continue
        broker = access.public_addr
        if addresses.get(host):  # how that host reaches the broker's, when it differs
            broker = f"tcp://{addresses[host]}:{split_tcp(access.public_addr)[1]}"
        specs = " ".join(host_specs(roles))
        commands[host] = f"zrl host --broker {broker}{keys}{trust} {specs}"
    return commands
