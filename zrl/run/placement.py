"""Where the roles of ``zrl run`` run and how they reach the broker, and the security policy
that comes with it.

- ``BrokerAccess``: the broker's addresses (what it binds, how local children reach it, how other
  hosts reach it) and the keys of the run. ``zrl run`` refuses to bind an address other
  hosts can reach without keys (unless ``--insecure``), and to place roles on other hosts
  when the broker binds loopback only.
- ``placement``: which roles start here and which on each host of ``hosts``.
- ``role_trust_args``: what a role takes from its own command line rather than from the
  broker (the checkpoint root, the factory references); ``remote_commands``: the exact
  ``zrl start`` line for every role placed on another host.

No sockets (``public_host`` connects a UDP socket, which sends nothing, to learn the
address of the interface with the default route).
"""

from __future__ import annotations

import os
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from zrl.config import ExperimentConfig
from zrl.factories import Factories
from zrl.transport.security import Keys, init_keys, load_keys
from zrl.transport.sockets import broker_endpoints, free_port_range, is_loopback


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
    ) -> BrokerAccess:
        """The addresses of a new run's broker, after the checks of the security policy
        (``ValueError`` says what to change)."""
        resolved = Path(keys_dir).resolve() if keys_dir is not None else None
        keys = load_keys(resolved) if resolved is not None and not inproc else None
        n_endpoints = len(broker_endpoints("tcp://127.0.0.1:1", cfg.broker.streams))
        if inproc:
            broker_addr = f"inproc://zrl-{os.getpid()}-{inproc_name}"
            bind_addr = public_addr = broker_addr
        else:
            host = cfg.broker.host
            base = port or free_port_range(n_endpoints, "127.0.0.1" if host == "0.0.0.0" else host)
            bind_addr = f"tcp://{host}:{base}"
            # Local children and our own sockets reach a wildcard bind over loopback.
            broker_addr = f"tcp://{'127.0.0.1' if host == '0.0.0.0' else host}:{base}"
            public_addr = f"tcp://{cfg.broker.advertise or public_host(host)}:{base}"
        remote_roles = any(sum(h.roles.values()) for h in cfg.hosts)
        if remote_roles and not inproc and is_loopback(bind_addr):
            raise ValueError(
                f"roles are placed on other hosts but the broker binds {bind_addr}, which "
                "they cannot reach: set broker.host (e.g. --set broker.host=0.0.0.0)"
            )
        if not inproc and not is_loopback(bind_addr) and keys_dir is None and not insecure:
            raise ValueError(
                f"the broker would bind {bind_addr}, reachable from other hosts, without "
                "keys: pass --keys DIR (see `zrl keys init`), or --insecure to accept that"
            )
        return cls(bind_addr, broker_addr, public_addr, resolved, keys, insecure)

    def use_run_keys(self, run_dir: Path) -> None:
        """Pickled factories travel only over authenticated sockets: give this run its own
        keys (in ``RUN_DIR/keys``) rather than asking the user for some."""
        self.keys_dir = init_keys(run_dir / "keys").resolve()
        self.keys = load_keys(self.keys_dir)


def public_host(host: str) -> str:
    if host != "0.0.0.0":
        return host
    try:  # the address of the interface with the default route (sends nothing)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()


def placement(
    cfg: ExperimentConfig,
) -> tuple[list[tuple[str, int]], dict[str, list[tuple[str, int]]]]:
    """(local roles, {host name: its roles}) as (role, index) pairs.

    Indices are global per role kind: local roles take the first ones, then each host in
    the order the config lists them, so seeds and exploration stay distinct."""
    order = (("params", "params"), ("replay", "replay"), ("learners", "learner"),
             ("evaluator", "evaluator"), ("league", "league"), ("actors", "actor"))  # fmt: skip
    local: list[tuple[str, int]] = []
    remote: dict[str, list[tuple[str, int]]] = {h.name: [] for h in cfg.hosts}
    for key, role in order:
        total = getattr(cfg.roles, key)
        placed = sum(h.roles.get(key, 0) for h in cfg.hosts)
        index = 0
        for _ in range(total - placed):
            local.append((role, index))
            index += 1
        for h in cfg.hosts:
            for _ in range(h.roles.get(key, 0)):
                remote[h.name].append((role, index))
                index += 1
    return local, remote


def role_trust_args(cfg: ExperimentConfig, factories: Factories) -> list[str]:
    """What a role takes from its own command line rather than from the broker (see
    zrl.roles.trust: checked_checkpoint_dir, factories_from): the checkpoint root and the
    factory references of this run."""
    args: list[str] = []
    if cfg.checkpoint.dir is not None:
        args += ["--checkpoint-root", str(cfg.checkpoint.dir)]
    return args + factory_args(factories)


def factory_args(factories: Factories) -> list[str]:
    """The ``--env-factory``/``--model-factory`` options for the references of a run."""
    refs = factories.references
    args = [f"--env-factory={refs['env']}"] if "env" in refs else []
    return args + ([f"--model-factory={refs['model']}"] if "model" in refs else [])


def remote_commands(
    cfg: ExperimentConfig, factories: Factories, access: BrokerAccess
) -> dict[str, list[str]]:
    """The exact `zrl start` line for every role placed on another host."""
    keys = f" --keys {access.keys_dir}" if access.keys_dir is not None else ""
    trust = "".join(f" {shlex.quote(a)}" for a in role_trust_args(cfg, factories))
    return {
        host: [
            f"zrl start {role} --broker {access.public_addr} --index {i}{keys}{trust}"
            for role, i in roles
        ]
        for host, roles in placement(cfg)[1].items()
    }
