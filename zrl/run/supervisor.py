"""The head of an experiment: ``zrl run``, and ``zrl start broker --run-dir``.

Starts a broker and every role of the config placed here as children of this process (the
same ``zrl start`` commands a user would type on other hosts), or as threads over
``inproc://`` with ``--inproc``; prints the ``zrl host`` line for every other host, waits
for the roles placed there and names the missing ones; shows live status; restarts what
crashes here (the per-host agents restart theirs); stops the experiment everywhere at the
target, at the time limit or on Ctrl-C (STOP_RUN: every role's next heartbeat ack says
stop); and writes the run directory. ``zrl start broker --run-dir DIR`` is the same head
with no role placed here (``elsewhere``): every role registers from wherever it was
started, by hand, by ``zrl host`` or by a launcher.

``Supervisor`` wires the parts together and runs the monitor loop; the jobs are theirs:
``sizing`` (what ``roles.actors: auto`` comes to here), ``placement`` (the broker's
addresses, where each role runs, the security policy), ``roster`` (which roles were placed
where, which took part, which never came), ``rundir`` (the run directory, summary.json,
model.pt: the weights that met the stop rule), ``pool`` and ``children`` (starting,
restarting and stopping the broker and the roles, the zygote), ``monitor`` (what the head
hears: metrics and evals, the registry's rows, STOP_RUN), ``aggregator`` (the figures of
the live status, progress.csv and the summary) and ``stop_rule`` (the target and the
limits).

Sockets: none of its own; ``monitor`` owns the SUB on the topic bus and the DEALERs for
STATUS and STOP_RUN, ``rundir`` the LOOKUP and the final GET_WEIGHTS.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import zmq

from zrl.config.experiment import ConfigError, ExperimentConfig
from zrl.config.factories import FACTORIES_FILE, Factories
from zrl.roles.evaluated_weights import Evaluated
from zrl.run.aggregator import Aggregator, count, number
from zrl.run.children import Child
from zrl.run.learning import ProgressWatch, did_not_learn
from zrl.run.metrics import (
    MetricsWriter,
    ScalarWriter,
    exploitability_summary,
    league_figures,
    league_record,
    reference_rates,
    require_backends,
)
from zrl.run.monitor import RunMonitor
from zrl.run.placement import BrokerAccess, factory_args, placement, remote_commands
from zrl.run.pool import ChildPool
from zrl.run.roster import ANY_HOST, Roster
from zrl.run.rundir import RunDir, SavedModels, refuse_taken
from zrl.run.sizing import resolve_auto_roles
from zrl.run.stop_rule import StopRule
from zrl.run.zygote import Zygote
from zrl.utils.durable import atomic_write_text

log = logging.getLogger("zrl.supervisor")

MONITOR_INTERVAL_S = 0.5
LEAGUE_CSV_INTERVAL_S = 10.0
"""Seconds between two records of league.csv (only when the league played games since)."""
MISSING_NOTICE_S = 15.0
"""How often the head names the placed roles that have not registered yet."""
RESUME_RUN = "zrl run --resume"
RESUME_HEAD = "zrl start broker --resume"
INTERRUPT_STOP_S = 7.0
"""Seconds from Ctrl-C (or SIGTERM) by which the head has stopped every role, here and
elsewhere (what still runs is killed), so that it has written summary.json and exited within
10 s even on a loaded machine."""
INTERRUPT_PLOT_S = 4.0
"""Seconds from Ctrl-C past which the head skips the learning curve (``zrl plot`` makes it)."""
INTERRUPT_WEIGHTS_S = 2.0
"""How long, after Ctrl-C, the head waits for the params server's final weights."""


def preload_finish_modules(with_torch: bool) -> threading.Thread:
    """Import what the end of a run needs (matplotlib for the learning curve; with
    ``with_torch``, torch to write model.pt, where no zygote child writes it:
    ``zrl.run.model_files``) in a thread, once the roles are collecting: at the stop those
    imports took 2-4 s of a loaded machine between the stop rule and summary.json, while the
    run itself can spare them (the head is mostly idle). Not at the start, where they would
    take CPU from the roles starting up."""

    def load() -> None:
        try:
            import matplotlib

            if with_torch:
                import torch  # noqa: F401

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - imported again where used, failing there
            log.debug("preloading the end-of-run modules failed: %s", exc)

    thread = threading.Thread(target=load, name="preload-finish", daemon=True)
    thread.start()
    return thread


class Supervisor:
    """One ``zrl run``: its broker and roles, from the start to summary.json."""

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
        bind: str | None = None,
        elsewhere: bool = False,
        preflight: bool = True,
        zygote: Zygote | None = None,
    ) -> None:
        self.resume = resume
        self.elsewhere = elsewhere
        self.preflight = preflight
        # roles.actors: auto becomes a number before config.yaml and the broker's spec see it.
        cfg, self.sizing = resolve_auto_roles(cfg)
        self.cfg = cfg
        self.factories = factories or Factories()
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.rundir = RunDir(
            Path(run_dir) if run_dir else Path("runs") / f"{cfg.name}-{stamp}-{os.getpid()}",
            cfg,
            self.factories,
        )
        if not resume:  # a new run never writes over another one's directory
            refuse_taken(self.rundir.path, RESUME_HEAD if elsewhere else RESUME_RUN)
        self.inproc = inproc
        self.log_level = log_level
        self.show_status = show_status
        self.ctx: zmq.Context = zmq.Context.instance()
        self.access = BrokerAccess.of(
            cfg,
            inproc=inproc,
            port=port,
            keys_dir=keys_dir,
            insecure=insecure,
            inproc_name=str(id(self)),
            bind=bind,
            elsewhere=elsewhere,
        )
        self.pool = ChildPool(
            cfg,
            self.factories,
            self.rundir,
            self.access,
            self.ctx,
            inproc=inproc,
            log_level=log_level,
        )
        self.pool.others_join = elsewhere or any(sum(h.roles.values()) for h in cfg.hosts)
        if zygote is not None:  # started by the caller while it read the config: ours now
            self.pool.zygote = zygote
        self.agg = Aggregator()
        self.target = StopRule(cfg)
        self.progress = ProgressWatch(cfg)
        self._read_after_stop = False
        """Whether the registry's rows were read once the roles had stopped."""
        self._stop = threading.Event()
        self.stop_reason = ""
        self.stop_signal: int | None = None
        """The signal that stopped the run (SIGINT for Ctrl-C), None when nothing did."""
        self._finishing = False  # roles being stopped and the run directory written
        self._starting = False
        """Between run()'s start and its monitor loop: a signal then stops the start at once."""
        self._prepared = False  # the run directory has its config.yaml, seeds and factories
        self.interrupted_at: float | None = None
        """When the signal that stopped the run came (monotonic): the stop is bound to end
        ``INTERRUPT_STOP_S`` later."""
        self.model_skipped = ""
        """Why no model file was written, when the stop skipped them (summary's model_note)."""
        self.started = time.monotonic()
        self._display: Any = None
        self._role_states: dict[str, Any] = {}  # each role's last state (_report_deaths)
        self._finish_imports: threading.Thread | None = None  # preload_finish_modules
        self.roster = Roster.of(*self.placement(), wait_s=cfg.broker.wait_for_roles)
        self.monitor = RunMonitor(
            cfg, self.ctx, self.access, self.pool, self.roster, self.agg, self.target
        )
        self._next_missing_notice = 0.0
        self.league: dict[str, Any] | None = None
        """Main's figures from the league role's latest heartbeat (``league_record``)."""
        self._league_written: tuple[float, Any] = (-LEAGUE_CSV_INTERVAL_S, None)

    # What the display, the CLI and the tests read; the parts own it.

    @property
    def run_dir(self) -> Path:
        return self.rundir.path

    @property
    def broker_addr(self) -> str:
        return self.access.broker_addr

    @property
    def children(self) -> list[Child]:
        return self.pool.children

    @property
    def zygote(self) -> subprocess.Popen[str] | None:
        return self.pool.zygote.proc

    @property
    def _fatal(self) -> str:
        return self.pool.fatal

    @property
    def target_time(self) -> float | None:
        return self.target.target_time

    @property
    def confirming_return(self) -> float | None:
        return self.target.confirming_return

    @property
    def broker_child(self) -> Child | None:
        return self.pool.broker

    @broker_child.setter
    def broker_child(self, child: Child | None) -> None:
        self.pool.broker = child

    def _prepare_run_dir(self) -> None:
        self.rundir.prepare(self.agg, resume=self.resume)
        if self.access.keys_dir is None and not self.inproc and self.wants_run_keys():
            self.access.use_run_keys(self.rundir.path)

    def _security_line(self) -> str:
        """What protects this run's sockets, said once at its start."""
        if self.access.keys_dir is not None:
            return (
                f"authenticated: CURVE keys in {self.access.keys_dir}; every role proves its "
                "id with a credential of the run"
            )
        proven = (
            "roles still prove their ids"
            if self.pool.run_secret is not None
            else "and take any role's id: roles on other hosts have no secret to prove theirs"
        )
        return (
            "INSECURE (--insecure): no keys; any process that reaches the broker's ports can "
            f"read and send this run's traffic ({proven})"
        )

    def wants_run_keys(self) -> bool:
        """Whether this run makes its own keys (``RUN_DIR/keys``): by default, so that a run
        on one host is authenticated and encrypted with no flag; not with ``--insecure``
        (unless pickled factories must travel), nor for a head whose roles all come from
        other hosts (``zrl start broker --run-dir``: its hosts need the keys it names)."""
        if self.factories.needs_pickle():
            return True
        return not self.access.insecure and not self.elsewhere

    def _describe_env(self, display: Any) -> None:
        """For Atari: what an env step is, and that eval scores are whole unclipped games."""
        from zrl.envs.atari import describe, is_atari

        if is_atari(self.cfg.env.id):
            display.message(f"env: {describe(self.cfg.env)}")
            display.message(
                "eval = true game scores (whole games, unclipped); training episode returns "
                "follow env.atari (clip_rewards, episodic_life)"
            )

    def placement(self) -> tuple[list[tuple[str, int]], dict[str, list[tuple[str, int]]]]:
        """(local roles, {host name: its roles}) as (role, index) pairs (see placement); a
        head that starts no roles expects the ones the config does not place from any host."""
        local, remote = placement(self.cfg)
        if self.elsewhere:
            return [], {**remote, ANY_HOST: local}
        return local, remote

    def remote_commands(self) -> dict[str, str]:
        """The ``zrl host`` line for every host with roles placed on it."""
        return remote_commands(self.cfg, self.factories, self.access, self.placement()[1])

    def stop_rule(self) -> str:
        """The stop rule on evaluations, in words (for the summary and the README)."""
        return self.target.describe()

    # --- monitoring -------------------------------------------------------------------

    def _counted_to_the_end(self, row: dict[str, Any], writer: MetricsWriter) -> dict[str, Any]:
        """The run's figures from the roles' last heartbeats, read once they stopped (their
        rows keep what their BYE said): the roles step on between the stop's figures and
        their end, and summary.json's counts must be those of its ``heartbeats``. A changed
        row is progress.csv's last too (a --resume counts on from there)."""
        if not row or not self._read_after_stop:
            return row
        final = self.agg.row(time.monotonic() - self.started)
        if (final["env_steps"], final["updates"]) == (row["env_steps"], row["updates"]):
            return row
        writer.write_progress(final)
        return final

    def _stop_experiment(self) -> None:
        """STOP_RUN, while the broker is still up (``ChildPool.stop``'s ``before_broker``);
        after a signal, waiting for the roles elsewhere only within ``INTERRUPT_STOP_S``."""
        elapsed = time.monotonic() - self.started
        if self.interrupted_at is None:
            self.monitor.stop_run(self.stop_reason or "stopped", elapsed)
        else:
            left = self.interrupted_at + INTERRUPT_STOP_S - time.monotonic()
            self.monitor.stop_run(self.stop_reason or "interrupted", elapsed, max(left - 0.5, 0.0))
            if time.monotonic() > self.interrupted_at + INTERRUPT_STOP_S - 1.0:
                return
        # The local roles have stopped: their rows hold their last figures.
        self._read_after_stop = self.monitor.refresh()

    def _confirm_target(self) -> None:
        """Stop at the target once the evaluator's own heartbeat reports the evaluations that
        met the rule too (see StopRule.confirm)."""
        # The evaluator's row alone: one row decodes whatever else the registry holds.
        if self.target.confirm(
            lambda sender: self.monitor.registered(sender, "evaluator", ask=True)
        ):
            self.stop_reason = self.target.reason()
            self._stop.set()

    def _record_league(
        self, row: dict[str, Any], writer: MetricsWriter, final: bool = False
    ) -> None:
        """Keep main's figures from the league role's latest heartbeat and, every
        LEAGUE_CSV_INTERVAL_S (and at the end) when the league played games since, write them
        to league.csv with the latest evaluation's reference rates and exploitability."""
        record = league_record(self.monitor.league_info())
        if record is None:
            return
        self.league = record
        last_time, last_games = self._league_written
        if record.get("games") == last_games or (
            not final and row["time"] - last_time < LEAGUE_CSV_INTERVAL_S
        ):
            return
        self._league_written = (row["time"], record.get("games"))
        evaluation = self.agg.evals[-1] if self.agg.evals else None
        writer.write_league(row["time"], row["env_steps"], league_figures(record, evaluation))

    def _check_limits(self, row: dict[str, Any]) -> None:
        reason = self.target.limit_reached(row)
        if reason is not None:
            self.stop_reason = self.stop_reason or reason
            self._stop.set()

    def _check_roster(self, elapsed: float, display: Any) -> None:
        """Name the placed roles that have not registered; fail the run past the wait."""
        self.roster.update(self.monitor.status_rows, elapsed)
        missing = self.roster.missing()
        if not missing:
            return
        overdue = self.roster.overdue(elapsed)
        if overdue:
            self.pool.fatal = (
                f"roles placed on other hosts never registered within broker.wait_for_roles="
                f"{self.cfg.broker.wait_for_roles:g}s: {self.roster.describe_missing()}"
            )
            self.stop_reason = "error"
            self._stop.set()
        elif time.monotonic() >= self._next_missing_notice:
            self._next_missing_notice = time.monotonic() + MISSING_NOTICE_S
            display.message(
                f"waiting for {len(missing)} role(s) to register: {self.roster.describe_missing()}"
            )

    def _check_progress(self) -> None:
        """Fail the run as soon as its learning stopped (``zrl.run.learning.ProgressWatch``)."""
        ours = [r for r in self.monitor.status_rows if self.monitor.ours(r)]
        reason = self.progress.observe(ours, time.monotonic())
        if reason is not None and not self.pool.fatal:
            log.error("%s", reason)
            self.pool.fatal = reason
            self.stop_reason = "error"
            self._stop.set()

    def _report_deaths(self, display: Any) -> None:
        """Say on the console when the broker marks a role of ours dead (it missed its
        heartbeats, which come from a thread of its own: a process gone, a lost host), once
        per death, and when it shows one stalled (it heartbeats, but its loop has not turned
        for broker.stall_after: a long or hung step), once per stall, with since when; before,
        only broker.log said."""
        from zrl.run.display import shown_state, stall_text

        for r in self.monitor.status_rows:
            rid = r.get("id")
            if not isinstance(rid, str) or not self.monitor.ours(r):
                continue
            state, last = shown_state(r), self._role_states.get(rid)
            self._role_states[rid] = state
            where = f"{rid} (host {r.get('host', '?')}, pid {r.get('pid', '?')})"
            if state == "dead" and last not in (None, "dead"):
                display.message(
                    f"{where} missed its heartbeats for broker.heartbeat_timeout="
                    f"{self.cfg.broker.heartbeat_timeout:g}s: the broker marked it dead"
                )
            elif state == "stalled" and last != "stalled":
                display.message(
                    f"{where} is alive (it heartbeats) but stalled: {stall_text(r)}; "
                    f"broker.stall_after={self.cfg.broker.stall_after:g}s"
                )

    def _check_children(self) -> None:
        """Restart crashed children (see ChildPool.check); stop the run past the budget."""
        show = self._display.message if self._display is not None else None
        if self.pool.check(self.monitor.registered, show):
            self.stop_reason = "error"
            self._stop.set()

    # --- finish -----------------------------------------------------------------------

    def _check_learned(self) -> None:
        """A run whose learners' weights never reached params failed (``zrl.run.learning``),
        whatever else went right; an earlier failure keeps its own reason."""
        ours = [r for r in self.monitor.status_rows if self.monitor.ours(r)]
        reason = did_not_learn(self.cfg, ours)
        if reason is not None and not self.pool.fatal:
            log.error("%s", reason)
            self.pool.fatal = reason

    def _save_model(self) -> SavedModels | None:
        """model.pt (the weights that met the stop rule, else the best evaluated, else the
        last), model_best.pt and model_last.pt; see RunDir.save_models. After a signal, only
        if a zygote child can write them or torch is loaded already (``preload_finish_modules``:
        loading it takes seconds of a busy machine) and within ``INTERRUPT_WEIGHTS_S``; the
        roles' own checkpoints, which ``--resume`` continues from, are written either way."""
        if not self._zygote_alive() and not self._may_write_models_here():
            return None
        return self.rundir.save_models(
            self.ctx,
            self.access,
            lambda rid: bool(self.monitor.registered(rid, "params")),
            self.target,
            self.agg.evals,
            timeout=5.0 if self.interrupted_at is None else INTERRUPT_WEIGHTS_S,
            write=self._write_models,
        )

    def _write_models(self, last: Evaluated, target: StopRule) -> SavedModels | None:
        """The model files, by a child forked from the zygote (the head never imports
        torch), else here."""
        from zrl.run.model_files import write_models_forked

        timeout = 60.0
        if self.interrupted_at is not None:  # half what is left, the rest for the roles' stop
            timeout = max(1.0, (self.interrupted_at + INTERRUPT_STOP_S - time.monotonic()) / 2)
        try:
            saved = write_models_forked(self.rundir, last, target, self.pool.zygote, timeout)
        except RuntimeError as exc:
            log.warning("%s: writing them here", exc)
            saved = None
        if saved is not None:
            return saved
        return self.rundir.write_models(last, target) if self._may_write_models_here() else None

    def _may_write_models_here(self) -> bool:
        """Whether the head may write the model files itself, importing torch: not after a
        signal unless torch is loaded already (that takes seconds of a busy machine); says
        why not in the summary."""
        if self.interrupted_at is None or self._finish_modules_loaded():
            return True
        self.model_skipped = (
            "interrupted before the head had loaded torch: no model files (the roles' "
            "checkpoints are written; `zrl run --resume` continues from them)"
        )
        return False

    def _zygote_alive(self) -> bool:
        proc = self.pool.zygote.proc
        return proc is not None and proc.poll() is None

    def _finish_modules_loaded(self) -> bool:
        """Whether torch is imported here and its import over (the end-of-run preload)."""
        loading = self._finish_imports is not None and self._finish_imports.is_alive()
        return "torch" in sys.modules and not loading

    # --- main -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        from zrl.run.display import StatusDisplay

        display = StatusDisplay(self, enabled=self.show_status)
        self._display = display
        previous_handlers = self._catch_signals()
        try:
            # From here a signal is a stop: until the monitor loop runs, at once (_on_signal),
            # so that Ctrl-C while torch loads on a busy machine does not wait for it.
            self._starting = True
            writer = self._start()
        except KeyboardInterrupt:
            return self._stopped_while_starting(display, previous_handlers)
        except BaseException:
            self._starting = False
            self._restore_signals(previous_handlers)
            raise
        return self._run(writer, display, previous_handlers)

    def _catch_signals(self) -> dict[signal.Signals, Any]:
        """SIGINT and SIGTERM stop the run (``_on_signal``); the handlers they had, to put
        back at the end. Only the main thread can (a run in another thread is stopped by its
        caller)."""
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    @staticmethod
    def _restore_signals(previous: dict[signal.Signals, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def _start(self) -> MetricsWriter:
        """What comes before the broker: the env and model checks, the run directory, the
        zygote; the metrics writer."""
        from zrl.run.preflight import check_env

        # Before the run directory exists, so a mistyped env id leaves nothing behind; the
        # model is checked once the zygote has imported torch (_check_model).
        spaces = check_env(self.cfg, self.factories) if self.preflight else None
        self._prepare_run_dir()
        self._prepared = True
        self.pool.fatal = ""
        if self.inproc:
            from zrl.utils.runtime import setup_logging

            setup_logging(self.log_level)
            handler = logging.FileHandler(self.run_dir / "logs" / "inproc.log")
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(name)s: %(message)s")
            )
            logging.getLogger().addHandler(handler)
        require_backends(self.cfg.logging)  # a missing W&B/MLflow extra stops us here
        # Roles fork from the zygote once it has imported torch: start it before anything
        # here imports torch too (the TensorBoard writer does), so the two overlap.
        self.pool.start_zygote()
        try:
            # While the zygote imports torch on one core, import the writer on the other.
            ScalarWriter.preload()
            if spaces is not None:
                self._check_model(spaces)
        except KeyboardInterrupt:
            raise  # the zygote is killed where the stop is handled (_stopped_while_starting)
        except BaseException as exc:
            self.pool.zygote.stop()
            if isinstance(exc, ConfigError):  # the run directory says why, as for any failure
                self._write_preflight_summary(str(exc))
            raise
        return MetricsWriter(
            self.run_dir, logging=self.cfg.logging, config=self.cfg.model_dump(mode="json")
        )

    def _stopped_while_starting(
        self, display: Any, previous_handlers: dict[signal.Signals, Any]
    ) -> dict[str, Any]:
        """A signal before the broker started (while the env was checked, or torch loaded):
        the zygote is killed, and the run directory written all the same, with a summary.json
        that says the run was interrupted and how to resume it."""
        self._finishing = True  # a second Ctrl-C now waits for the summary (_on_signal)
        self._starting = False
        try:
            self.pool.zygote.kill()
            if not self._prepared:  # the signal came before the run directory was complete
                self._prepare_run_dir()
                self._prepared = True
            elapsed = time.monotonic() - self.started
            display.message(f"stopping (interrupted) at {elapsed:.1f} s, before any role started")
            summary = self._summary(self.agg.row(elapsed), None, interrupted=True)
            atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
            display.final(summary)
            display.message(self._resume_hint())
        finally:
            self._restore_signals(previous_handlers)
        return summary

    def _run(
        self, writer: MetricsWriter, display: Any, previous_handlers: dict[signal.Signals, Any]
    ) -> dict[str, Any]:
        """From the broker's start to the stop, then ``_finish``."""
        interrupted = False
        summary: dict[str, Any] = {}
        row: dict[str, Any] = {}
        try:
            display.message(f"run directory: {self.run_dir}")
            if self.sizing is not None:
                display.message(self.sizing.describe())
            self._describe_env(display)
            self.pool.start_broker()
            (self.run_dir / "broker_address").write_text(self.broker_addr + "\n")
            if not self.inproc:
                keys = self.access.keys_dir
                status = f"zrl status --broker {self.broker_addr}" + (
                    f" --keys {keys}" if keys is not None else ""
                )
                display.message(f"broker: {self.broker_addr}  ({status})")
                display.message(self._security_line())
                self._announce_remote(display)
            self.pool.start_roles(self.placement()[0])
            monitor = self.monitor.open()
            display.start()
            next_row = time.monotonic()
            next_confirm = 0.0
            self._starting = False  # the loop sees a signal's stop within a fifth of a second
            while not self._stop.is_set():
                elapsed = time.monotonic() - self.started
                self.monitor.drain(monitor, writer, elapsed)
                if self.target.candidates and time.monotonic() >= next_confirm:
                    # The evaluator's next heartbeat is at most heartbeat_interval away.
                    next_confirm = time.monotonic() + 0.25
                    self._confirm_target()
                if self._finish_imports is None and self.monitor.first_env_step is not None:
                    torch_here = not self._zygote_alive()
                    self._finish_imports = preload_finish_modules(with_torch=torch_here)
                if time.monotonic() >= next_row:
                    next_row += 1.0
                    fresh = self.monitor.refresh()
                    self._check_children()
                    if fresh:  # never call a role missing on rows the broker did not send
                        self._check_roster(elapsed, display)
                        self._report_deaths(display)
                        self._check_progress()
                    row = self.agg.row(elapsed)
                    if self.monitor.first_env_step is None and (
                        row["env_steps"] > self.agg.env_steps_offset
                    ):
                        # No actor's metrics heard yet (a busy bus drops them), but its
                        # heartbeat counts steps: the first env step came by now.
                        self.monitor.first_env_step = round(elapsed, 2)
                    writer.write_progress(row)
                    writer.write_train(row["env_steps"], self.agg.train_row(), elapsed)
                    self._record_league(row, writer)
                    self._check_limits(row)
                    display.update(row)
                self._stop.wait(MONITOR_INTERVAL_S / 5)
            # What the roles reported since the last pass: a short run's only training figures.
            self.monitor.drain(monitor, writer, time.monotonic() - self.started)
            monitor.close()
        except KeyboardInterrupt:
            interrupted = True
            self.stop_signal = self.stop_signal or signal.SIGINT
        except Exception as exc:
            # zrl run itself failed (the broker would not start, ...): the run directory is
            # completed all the same, summary.json says why, and the error goes on up.
            self.pool.fatal = self.pool.fatal or f"zrl run failed: {type(exc).__name__}: {exc}"
            self.stop_reason = "error"
            raise
        finally:
            summary = self._finish(row, writer, display, previous_handlers, interrupted)
        return summary

    def _finish(
        self,
        row: dict[str, Any],
        writer: MetricsWriter,
        display: Any,
        previous_handlers: dict[signal.Signals, Any],
        interrupted: bool,
    ) -> dict[str, Any]:
        """However the run stopped (target, limit, Ctrl-C, roles that keep crashing, an
        error here), stop every role and complete the run directory: the final figures, also
        as progress.csv's last row, model.pt, summary.json and the learning curve. Stopped
        by a signal, all of it is bound to end ``INTERRUPT_STOP_S`` after it (``deadline``)."""
        interrupted = interrupted or self.stop_reason == "interrupted"
        self._starting = False
        if interrupted and self.interrupted_at is None:
            self.interrupted_at = time.monotonic()
        deadline = None if self.interrupted_at is None else self.interrupted_at + INTERRUPT_STOP_S
        display.stop()  # the last figures first
        # Saving the model and stopping the roles takes seconds (more on a loaded machine):
        # say so at once rather than go quiet between the last figures and the summary.
        display.message(
            f"stopping ({'interrupted' if interrupted else self.stop_reason or 'stopped'}) at "
            f"{time.monotonic() - self.started:.1f} s: saving the model, stopping the roles"
        )
        saved = None
        written = row  # the monitor loop's last progress row ({} if it wrote none)
        try:
            try:
                if self.broker_child is not None:
                    row = self.monitor.final_row(row, time.monotonic() - self.started)
                    self._check_learned()
                    saved = self._save_model()
                self._finishing = True
            except KeyboardInterrupt:
                # Ctrl-C again while the final model was fetched: go without it, but stop
                # every role and write the run directory all the same.
                self._finishing = True
                interrupted = True
                log.warning("interrupted again: stopping without the final model")
            row = row or self.agg.row(time.monotonic() - self.started)
            if row is not written:
                # The stop's figures, so progress.csv ends where the summary does (and a
                # --resume counts on from there).
                writer.write_progress(row)
            writer.write_train(row["env_steps"], self.agg.train_row(), row["time"])
            self._record_league(row, writer, final=True)
        finally:
            self.pool.stop(before_broker=self._stop_experiment, deadline=deadline)
            row = self._counted_to_the_end(row, writer)
            self.roster.ended_here({c.name: c.exit_code() for c in self.children})
            # The zygote exits by itself once its input closes (a second or two with torch
            # loaded): let it, while the summary is written, and reap it last.
            self.pool.zygote.close_input()
            writer.close()
            self._restore_signals(previous_handlers)
        try:
            self.pool.keeps_crashing(self.target.target_time is not None)
            summary = self._summary(row, saved, interrupted)
            atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
            late = self.interrupted_at is not None and (
                time.monotonic() > self.interrupted_at + INTERRUPT_PLOT_S
            )
            if self.agg.evals and not late:
                try:
                    from zrl.run.metrics import plot_run

                    plot_run(self.run_dir)
                except Exception as exc:  # noqa: BLE001 - a plot must not fail the run
                    log.warning("could not plot the learning curve: %s", exc)
            display.final(summary)
            if interrupted:
                display.message(self._resume_hint())
        finally:
            # Stopped by a signal, nothing waits for the zygote to end by itself.
            if interrupted:
                self.pool.zygote.kill()
            else:
                self.pool.zygote.stop()
        return summary

    def _write_preflight_summary(self, error: str) -> None:
        """summary.json of a run the preflight check stopped before anything started: failed,
        ``stop_reason: error``, the check's error (its log: logs/preflight.log)."""
        summary = {
            "experiment": self.cfg.name,
            "run_dir": str(self.run_dir),
            "stop_reason": "error",
            "failed": True,
            "error": error,
            "error_log": str(self.run_dir / "logs" / "preflight.log"),
            "env_steps": 0,
            "wall_time": round(time.monotonic() - self.started, 2),
        }
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))

    def _check_model(self, spaces: tuple[Any, Any]) -> None:
        """Build the model as the roles will, before any starts: in a child forked from the
        zygote, which imports torch anyway. Importing torch here too would take seconds of
        CPU from the roles' start-up."""
        from zrl.run.preflight import check_model

        log_path = self.run_dir / "logs" / "preflight.log"
        argv = ["config", "check", str(self.run_dir / "config.yaml")]
        if self.factories.needs_pickle():
            argv += ["--factories", str(self.run_dir / FACTORIES_FILE)]
        argv += factory_args(self.factories)
        forked = self.pool.zygote.fork(argv, log_path)
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
        lines = self.rundir.write_remote_commands(commands)
        display.message(
            "start this on each other host (also in remote_commands.txt; `zrl host` starts, "
            "restarts and stops its roles):"
        )
        for line in lines:
            display.message(f"  {line}")

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._finishing:
            # Stopping the roles and writing summary.json: cutting that short would leave
            # roles running and the run directory incomplete. It takes seconds at most.
            log.warning("signal %d: already stopping, writing the run directory", signum)
            return
        if self.stop_reason == "interrupted":
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting (for the final model)
        self.stop_reason = "interrupted"
        self.stop_signal = signum
        self.interrupted_at = time.monotonic()
        self._stop.set()
        if self._starting:
            raise KeyboardInterrupt  # out of whatever the start waits on (run() stops)

    def resume_command(self) -> str:
        """The command that continues this run from its run directory (``--resume``), with
        the options it cannot read from there: keys kept elsewhere; for a head whose roles
        all run elsewhere, the address it binds."""
        command = (
            f"{RESUME_HEAD if self.elsewhere else RESUME_RUN} {shlex.quote(str(self.run_dir))}"
        )
        if self.elsewhere:
            command += f" --bind {shlex.quote(self.access.bind_addr)}"
        keys = self.access.keys_dir
        if keys is not None and not keys.is_relative_to((self.run_dir / "keys").resolve()):
            command += f" --keys {shlex.quote(str(keys))}"
        elif keys is None and self.access.insecure:
            command += " --insecure"
        return command

    def _resume_hint(self) -> str:
        return f"to continue it from its last checkpoints: {self.resume_command()}"

    def _summary(
        self, row: dict[str, Any], saved: SavedModels | None, interrupted: bool
    ) -> dict[str, Any]:
        summary = self._run_summary(row, saved, interrupted)
        evals = self.agg.evals
        summary["target_exploitability"] = self.cfg.stop.exploitability
        summary["target_bounds"] = self.target.bounds if self.cfg.stop.has_bounds else None
        # A turn-based game's last evaluation against each reference opponent, a small board
        # game's exploitability (last and best), and a league's figures (bounded: one record).
        summary["reference_opponents"] = reference_rates(evals[-1] if evals else None) or None
        summary["exploitability"] = exploitability_summary(evals)
        summary["league"] = self.league
        summary["evaluations_cut_short"] = self._evaluations_in_flight()
        summary["signal"] = (
            signal.Signals(self.stop_signal).name if interrupted and self.stop_signal else None
        )
        # An interrupted run is one to go on with: the command that does.
        summary["resume_command"] = self.resume_command() if interrupted else None
        if saved is None and self.model_skipped:
            summary["model_note"] = self.model_skipped
        return summary

    def _evaluations_in_flight(self) -> list[dict[str, Any]]:
        """The evaluations our evaluators were running at the stop, from their last
        heartbeats (``evaluating``): not recorded in eval.csv, and the summary says so."""
        out = []
        for r in self.monitor.status_rows:
            info = r.get("info") if self.monitor.ours(r) == "evaluator" else None
            running = info.get("evaluating") if isinstance(info, dict) else None
            if isinstance(running, dict):
                out.append(
                    {
                        "evaluator": r.get("id"),
                        "weights_version": count(running.get("weights_version")),
                        "running_for_s": number(running.get("for_s")),
                    }
                )
        return out

    def _run_summary(
        self, row: dict[str, Any], saved: SavedModels | None, interrupted: bool
    ) -> dict[str, Any]:
        return self.rundir.summary(
            row,
            saved,
            stop_reason="interrupted" if interrupted else (self.stop_reason or "unknown"),
            fatal=self.pool.fatal,
            fatal_tail=self.pool.fatal_tail,
            target=self.target,
            agg=self.agg,
            started=self.started,
            first_env_step=self.monitor.first_env_step,
            evals_dropped=self.monitor.evals_dropped,
            metrics_dropped=self.monitor.metrics_dropped,
            roster=self.roster,
            restarts_here=self.pool.restarts(),
        )
