"""Children of a zrl process, started, watched, restarted and stopped: what the head's
``ChildPool`` (``zrl.run.pool``) and a host agent (``zrl.run.host_agent``) share.

A child is a process running the same ``zrl start`` command a user would type on another
host (forked from the zygote when there is one, see ``zrl.run.zygote``), or a thread over
``inproc://`` with ``--inproc``. The pieces: ``Child``; ``launch`` (a ``zrl`` command forked
from the zygote, or a plain process); ``RestartPolicy`` (restarts with back-off within
``RESTART_BUDGET``); ``stop_in_order`` (actors first, SIGTERM, grace, SIGKILL). Children die
with their parent, even when it is SIGKILLed.

Sockets: none.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from zrl.run.rundir import log_tail
from zrl.run.zygote import ForkedRole, Zygote, set_parent_death_signal

log = logging.getLogger("zrl.supervisor")  # the name its log lines have always had

RESTART_BUDGET = 5
RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0)
STOP_GRACE_S = 10.0


@dataclass
class Child:
    """One role started by the supervisor (a process, or a thread with --inproc)."""

    role: str
    index: int | None
    """None: the broker numbers it (a host agent's child before the broker told its id)."""
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


def launch(
    argv: list[str],
    log_path: Path,
    zygote: Zygote | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes] | ForkedRole:
    """``zrl ARGV`` with its output appended to ``log_path`` and ``env`` added to its
    environment: forked from ``zygote`` when it has one, else a plain process. Either dies
    with us."""
    if zygote is not None:
        forked = zygote.fork(argv, log_path, env)
        if forked is not None:
            return forked
    with open(log_path, "ab") as logf:  # the child holds its own copy from here
        return subprocess.Popen(
            [sys.executable, "-m", "zrl", *argv],
            env={**os.environ, **env} if env else None,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=set_parent_death_signal if sys.platform.startswith("linux") else None,
        )


@dataclass(frozen=True)
class RestartPolicy:
    """How a crashed child comes back: ``backoff[n]`` seconds after its n-th restart (the
    last step repeats), at most ``budget`` times."""

    backoff: Sequence[float]
    budget: int

    @classmethod
    def default(cls) -> RestartPolicy:
        """``RESTART_BACKOFF_S`` and ``RESTART_BUDGET`` as they are now (tests shorten them)."""
        return cls(RESTART_BACKOFF_S, RESTART_BUDGET)

    def tend(
        self,
        child: Child,
        now: float,
        spawn: Callable[[Child], None],
        came_up: Callable[[Child], bool],
    ) -> int | None:
        """One look at ``child``: ``spawn`` it again once its back-off is over; while it
        runs, note when it came up (``came_up``: it registered and reports alive). Returns its
        exit code when it has ended (also in ``last_exit_code``, and counted in
        ``setup_crashes``), else None; the caller then restarts it (``crashed``), or not."""
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.restart_at = None
                child.restarts += 1
                log.warning(
                    "restarting %s (restart %d of %d)", child.name, child.restarts, self.budget
                )
                child.came_up = False
                spawn(child)
            return None
        if child.alive():
            if not child.came_up and came_up(child):
                child.came_up, child.setup_crashes = True, 0
            return None
        code = child.exit_code()
        child.last_exit_code = code
        child.setup_crashes += 0 if child.came_up else 1
        return code

    def crashed(
        self,
        child: Child,
        now: float,
        show: Callable[[str], None] | None,
        delay: float | None = None,
    ) -> bool:
        """``child`` ended and is to come back: True when it has used up its restarts (then
        nothing is scheduled), else it restarts after its back-off (or ``delay`` seconds).
        Its first crash shows its last log lines (``show_tail``): the reason is there."""
        if child.restarts == 0:
            show_tail(child, f"{child.name} exited with code {child.last_exit_code}", show)
        if child.restarts >= self.budget:
            return True
        if delay is None:
            delay = self.backoff[min(child.restarts, len(self.backoff) - 1)]
        log.warning(
            "%s exited with code %s; restarting in %.1fs (log: %s)",
            child.name,
            child.last_exit_code,
            delay,
            child.log_path,
        )
        child.restart_at = now + delay
        return False


def show_tail(child: Child, headline: str, show: Callable[[str], None] | None) -> None:
    """``headline`` and the last lines of ``child``'s log, one call of ``show`` a line."""
    tail = log_tail(child.log_path)
    if show is None or not tail:  # (--inproc roles log to logs/inproc.log)
        return
    show(f"{headline}; the last lines of {child.log_path}:")
    for line in tail:
        show(f"  | {line}")


def stop_in_order(
    children: Sequence[Child],
    grace: float | None = None,
    until: tuple[float, float] | None = None,
) -> None:
    """Stop ``children`` in data-flow order: the actors first (their end-of-stream wait needs
    the replay shards alive to acknowledge), then everyone else. SIGTERM (a thread: its stop
    event), then SIGKILL what still runs ``grace`` seconds later (default STOP_GRACE_S), or,
    with ``until``, past the given times (monotonic) for the actors and for the rest: a run
    stopped by Ctrl-C ends within seconds, its slowest roles killed."""
    grace = STOP_GRACE_S if grace is None else grace
    groups = (
        [c for c in children if c.role == "actor"],
        [c for c in children if c.role != "actor"],
    )
    for n, group in enumerate(groups):
        for child in group:
            child.restart_at = None
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
            if child.stop_event is not None:
                child.stop_event.set()
        deadline = time.monotonic() + grace if until is None else until[n]
        for child in group:
            wait_child(child, deadline)


def wait_child(child: Child, deadline: float) -> None:
    """Wait until ``child`` ends or ``deadline`` passes; then SIGKILL it."""
    if child.proc is not None:
        try:
            child.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in time: killing it", child.name)
            child.proc.kill()
            child.proc.wait(timeout=5)
    elif child.thread is not None:
        child.thread.join(timeout=max(deadline - time.monotonic(), 0.1))
