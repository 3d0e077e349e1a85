"""The children of ``zrl run``: the broker and every local role, started, watched, restarted
and stopped (``ChildPool``, with the pieces of ``zrl.run.children``).

A crashed child restarts with back-off, the broker at once; past ``RESTART_BUDGET``
restarts, or when a role keeps crashing before it comes up, the run fails
(``ChildPool.fatal``). Children die with the supervisor, even when it is SIGKILLed.

Sockets: throwaway DEALERs for the STATUS that tells when the broker is up.
"""

from __future__ import annotations

import json
import logging
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import zmq

from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import FACTORIES_FILE, Factories
from zrl.roles.errors import RoleError
from zrl.roles.registry_client import registry_request
from zrl.run.children import (
    STOP_GRACE_S,
    Child,
    RestartPolicy,
    launch,
    stop_in_order,
    wait_child,
)
from zrl.run.placement import BrokerAccess, factory_args, role_trust_args
from zrl.run.rundir import RunDir, log_tail
from zrl.run.zygote import Zygote
from zrl.transport import protocol as P
from zrl.transport.security import ROLE_CREDENTIAL_ENV, RUN_SECRET_ENV, role_credential

PORT_ATTEMPTS = 3
ACTOR_SHARE = 0.4
"""Of the time a deadline-bound stop has, what the actors get (their end-of-stream wait)."""
BROKER_SHARE_S = 1.5
"""Of the time a deadline-bound stop has, what is kept for the broker (the stop of the roles
elsewhere, their BYEs)."""
PORT_TAKEN = "Address already in use"
"""What the broker's log says when another process holds a port it binds (zmq's EADDRINUSE)."""


class BrokerPortTaken(RoleError):
    """The broker exited at start because another process took one of its ports."""


@dataclass(eq=False)
class ChildPool:
    """The broker and the local roles of one run, and why the run failed if they did."""

    cfg: ExperimentConfig
    factories: Factories
    rundir: RunDir
    access: BrokerAccess
    ctx: zmq.Context
    _: KW_ONLY
    inproc: bool
    log_level: str
    children: list[Child] = field(default_factory=list, init=False)
    broker: Child | None = field(default=None, init=False)
    inproc_broker: Any = field(default=None, init=False)
    zygote: Zygote = field(default_factory=Zygote, init=False)
    fatal: str = field(default="", init=False)
    """Why the run failed, for the summary."""
    fatal_tail: list[str] = field(default_factory=list, init=False)
    """The last lines of the failed role's log."""
    stop_token: str = field(default_factory=lambda: secrets.token_hex(16), init=False)
    """What our STOP_RUN carries: only this process and the broker it started know it."""
    own_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), init=False)
    """The run secret of a run without keys: the broker gets it, each role its credential."""

    others_join: bool = False
    """Roles of this run come from other processes than ours (``hosts`` places some, or a
    head that starts none): without keys they have no secret to prove their ids with."""

    @property
    def run_secret(self) -> bytes | None:
        """The secret role credentials derive from: the run keys', else this run's own; None
        (ids are claims, as --insecure accepts) for a run without keys whose roles also come
        from elsewhere, which could not prove them."""
        keys = self.access.keys
        if keys is not None and keys.run_secret:
            return keys.run_secret
        return None if self.others_join else self.own_secret

    def start_zygote(self) -> None:
        """Start the zygote, or give the one ``zrl run`` started early its log file."""
        if self.inproc:
            return
        if self.zygote.proc is not None:
            self.zygote.set_log(self.rundir.log_path("zygote"))
        else:
            self.zygote.start(self.rundir.log_path("zygote"))

    def spawn(self, child: Child) -> None:
        child.started = time.monotonic()
        if self.inproc:
            self._spawn_thread(child)
            return
        acc, run_dir = self.access, self.rundir.path
        if child.role == "broker":
            cmd = [
                "start",
                "broker",
                "--bind",
                acc.bind_addr,
                "--config",
                str(run_dir / "config.yaml"),
                "--no-preflight",  # run() made the same checks before it started the broker
            ]
            if self.factories.needs_pickle():
                cmd += ["--factories", str(run_dir / FACTORIES_FILE)]
            if acc.insecure:
                cmd += ["--insecure"]
            if self.cfg.checkpoint.dir is not None:
                # config.yaml keeps a checkpoint.dir in the run directory relative to it; the
                # broker hands the roles the resolved one (see RunDir.stored_config).
                cmd += ["--set", f"checkpoint.dir={json.dumps(self.cfg.checkpoint.dir)}"]
            cmd += factory_args(self.factories)
        else:
            trust = role_trust_args(self.cfg, self.factories)
            cmd = [
                "start",
                child.role,
                "--broker",
                acc.broker_addr,
                "--index",
                str(child.index),
                "--connect-timeout",
                "30",
                *trust,
            ]
        if acc.keys_dir is not None:
            cmd += ["--keys", str(acc.keys_dir)]
        argv = [*cmd, "--log-level", self.log_level]
        # The broker too is forked from the zygote: as a process of its own it spent 1 to 2 s
        # importing the config and the CLI before it bound, and every role waited on it.
        # The broker gets the stop token and the run secret; a role only its own credential
        # (zrl.transport.security): a child cannot take another role's id.
        secret = self.run_secret
        env = {"ZRL_STOP_TOKEN": self.stop_token} if child.role == "broker" else {}
        if secret is not None:
            env.update(
                {RUN_SECRET_ENV: secret.hex()}
                if child.role == "broker"
                else {ROLE_CREDENTIAL_ENV: role_credential(secret, child.name)}
            )
        child.proc = launch(argv, child.log_path, self.zygote, env or None)

    def _spawn_thread(self, child: Child) -> None:
        from zrl.roles import role_class

        child.stop_event = threading.Event()
        child.error = None
        role = role_class(child.role)(
            self.access.broker_addr, index=child.index, ctx=self.ctx, stop_event=child.stop_event
        )

        def target() -> None:
            try:
                role.run()
            except BaseException as exc:  # noqa: BLE001 - reported by the supervisor
                child.error = exc
                logging.getLogger("zrl").exception("%s crashed", child.name)

        child.thread = threading.Thread(target=target, name=child.name, daemon=True)
        child.thread.start()

    def start_broker(self) -> None:
        """Start the broker and wait until it answers STATUS. Ports ``zrl run`` chose because
        they were free may be taken by another process before the broker binds them: then it
        chooses others, up to ``PORT_ATTEMPTS`` times."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start_broker()
                return
            except BrokerPortTaken:
                if not self.access.port_count or attempt == PORT_ATTEMPTS:
                    raise
                logging.getLogger("zrl").warning(
                    "the broker's ports at %s were taken: choosing others", self.access.bind_addr
                )
                self.access.choose_other_ports()

    def _start_broker(self) -> None:
        addr, log_path = self.access.broker_addr, self.rundir.log_path("broker")
        if self.inproc:
            from zrl.broker.broker import Broker

            self.inproc_broker = Broker(
                addr, self.cfg, ctx=self.ctx, factories=self.factories, stop_token=self.stop_token
            )
            t = threading.Thread(target=self.inproc_broker.run, name="broker", daemon=True)
            t.start()
            self.broker = Child("broker", 0, log_path, thread=t)
        else:
            self.broker = Child("broker", 0, log_path)
            self.spawn(self.broker)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.broker.proc is not None and self.broker.proc.poll() is not None:
                tail = self.broker.log_path.read_text(errors="replace")[-2000:]
                error = BrokerPortTaken if PORT_TAKEN in tail else RoleError
                raise error(f"the broker exited at start:\n{tail}")
            try:
                registry_request(self.ctx, addr, P.Message(P.STATUS), 1.0, self.access.keys)
                return
            except RoleError:
                continue
        raise RoleError(f"the broker at {addr} did not answer within 30 s")

    def start_roles(self, plan: list[tuple[str, int]]) -> None:
        for role, index in plan:
            child = Child(role, index, self.rundir.log_path(f"{role}-{index}"))
            self.children.append(child)
            self.spawn(child)

    def check(
        self,
        registered: Callable[[str, str], dict[str, Any] | None],
        show: Callable[[str], None] | None,
    ) -> bool:
        """Restart crashed children with back-off, the broker included (roles re-register
        with a restarted broker by themselves). Past the restart budget the run stops: True,
        with ``fatal`` saying why. ``registered``: the broker's row of a role of this run
        (see RunMonitor.registered); ``show``: where a crashed role's last lines go."""
        watched = [*self.children]
        if self.broker is not None and self.broker.proc is not None:
            watched.append(self.broker)
        now = time.monotonic()
        policy = RestartPolicy.default()

        def came_up(child: Child) -> bool:
            row = registered(child.name, child.role)
            return row is not None and row.get("state") == "alive"

        for child in watched:
            code = policy.tend(child, now, self.spawn, came_up)
            # Everyone waits on the broker: bring it back at once.
            if code is not None and policy.crashed(
                child, now, show, 0.2 if child is self.broker else None
            ):
                self.fatal = (
                    f"{child.name} crashed {child.restarts + 1} times (exit code {code}); "
                    f"see {child.log_path}"
                )
                self.fatal_tail = log_tail(child.log_path)
                return True
        if self.broker is not None and self.broker.proc is None:
            if not self.broker.alive():  # in-process broker thread died: a bug, stop
                self.fatal = "the in-process broker stopped; see the log"
                return True
        return False

    def keeps_crashing(self, target_met: bool) -> None:
        """At the stop: a role whose latest lives all crashed before they came up fails the
        run, also when a time limit stopped it before the restart budget ran out (not when
        the run met its target)."""
        if self.fatal or target_met:
            return
        for child in self.children:
            if child.setup_crashes and not child.came_up:
                self.fatal = (
                    f"{child.name} crashed {child.setup_crashes} time(s) while starting (last "
                    f"exit code {child.last_exit_code}) and was not running at the stop; see "
                    f"{child.log_path}"
                )
                self.fatal_tail = log_tail(child.log_path)
                return

    def restarts(self) -> dict[str, int]:
        """Restarts per child that restarted, for the summary."""
        return {
            c.name: c.restarts
            for c in [*self.children, *([self.broker] if self.broker else [])]
            if c.restarts
        }

    def stop(
        self, before_broker: Callable[[], None] | None = None, deadline: float | None = None
    ) -> None:
        """Stop the roles (``stop_in_order``), then the broker (BYEs go through it).
        ``before_broker`` runs while the broker is still up (the head stops the roles that
        run elsewhere there). ``deadline`` (monotonic; a run stopped by a signal): all of it
        is over by then, the actors given a share of the time left, the other roles the
        rest but ``BROKER_SHARE_S``, the broker that; whatever still runs is killed."""
        if deadline is None:
            stop_in_order(self.children)
            broker_until = None
        else:
            now = time.monotonic()
            left = max(deadline - now, 0.0)
            others = max(deadline - BROKER_SHARE_S, now)
            stop_in_order(self.children, until=(min(now + ACTOR_SHARE * left, others), others))
            broker_until = deadline
        if before_broker is not None and self.broker is not None and self.broker.alive():
            before_broker()
        if self.broker is not None:
            if self.broker.proc is not None and self.broker.proc.poll() is None:
                self.broker.proc.send_signal(signal.SIGTERM)
            if self.inproc_broker is not None:
                self.inproc_broker.stop()
            if broker_until is None:
                broker_until = time.monotonic() + STOP_GRACE_S
            wait_child(self.broker, broker_until)
