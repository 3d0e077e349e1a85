"""``zrl run``: the local supervisor.

Starts a broker and every role of the config as children of this process (the same
``zrl start`` commands a user would type on other hosts), or as threads over
``inproc://`` with ``--inproc``; shows live status; restarts what crashes; stops
everything at the target, at the time limit or on Ctrl-C; and writes the run
directory::

    RUN_DIR/config.yaml      the resolved config       RUN_DIR/seeds.json     per-actor seeds
    RUN_DIR/logs/<id>.log    one log per role          RUN_DIR/progress.csv   one row a second
    RUN_DIR/eval.csv         every evaluation          RUN_DIR/tensorboard/   event files
    RUN_DIR/model.pt         final weights             RUN_DIR/summary.json   how it ended

Sockets: a SUB on the topic bus (``metrics``, ``eval``) and throwaway DEALERs for
STATUS, LOOKUP and the final GET_WEIGHTS.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import zmq

from zrl.config import ConfigError, ExperimentConfig, config_to_yaml
from zrl.experiment import FACTORIES_FILE, Factories
from zrl.metrics import MetricsWriter, read_csv, require_backends
from zrl.roles.base import RoleError, registry_request
from zrl.transport import protocol as P
from zrl.transport.security import init_keys, load_keys
from zrl.transport.sockets import (
    Channel,
    TransportStats,
    broker_endpoints,
    connect_topics,
    free_port_range,
    is_loopback,
    make_socket,
)
from zrl.zygote import ForkedRole, become_subreaper

log = logging.getLogger("zrl.supervisor")

RESTART_BUDGET = 5
RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0)
STOP_GRACE_S = 10.0
MONITOR_INTERVAL_S = 0.5
PLAIN_STATUS_INTERVAL_S = 5.0
LOG_TAIL_LINES = 15  # of a crashed role's log, shown in the terminal


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a log file (empty if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - 64 * 1024, 0))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.rstrip("\n").splitlines()[-lines:]


@dataclass
class Child:
    """One role started by the supervisor (a process, or a thread with --inproc)."""

    role: str
    index: int
    log_path: Path
    proc: subprocess.Popen[bytes] | ForkedRole | None = None
    thread: threading.Thread | None = None
    stop_event: threading.Event | None = None
    error: BaseException | None = None
    restarts: int = 0
    restart_at: float | None = None
    started: float = field(default_factory=time.monotonic)
    came_up: bool = False
    """This life registered and reported alive (its setup finished)."""
    setup_crashes: int = 0
    """Lives in a row that crashed before coming up: a role that keeps crashing, not one
    that was killed while running."""
    last_exit_code: int | None = None

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return self.thread is not None and self.thread.is_alive()

    def exit_code(self) -> int | None:
        if self.proc is not None:
            return self.proc.poll()
        return 1 if self.error is not None else 0


def _set_parent_death_signal() -> None:
    # Children die with the supervisor even if it is SIGKILLed: nothing is left running.
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def count(value: Any) -> int:
    """A non-negative integer figure from a peer's metrics; anything else counts as 0.

    Metrics arrive on the open topic bus: a malformed one must not end the run."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return 0


def number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


TRAIN_ROLES = ("learner", "actor", "params", "replay", "evaluator")
TRAIN_KEY = re.compile(r"[a-z][a-z0-9_]{0,47}")
MAX_TRAIN_KEYS = 64


class Aggregator:
    """Turns the roles' latest metrics into the figures the display and CSV show."""

    def __init__(self) -> None:
        # Training figures (``train`` in METRICS) reported since the last train_row, per role.
        self._train: dict[str, tuple[str, dict[str, float]]] = {}
        self.latest: dict[str, dict[str, Any]] = {}
        self._carry: dict[tuple[str, str], int] = {}
        self._last_raw: dict[tuple[str, str], int] = {}
        self._history: list[tuple[float, int, int]] = []
        self.evals: list[dict[str, Any]] = []
        self.env_steps_offset = 0

    def on_metrics(self, meta: dict[str, Any]) -> None:
        rid = meta.get("id")
        if isinstance(rid, str):
            self.latest[rid] = meta
            train, role = meta.get("train"), meta.get("role")
            if isinstance(train, dict) and role in TRAIN_ROLES:
                # From the open topic bus: short snake_case names and finite numbers only.
                figures = {
                    k: v
                    for k, v in list(train.items())[:MAX_TRAIN_KEYS]
                    if isinstance(k, str) and TRAIN_KEY.fullmatch(k) and number(v) is not None
                }
                if figures:
                    self._train[rid] = (role, {k: float(v) for k, v in figures.items()})

    def train_row(self) -> dict[str, float]:
        """The training figures reported since the last call, as ``<role>/<name>`` tags,
        aggregated over the roles of a kind: ``*_min`` by min, ``*_max`` by max, the rest by
        the mean (of each role's running mean since its last report)."""
        gathered: dict[str, list[float]] = {}
        for role, figures in self._train.values():
            for k, v in figures.items():
                gathered.setdefault(f"{role}/{k}", []).append(v)
        self._train = {}
        out = {}
        for tag, values in sorted(gathered.items()):
            if tag.endswith("_min"):
                out[tag] = min(values)
            elif tag.endswith("_max"):
                out[tag] = max(values)
            else:
                out[tag] = sum(values) / len(values)
        return out

    def _monotonic_sum(self, role: str, key: str) -> int:
        """Sum of a counter over roles, carried across restarts (a restarted role counts from 0)."""
        total = 0
        for rid, m in self.latest.items():
            if m.get("role") != role or not isinstance(m.get(key), int):
                continue
            raw = count(m[key])
            k = (rid, key)
            if raw < self._last_raw.get(k, 0):
                self._carry[k] = self._carry.get(k, 0) + self._last_raw[k]
            self._last_raw[k] = raw
            total += raw + self._carry.get(k, 0)
        return total

    def experience(self) -> dict[str, int]:
        """The actors' delivery ledgers beside what the replay shards received. An actor
        counts a trajectory delivered only on the shard's ack of exactly that trajectory, so
        ``sent = delivered + lost + in_flight`` per actor, and ``received_by_replay`` matches
        ``delivered`` up to what was acked between two heartbeats. Anything taking experience
        off the stream but a shard shows up as ``lost``."""
        got = {}
        for unit in ("trajectories", "steps"):

            def actors(key: str, unit: str = unit) -> int:
                return self._monotonic_sum("actor", f"{unit}_{key}")

            got[f"{unit}_sent"] = actors("sent")
            got[f"{unit}_delivered"] = actors("delivered")
            # Acked after being counted lost: delivered after all.
            got[f"{unit}_lost"] = max(actors("lost") - actors("late"), 0)
            got[f"{unit}_received_by_replay"] = self._monotonic_sum("replay", f"{unit}_received")
        got["trajectories_in_flight"] = sum(count(m.get("in_flight")) for m in self._of("actor"))
        return got

    def _of(self, role: str) -> list[dict[str, Any]]:
        return [m for m in self.latest.values() if m.get("role") == role]

    def row(self, elapsed: float) -> dict[str, Any]:
        env_steps = self.env_steps_offset + self._monotonic_sum("actor", "env_steps")
        updates = self._monotonic_sum("learner", "updates")
        self._history.append((elapsed, env_steps, updates))
        # Rates over the last ~5 s, so the display reacts but does not flicker.
        while len(self._history) > 2 and elapsed - self._history[0][0] > 5.0:
            self._history.pop(0)
        t0, s0, u0 = self._history[0]
        dt = max(elapsed - t0, 1e-6)
        replays = self._of("replay")
        inserts = sum(count(m.get("inserts")) for m in replays)
        samples = sum(count(m.get("samples")) for m in replays)
        params = self._of("params")
        version = max((count(m.get("weights_version")) for m in params), default=0)
        actor_versions = [count(m.get("weights_version")) for m in self._of("actor")]
        return {
            "time": round(elapsed, 2),
            "env_steps": env_steps,
            "env_steps_per_s": round((env_steps - s0) / dt, 1) if len(self._history) > 1 else 0.0,
            "updates": updates,
            "updates_per_s": round((updates - u0) / dt, 1) if len(self._history) > 1 else 0.0,
            "replay_size": sum(count(m.get("size")) for m in replays),
            "samples_per_insert": round(samples / inserts, 2) if inserts else 0.0,
            "weights_version": version,
            # Metrics arrive at different moments: an actor may report a version params has not.
            "max_version_lag": max((max(version - v, 0) for v in actor_versions), default=0),
            "eval_return": self.evals[-1]["mean"] if self.evals else None,
        }


class Supervisor:
    def __init__(
        self,
        cfg: ExperimentConfig,
        *,
        run_dir: Path | None = None,
        inproc: bool = False,
        port: int | None = None,
        log_level: str = "INFO",
        show_status: bool = True,
        keys_dir: Path | None = None,
        factories: Factories | None = None,
        insecure: bool = False,
        resume: bool = False,
    ) -> None:
        self.resume = resume
        self.cfg = cfg
        self.factories = factories or Factories()
        self.keys_dir = Path(keys_dir).resolve() if keys_dir is not None else None
        self.keys = load_keys(self.keys_dir) if self.keys_dir is not None and not inproc else None
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_dir = (
            Path(run_dir) if run_dir else Path("runs") / f"{cfg.name}-{stamp}-{os.getpid()}"
        )
        self.inproc = inproc
        self.log_level = log_level
        self.show_status = show_status
        self.ctx: zmq.Context = zmq.Context.instance()
        n_endpoints = len(broker_endpoints("tcp://127.0.0.1:1", cfg.broker.streams))
        if inproc:
            self.broker_addr = f"inproc://zrl-{os.getpid()}-{id(self)}"
        else:
            host = cfg.broker.host
            base = port or free_port_range(n_endpoints, "127.0.0.1" if host == "0.0.0.0" else host)
            self.bind_addr = f"tcp://{host}:{base}"
            # Local children and our own sockets reach a wildcard bind over loopback.
            self.broker_addr = f"tcp://{'127.0.0.1' if host == '0.0.0.0' else host}:{base}"
            self.public_addr = f"tcp://{cfg.broker.advertise or self._public_host(host)}:{base}"
        if inproc:
            self.bind_addr = self.public_addr = self.broker_addr
        self.insecure = insecure
        remote_roles = any(sum(h.roles.values()) for h in cfg.hosts)
        if remote_roles and not inproc and is_loopback(self.bind_addr):
            raise ValueError(
                f"roles are placed on other hosts but the broker binds {self.bind_addr}, which "
                "they cannot reach: set broker.host (e.g. --set broker.host=0.0.0.0)"
            )
        if not inproc and not is_loopback(self.bind_addr) and keys_dir is None and not insecure:
            raise ValueError(
                f"the broker would bind {self.bind_addr}, reachable from other hosts, without "
                "keys: pass --keys DIR (see `zrl keys init`), or --insecure to accept that"
            )
        self.children: list[Child] = []
        self.broker_child: Child | None = None
        self.inproc_broker: Any = None
        self.agg = Aggregator()
        self.status_rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self.stop_reason = ""
        self.started = time.monotonic()
        self.target_time: float | None = None
        self.target_steps: int | None = None
        self.target_reached_at: float | None = None
        # Evals that meet the stop rule, awaiting the evaluator's heartbeat:
        # (sender, row, time, the means that met it).
        self._target_candidates: list[tuple[str, dict[str, Any], float, list[float]]] = []
        self._eval_means: dict[str, list[float]] = {}  # per evaluator, for the window rule
        self.confirming_return: float | None = None
        self._fatal = ""  # why the run failed, for the summary
        self.first_env_step: float | None = None  # seconds from our start
        self._fatal_tail: list[str] = []  # the last lines of the failed role's log
        self._display: Any = None
        self.evals_dropped = 0
        self.zygote: subprocess.Popen[str] | None = None
        self.zygote_ready = False

    # --- run directory ----------------------------------------------------------------

    def _prepare_run_dir(self) -> None:
        from zrl.runtime import actor_seed

        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        if self.cfg.checkpoint.dir is None:
            # Checkpoints live with the run, so a crashed role and `--resume` find them.
            self.cfg.checkpoint.dir = str((self.run_dir / "checkpoints").resolve())
        if self.resume:
            self._restore_counters()
        (self.run_dir / "config.yaml").write_text(config_to_yaml(self.cfg))
        seeds = {
            "run_seed": self.cfg.seed,
            "actors": {
                f"actor-{i}": actor_seed(self.cfg.seed, i) for i in range(self.cfg.roles.actors)
            },
        }
        (self.run_dir / "seeds.json").write_text(json.dumps(seeds, indent=2))
        if self.factories.needs_pickle():
            (self.run_dir / FACTORIES_FILE).write_bytes(self.factories.pickled())
            if self.keys_dir is None and not self.inproc:
                # Pickled factories travel only over authenticated sockets: give this run
                # its own keys rather than asking the user for some.
                self.keys_dir = init_keys(self.run_dir / "keys").resolve()
                self.keys = load_keys(self.keys_dir)

    # --- children ---------------------------------------------------------------------

    @staticmethod
    def _public_host(host: str) -> str:
        if host != "0.0.0.0":
            return host
        try:  # the address of the interface with the default route (sends nothing)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(("192.0.2.1", 9))
                return str(s.getsockname()[0])
        except OSError:
            return socket.gethostname()

    def placement(self) -> tuple[list[tuple[str, int]], dict[str, list[tuple[str, int]]]]:
        """(local roles, {host name: its roles}) as (role, index) pairs.

        Indices are global per role kind: local roles take the first ones, then each host in
        the order the config lists them, so seeds and exploration stay distinct."""
        order = (("params", "params"), ("replay", "replay"), ("learners", "learner"),
                 ("evaluator", "evaluator"), ("actors", "actor"))  # fmt: skip
        local: list[tuple[str, int]] = []
        remote: dict[str, list[tuple[str, int]]] = {h.name: [] for h in self.cfg.hosts}
        for key, role in order:
            total = getattr(self.cfg.roles, key)
            placed = sum(h.roles.get(key, 0) for h in self.cfg.hosts)
            index = 0
            for _ in range(total - placed):
                local.append((role, index))
                index += 1
            for h in self.cfg.hosts:
                for _ in range(h.roles.get(key, 0)):
                    remote[h.name].append((role, index))
                    index += 1
        return local, remote

    def _restore_counters(self) -> None:
        """Continue the env-step count of the run being resumed (actors count from 0)."""
        rows = (
            read_csv(self.run_dir / "progress.csv")
            if (self.run_dir / "progress.csv").is_file()
            else []
        )
        if rows:
            self.agg.env_steps_offset = int(rows[-1].get("env_steps", 0))
        log.info("resuming %s from %d env steps", self.run_dir, self.agg.env_steps_offset)

    def _role_plan(self) -> list[tuple[str, int]]:
        return self.placement()[0]

    def _role_trust_args(self) -> list[str]:
        """What a role takes from its own command line rather than from the broker (see
        Role._checked_checkpoint_dir and Role._factories_from): the checkpoint root and the
        factory references of this run."""
        args: list[str] = []
        if self.cfg.checkpoint.dir is not None:
            args += ["--checkpoint-root", str(self.cfg.checkpoint.dir)]
        refs = self.factories.references
        args += [f"--env-factory={refs['env']}"] if "env" in refs else []
        args += [f"--model-factory={refs['model']}"] if "model" in refs else []
        return args

    def remote_commands(self) -> dict[str, list[str]]:
        """The exact `zrl start` line for every role placed on another host."""
        keys = f" --keys {self.keys_dir}" if self.keys_dir is not None else ""
        trust = "".join(f" {shlex.quote(a)}" for a in self._role_trust_args())
        return {
            host: [
                f"zrl start {role} --broker {self.public_addr} --index {i}{keys}{trust}"
                for role, i in roles
            ]
            for host, roles in self.placement()[1].items()
        }

    def _spawn(self, child: Child) -> None:
        child.started = time.monotonic()
        if self.inproc:
            self._spawn_thread(child)
            return
        if child.role == "broker":
            cmd = [
                "start",
                "broker",
                "--bind",
                self.bind_addr,
                "--config",
                str(self.run_dir / "config.yaml"),
                "--no-preflight",  # run() made the same checks before it started the broker
            ]
            if self.factories.needs_pickle():
                cmd += ["--factories", str(self.run_dir / FACTORIES_FILE)]
            if self.insecure:
                cmd += ["--insecure"]
            refs = self.factories.references
            cmd += [f"--env-factory={refs['env']}"] if "env" in refs else []
            cmd += [f"--model-factory={refs['model']}"] if "model" in refs else []
        else:
            cmd = ["start", child.role, "--broker", self.broker_addr, "--index", str(child.index),
                   "--connect-timeout", "30", *self._role_trust_args()]  # fmt: skip
        if self.keys_dir is not None:
            cmd += ["--keys", str(self.keys_dir)]
        argv = [*cmd, "--log-level", self.log_level]
        if child.role != "broker":
            forked = self._fork_from_zygote(argv, child.log_path)
            if forked is not None:
                child.proc = forked
                return
        logf = open(child.log_path, "ab")  # noqa: SIM115 - the child owns it from here
        child.proc = subprocess.Popen(
            [sys.executable, "-m", "zrl", *cmd, "--log-level", self.log_level],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_set_parent_death_signal if sys.platform.startswith("linux") else None,
        )
        logf.close()

    # --- the zygote: roles forked from one pre-imported process ------------------------

    def _start_zygote(self) -> None:
        """Start importing torch & co. in the zygote while the broker starts (see zrl.zygote).
        Without a subreaper (not Linux) roles are plain subprocesses."""
        if self.inproc or os.environ.get("ZRL_NO_ZYGOTE") or not become_subreaper():
            return
        self.zygote = subprocess.Popen(
            [sys.executable, "-m", "zrl.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.run_dir / "logs" / "zygote.log", "ab"),  # noqa: SIM115
            text=True,
            bufsize=1,
            preexec_fn=_set_parent_death_signal,
        )

    def _zygote_call(self, request: dict[str, Any] | None) -> dict[str, Any] | None:
        assert self.zygote is not None and self.zygote.stdin and self.zygote.stdout
        try:
            if request is not None:
                self.zygote.stdin.write(json.dumps(request) + "\n")
                self.zygote.stdin.flush()
            line = self.zygote.stdout.readline()
            return json.loads(line) if line else None
        except (OSError, ValueError):
            return None

    def _fork_from_zygote(self, argv: list[str], log_path: Path) -> ForkedRole | None:
        if self.zygote is None:
            return None
        if not self.zygote_ready:
            self.zygote_ready = (self._zygote_call(None) or {}).get("ready") is True
        reply = (
            self._zygote_call({"argv": argv, "log": str(log_path)}) if self.zygote_ready else None
        )
        if reply is None or "pid" not in reply:
            log.warning("the zygote failed (%s): starting roles as plain processes", reply)
            self._stop_zygote()
            return None
        return ForkedRole(int(reply["pid"]))

    def _stop_zygote(self) -> None:
        if self.zygote is not None:
            if self.zygote.stdin:
                self.zygote.stdin.close()
            try:
                self.zygote.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.zygote.kill()
                self.zygote.wait(timeout=5)
            if self.zygote.stdout:
                self.zygote.stdout.close()
            self.zygote = None

    def _spawn_thread(self, child: Child) -> None:
        from zrl.roles import role_class

        child.stop_event = threading.Event()
        child.error = None
        role = role_class(child.role)(
            self.broker_addr, index=child.index, ctx=self.ctx, stop_event=child.stop_event
        )

        def target() -> None:
            try:
                role.run()
            except BaseException as exc:  # noqa: BLE001 - reported by the supervisor
                child.error = exc
                logging.getLogger("zrl").exception("%s crashed", child.name)

        child.thread = threading.Thread(target=target, name=child.name, daemon=True)
        child.thread.start()

    def _start_broker(self) -> None:
        if self.inproc:
            from zrl.broker import Broker

            self.inproc_broker = Broker(
                self.broker_addr, self.cfg, ctx=self.ctx, factories=self.factories
            )
            t = threading.Thread(target=self.inproc_broker.run, name="broker", daemon=True)
            t.start()
            self.broker_child = Child("broker", 0, self.run_dir / "logs" / "broker.log", thread=t)
        else:
            self.broker_child = Child("broker", 0, self.run_dir / "logs" / "broker.log")
            self._spawn(self.broker_child)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.broker_child.proc is not None and self.broker_child.proc.poll() is not None:
                tail = self.broker_child.log_path.read_text(errors="replace")[-2000:]
                raise RoleError(f"the broker exited at start:\n{tail}")
            try:
                registry_request(self.ctx, self.broker_addr, P.Message(P.STATUS), 1.0, self.keys)
                return
            except RoleError:
                continue
        raise RoleError(f"the broker at {self.broker_addr} did not answer within 30 s")

    def _start_roles(self) -> None:
        for role, index in self._role_plan():
            child = Child(role, index, self.run_dir / "logs" / f"{role}-{index}.log")
            self.children.append(child)
            self._spawn(child)

    def _check_children(self) -> None:
        """Restart crashed children with back-off, the broker included (roles re-register
        with a restarted broker by themselves). Past the restart budget the run stops."""
        watched = [*self.children]
        if self.broker_child is not None and self.broker_child.proc is not None:
            watched.append(self.broker_child)
        now = time.monotonic()
        for child in watched:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restart_at = None
                    child.restarts += 1
                    log.warning("restarting %s (restart %d of %d)", child.name, child.restarts,
                                RESTART_BUDGET)  # fmt: skip
                    child.came_up = False
                    self._spawn(child)
                continue
            if child.alive():
                if not child.came_up:
                    registered = self._registered(child.name, child.role)
                    if registered is not None and registered.get("state") == "alive":
                        child.came_up, child.setup_crashes = True, 0
                continue
            code = child.exit_code()
            child.last_exit_code = code
            child.setup_crashes += 0 if child.came_up else 1
            if child.restarts == 0:
                # The reason is in the role's log: show it, not only the log's name.
                self._show_tail(child, f"{child.name} exited with code {code}")
            if child.restarts >= RESTART_BUDGET:
                self.stop_reason = "error"
                self._fatal = (
                    f"{child.name} crashed {child.restarts + 1} times (exit code {code}); "
                    f"see {child.log_path}"
                )
                self._fatal_tail = log_tail(child.log_path)
                self._stop.set()
                return
            delay = RESTART_BACKOFF_S[min(child.restarts, len(RESTART_BACKOFF_S) - 1)]
            if child is self.broker_child:
                delay = 0.2  # everyone waits on the broker: bring it back at once
            log.warning("%s exited with code %s; restarting in %.1fs (log: %s)", child.name, code,
                        delay, child.log_path)  # fmt: skip
            child.restart_at = now + delay
        if self.broker_child is not None and self.broker_child.proc is None:
            if not self.broker_child.alive():  # in-process broker thread died: a bug, stop
                self.stop_reason = "error"
                self._fatal = "the in-process broker stopped; see the log"
                self._stop.set()

    def _show_tail(self, child: Child, headline: str) -> None:
        tail = log_tail(child.log_path)
        if self._display is None or not tail:  # (--inproc roles log to logs/inproc.log)
            return
        self._display.message(f"{headline}; the last lines of {child.log_path}:")
        for line in tail:
            self._display.message(f"  | {line}")

    def _keeps_crashing(self) -> None:
        """At the stop: a role whose latest lives all crashed before they came up fails the
        run, also when a time limit stopped it before the restart budget ran out."""
        if self._fatal or self.target_time is not None:
            return
        for child in self.children:
            if child.setup_crashes and not child.came_up:
                self._fatal = (
                    f"{child.name} crashed {child.setup_crashes} time(s) while starting (last "
                    f"exit code {child.last_exit_code}) and was not running at the stop; see "
                    f"{child.log_path}"
                )
                self._fatal_tail = log_tail(child.log_path)
                return

    def _stop_children(self) -> None:
        """Stop in data-flow order: actors first (their end-of-stream wait needs the replay
        shards alive to acknowledge), then everyone else, the broker last (BYEs go through it)."""
        for group in (
            [c for c in self.children if c.role == "actor"],
            [c for c in self.children if c.role != "actor"],
        ):
            for child in group:
                child.restart_at = None
                if child.proc is not None and child.proc.poll() is None:
                    child.proc.send_signal(signal.SIGTERM)
                if child.stop_event is not None:
                    child.stop_event.set()
            deadline = time.monotonic() + STOP_GRACE_S
            for child in group:
                self._wait_child(child, deadline)
        if self.broker_child is not None:
            if self.broker_child.proc is not None and self.broker_child.proc.poll() is None:
                self.broker_child.proc.send_signal(signal.SIGTERM)
            if self.inproc_broker is not None:
                self.inproc_broker.stop()
            self._wait_child(self.broker_child, time.monotonic() + STOP_GRACE_S)

    @staticmethod
    def _wait_child(child: Child, deadline: float) -> None:
        if child.proc is not None:
            try:
                child.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time: killing it", child.name)
                child.proc.kill()
                child.proc.wait(timeout=5)
        elif child.thread is not None:
            child.thread.join(timeout=max(deadline - time.monotonic(), 0.1))

    # --- monitoring -------------------------------------------------------------------

    def _open_monitor(self) -> Channel:
        endpoints = broker_endpoints(self.broker_addr, self.cfg.broker.streams)
        sock = make_socket(self.ctx, zmq.SUB, rcvhwm=10_000, rcvtimeo_ms=0, keys=self.keys,
                           max_message_bytes=self.cfg.broker.max_message_bytes)  # fmt: skip
        for topic in (P.METRICS_TOPIC, P.EVAL_TOPIC):
            sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        connect_topics(sock, endpoints)
        return Channel(sock, "monitor", "supervisor", TransportStats(), topics=True)

    def _drain_monitor(self, monitor: Channel, writer: MetricsWriter, elapsed: float) -> None:
        while True:
            got = monitor.recv(block=False)
            if got is None:
                return
            meta = got[1].meta
            if meta.get("kind") == "eval":
                sender = got[1].sender
                if self._registered(sender, "evaluator") is None:
                    # Anyone who reaches the topic bus can publish an eval; only our own
                    # evaluators, registered with the broker, report results.
                    self.evals_dropped += 1
                    monitor._drop(sender or "?", "eval from no registered evaluator of this run")
                    continue
                if number(meta.get("mean")) is None:
                    monitor._drop(got[1].sender or "?", "eval result without a numeric mean")
                    continue
                row = {k: number(meta.get(k)) for k in ("mean", "std", "min", "max")}
                row["std"] = row["std"] or 0.0
                row["weights_version"] = count(meta.get("weights_version"))
                row["episodes"] = count(meta.get("episodes"))
                row["time"] = round(elapsed, 2)
                row["env_steps"] = self.agg.row(elapsed)["env_steps"]
                row["confirming"] = meta.get("confirming") is True
                self.agg.evals.append(row)
                writer.write_eval(row)
                self._check_eval_target(row, sender)
            else:
                self.agg.on_metrics(meta)
                if (
                    self.first_env_step is None
                    and meta.get("role") == "actor"
                    and count(meta.get("env_steps")) > 0
                ):
                    # Actors report once a second: this is when we heard of the first step.
                    self.first_env_step = round(elapsed, 2)

    def stop_rule(self) -> str:
        """The stop rule on evaluations, in words (for the summary and the README)."""
        s = self.cfg.stop
        if s.eval_return is None:
            return "no eval_return target"
        if s.confirm == "fresh":
            return (f"an evaluation reaches {s.eval_return:g}, then a confirming evaluation of "
                    f"{s.eval_episodes} fresh episodes with the same weights reaches it too")  # fmt: skip
        return f"the mean of the last {s.eval_window} evaluations reaches {s.eval_return:g}"

    def _check_eval_target(self, row: dict[str, Any], sender: str) -> None:
        """Note an eval that meets the stop rule; `_confirm_target` stops the run on it."""
        s = self.cfg.stop
        means = [*self._eval_means.get(sender, []), row["mean"]][-s.eval_window :]
        self._eval_means[sender] = means
        if s.eval_return is None or self.target_time is not None:
            return
        if s.confirm == "fresh":
            met = [row["mean"]] if row["confirming"] else []
        else:
            met = means if len(means) >= s.eval_window else []
        if met and sum(met) / len(met) >= s.eval_return:
            self._target_candidates = [*self._target_candidates[-7:],
                                       (sender, row, time.time(), met)]  # fmt: skip

    def _confirm_target(self) -> None:
        """Stop at the target once the evaluator's own heartbeat reports the evaluations that
        met the rule too.

        The sender name of a topic-bus message can be forged; a heartbeat comes only from
        the connection the evaluator registered on (the broker drops others). It carries the
        means of the evaluator's latest evaluations (rounded to 2 places), and the latest
        confirming one: a candidate counts only if every mean it was met with is among them
        in that order, so no forged eval can complete a window."""
        target = self.cfg.stop.eval_return
        if target is None or self.target_time is not None:
            return
        fresh = self.cfg.stop.confirm == "fresh"
        for sender, hit, wall, met in self._target_candidates:
            row = self._registered(sender, "evaluator")
            info = row.get("info") if row is not None else None
            if not isinstance(info, dict):
                continue
            mine: list[float | None] = [round(m, 2) for m in met]
            if fresh:
                reported = [number(info.get("confirming_return"))]
            else:
                recent = info.get("recent_returns")
                # An evaluator without the list (an older one) reports its latest mean only.
                reported = recent if isinstance(recent, list) else [info.get("eval_return")]
                reported = [number(v) for v in reported]
            runs = [reported[i : i + len(mine)] for i in range(len(reported) - len(mine) + 1)]
            if mine not in runs:
                continue
            self.target_time = hit["time"]
            self.target_reached_at = wall
            self.target_steps = hit["env_steps"]
            self.confirming_return = round(sum(met) / len(met), 2)
            self.stop_reason = "eval_return"
            self._stop.set()
            return

    def _registered(self, rid: Any, role: str) -> dict[str, Any] | None:
        """The broker's row for ``rid`` if it is one of this run's ``role`` roles, live, and
        (when we started it here) run by the process we started; else None."""
        local, remote = self.placement()
        planned = [*local, *(x for roles in remote.values() for x in roles)]
        if not isinstance(rid, str) or rid not in {f"{r}-{i}" for r, i in planned if r == role}:
            return None
        row = next((r for r in self.status_rows if r.get("id") == rid), None)
        if row is None or row.get("role") != role or row.get("state") not in ("starting", "alive"):
            return None
        child = next((c for c in self.children if c.name == rid), None)
        if child is not None and child.proc is not None and row.get("pid") != child.proc.pid:
            return None
        return row

    def _check_limits(self, row: dict[str, Any]) -> None:
        s = self.cfg.stop
        if s.env_steps is not None and row["env_steps"] >= s.env_steps:
            self.stop_reason = self.stop_reason or "env_steps"
            self._stop.set()
        if s.wall_time is not None and row["time"] >= s.wall_time:
            self.stop_reason = self.stop_reason or "wall_time"
            self._stop.set()

    def _refresh_status(self) -> None:
        try:
            reply = registry_request(
                self.ctx, self.broker_addr, P.Message(P.STATUS), 0.5, self.keys
            )
            self.status_rows = reply.meta.get("roles", [])
        except RoleError:
            pass

    # --- finish -----------------------------------------------------------------------

    def _final_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """The figures at the stop, from the roles' last heartbeats: metrics come once a
        second, so a run stopped between two of them would under-report what its roles did."""
        self._refresh_status()
        for r in self.status_rows:
            info = r.get("info")
            if isinstance(info, dict) and isinstance(r.get("id"), str) and r.get("state") != "dead":
                previous = self.agg.latest.get(r["id"], {})
                self.agg.on_metrics({**previous, **info, "id": r["id"], "role": r.get("role")})
        return self.agg.row(time.monotonic() - self.started) if self.status_rows else row

    def _save_model(self) -> int | None:
        import torch

        from zrl.roles.weights import request_latest_weights

        try:
            services = registry_request(
                self.ctx,
                self.broker_addr,
                P.Message(P.LOOKUP, meta={"role": "params"}),
                2.0,
                self.keys,
            ).meta.get("services", [])
        except RoleError:
            return None
        # Only our own params server: another registered 'params' role could serve anything.
        services = [
            s for s in services if isinstance(s, dict) and self._registered(s.get("id"), "params")
        ]
        msg = request_latest_weights(
            self.ctx, services, self.cfg.broker.max_message_bytes, 5.0, self.keys
        )
        if msg is None:
            return None
        torch.save(
            {
                "weights": {k: torch.from_numpy(v.copy()) for k, v in msg.arrays.items()},
                "version": msg.meta.get("version"),
                "config": json.dumps(self.cfg.model_dump(mode="json")),
                "factory_refs": self.factories.references,
            },
            self.run_dir / "model.pt.tmp",
        )
        os.replace(self.run_dir / "model.pt.tmp", self.run_dir / "model.pt")
        return int(msg.meta.get("version", 0))

    # --- main -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        from zrl.display import StatusDisplay
        from zrl.preflight import check_env

        # Before the run directory exists, so a mistyped env id leaves nothing behind; the
        # model is checked once the zygote has imported torch (_check_model).
        spaces = check_env(self.cfg, self.factories)
        self._prepare_run_dir()
        self._fatal = ""
        if self.inproc:
            from zrl.runtime import setup_logging

            setup_logging(self.log_level)
            handler = logging.FileHandler(self.run_dir / "logs" / "inproc.log")
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(name)s: %(message)s")
            )
            logging.getLogger().addHandler(handler)
        require_backends(self.cfg.logging)  # a missing W&B/MLflow extra stops us here
        # Roles fork from the zygote once it has imported torch: start it before anything
        # here imports torch too (the TensorBoard writer does), so the two overlap.
        self._start_zygote()
        try:
            self._check_model(spaces)
        except BaseException:
            self._stop_zygote()
            raise
        writer = MetricsWriter(
            self.run_dir, logging=self.cfg.logging, config=self.cfg.model_dump(mode="json")
        )
        display = StatusDisplay(self, enabled=self.show_status)
        self._display = display
        interrupted = False
        previous_handlers: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous_handlers[sig] = signal.signal(sig, self._on_signal)
        summary: dict[str, Any] = {}
        row: dict[str, Any] = {}
        try:
            display.message(f"run directory: {self.run_dir}")
            self._start_broker()
            (self.run_dir / "broker_address").write_text(self.broker_addr + "\n")
            if not self.inproc:
                display.message(
                    f"broker: {self.broker_addr}  (zrl status --broker {self.broker_addr})"
                )
                self._announce_remote(display)
            self._start_roles()
            monitor = self._open_monitor()
            display.start()
            next_row = time.monotonic()
            next_confirm = 0.0
            while not self._stop.is_set():
                elapsed = time.monotonic() - self.started
                self._drain_monitor(monitor, writer, elapsed)
                if self._target_candidates and time.monotonic() >= next_confirm:
                    # The evaluator's next heartbeat is at most heartbeat_interval away.
                    next_confirm = time.monotonic() + 0.25
                    self._refresh_status()
                    self._confirm_target()
                if time.monotonic() >= next_row:
                    next_row += 1.0
                    self._refresh_status()
                    self._check_children()
                    row = self.agg.row(elapsed)
                    writer.write_progress(row)
                    writer.write_train(row["env_steps"], self.agg.train_row(), elapsed)
                    self._check_limits(row)
                    display.update(row)
                self._stop.wait(MONITOR_INTERVAL_S / 5)
            monitor.close()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            display.stop()
            if self.stop_reason == "interrupted":
                interrupted = True
            try:
                if self.broker_child is not None:
                    row = self._final_row(row)
                version = self._save_model() if self.broker_child is not None else None
            finally:
                self._stop_children()
                self._stop_zygote()
                writer.close()
                for sig, h in previous_handlers.items():
                    signal.signal(sig, h)
            self._keeps_crashing()
            summary = self._summary(row, version, interrupted)
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            if self.agg.evals:
                try:
                    from zrl.metrics import plot_run

                    plot_run(self.run_dir)
                except Exception as exc:  # noqa: BLE001 - a plot must not fail the run
                    log.warning("could not plot the learning curve: %s", exc)
            display.final(summary)
        return summary

    def _check_model(self, spaces: tuple[Any, Any]) -> None:
        """Build the model as the roles will, before any starts: in a child forked from the
        zygote, which imports torch anyway. Importing torch here too would take seconds of
        CPU from the roles' start-up."""
        from zrl.preflight import check_model

        log_path = self.run_dir / "logs" / "preflight.log"
        argv = ["config", "check", str(self.run_dir / "config.yaml")]
        if self.factories.needs_pickle():
            argv += ["--factories", str(self.run_dir / FACTORIES_FILE)]
        refs = self.factories.references
        argv += [f"--env-factory={refs['env']}"] if "env" in refs else []
        argv += [f"--model-factory={refs['model']}"] if "model" in refs else []
        forked = self._fork_from_zygote(argv, log_path)
        if forked is None:  # no zygote: --inproc, not Linux, or it failed
            check_model(self.cfg, *spaces, self.factories)
            return
        if forked.wait() != 0:
            lines = log_path.read_text(errors="replace").splitlines()
            errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
            raise ConfigError(
                errors[-1] if errors else f"the preflight check failed: see {log_path}"
            )

    def _announce_remote(self, display: Any) -> None:
        commands = self.remote_commands()
        if not commands:
            return
        lines = []
        for host, cmds in commands.items():
            lines.append(f"# on {host}:")
            lines += cmds
        (self.run_dir / "remote_commands.txt").write_text("\n".join(lines) + "\n")
        display.message("start these on the other hosts (also in remote_commands.txt):")
        for line in lines:
            display.message(f"  {line}")

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stop_reason == "interrupted":
            raise KeyboardInterrupt
        self.stop_reason = "interrupted"
        self._stop.set()

    def _summary(
        self, row: dict[str, Any], version: int | None, interrupted: bool
    ) -> dict[str, Any]:
        evals = self.agg.evals
        return {
            "experiment": self.cfg.name,
            "run_dir": str(self.run_dir),
            "stop_reason": "interrupted" if interrupted else (self.stop_reason or "unknown"),
            "error": self._fatal or None,
            # A run that met its target is a success even if some role crashed on the way.
            "failed": bool(self._fatal) and self.target_time is None,
            "error_log_tail": self._fatal_tail or None,
            "reached_target": self.target_time is not None,
            "target_return": self.cfg.stop.eval_return,
            "seconds_to_target": self.target_time,
            "target_reached_at": self.target_reached_at,
            "env_steps_to_target": self.target_steps,
            "wall_time": round(time.monotonic() - self.started, 2),
            "seconds_to_first_env_step": self.first_env_step,
            "env_steps": row.get("env_steps", 0),
            "updates": row.get("updates", 0),
            "experience": self.agg.experience(),
            "stop_rule": self.stop_rule(),
            # The mean that met the stop rule; best and last are single evaluations, and a
            # best at the target alone is not a solved task.
            "confirming_eval_return": self.confirming_return,
            "best_eval_return": max(e["mean"] for e in evals) if evals else None,
            "last_eval_return": evals[-1]["mean"] if evals else None,
            "final_eval_return": evals[-1]["mean"] if evals else None,  # = last, for old readers
            "evaluations": len(evals),
            "evals_dropped": self.evals_dropped,
            "weights_version": version,
            "model": str(self.run_dir / "model.pt") if version is not None else None,
            "restarts": {
                c.name: c.restarts
                for c in [*self.children, *([self.broker_child] if self.broker_child else [])]
                if c.restarts
            },
        }
