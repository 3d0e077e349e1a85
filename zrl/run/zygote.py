"""Fast role start-up for ``zrl run``: one pre-imported process that forks the roles.

Importing torch, gymnasium and the roles costs about 2 s of CPU per process; five roles
starting together on two cores wait about 5 s before the first env step. The zygote pays
that once, then forks a child per role. Fork shares the imported modules copy-on-write, so
a role (or a restart of one) starts in milliseconds. This is Android's zygote and
multiprocessing's forkserver, specialised to ``zrl start``.

``zrl run`` starts the zygote first thing, before it imports its own modules and reads the
config (``--log-later``: the run directory, where its log goes, does not exist yet), so the
two import side by side. A config that turns out bad kills it (:meth:`Zygote.kill`).

Protocol, one JSON object per line: the zygote writes ``{"ready": true}`` once it has
imported everything; the supervisor writes ``{"argv": [...], "log": PATH, "env": {NAME:
VALUE}}`` (``env``: variables added to the role's environment, e.g. the broker's stop token;
optional) on the zygote's stdin, and the zygote answers ``{"pid": N}`` (or ``{"error":
"..."}``) on stdout. ``{"log": PATH}`` alone (no answer) names the zygote's own log file with
``--log-later``: what it wrote to stderr until then is copied there first.

The zygote does not import the CLI: like ``python -m zrl`` (how ``zrl.run.children`` starts
a role without it), it runs each role through the package's entry module, whose name its
client hands it (``--entry``, ``zrl.__main__`` by default). That module's ``command()`` is
built once before the forks, and its ``main()`` runs in each role.

The role runs in a *grandchild*: the zygote forks an intermediate that forks the role and
exits at once. The orphaned role is re-parented to the supervisor, which made itself a
child subreaper (``PR_SET_CHILD_SUBREAPER``), so the supervisor waits for it, reads its exit
status and signals it by PID exactly like a child it spawned itself. The zygote never
creates a thread or a ZeroMQ context, so forking it is safe.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("zrl.supervisor")  # the client's lines, as they have always been named

ENTRY_MODULE = "zrl.__main__"
"""The module the roles run through: ``main()`` runs ``zrl ARGV``, ``command()`` builds its
argument parser (``python -m zrl`` runs the same module)."""

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux >= 3.4), so forked roles become waitable children."""
    return sys.platform.startswith("linux") and _prctl(PR_SET_CHILD_SUBREAPER, 1)


def preload(entry: str) -> Any:
    """Everything a role imports before its first step; returns the ``entry`` module."""
    import gymnasium  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401

    from zrl.algos.registry import BUILT_IN
    from zrl.roles import ROLE_MODULES

    for path in ROLE_MODULES.values():
        __import__(path.split(":")[0])
    for algorithm in BUILT_IN.values():
        algorithm.loaded()  # its pieces: policy, update, model, ...
    import zrl.broker  # noqa: F401
    import zrl.envs.vector  # noqa: F401
    import zrl.nets.continuous  # noqa: F401
    import zrl.roles.evaluation  # noqa: F401

    module = importlib.import_module(entry)
    module.command()  # every role parses its arguments with it
    return module


def _run_role(
    entry: Any, argv: list[str], log_path: str, subreaper: int, env: dict[str, str]
) -> None:
    """In the grandchild: wait to be adopted by the supervisor, then run ``zrl <argv>`` with
    ``env`` added to the environment."""
    deadline = time.monotonic() + 5.0
    while os.getppid() != subreaper and time.monotonic() < deadline:
        time.sleep(0.001)
    # Set only once adopted: the death signal fires when the *current* parent exits.
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != subreaper:
        os._exit(1)  # the supervisor is gone already
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.update(env)
    try:
        # `ps` (and anything that finds a run's processes by command line) sees the role,
        # not the zygote it was forked from.
        from setproctitle import setproctitle

        setproctitle(" ".join([sys.executable, "-m", "zrl", *argv]))
    except ImportError:
        pass
    code = 0
    try:
        sys.argv = ["zrl", *argv]
        entry.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - report it in the role's log like an uncaught error
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            _flush_zmq()
        finally:
            os._exit(code)


def _flush_zmq(timeout: float = 1.0) -> None:
    """Let the role's ZeroMQ context send what its closed sockets still hold before
    ``os._exit`` kills the context's I/O thread: a role that fails in setup closes its registry
    socket with its BYE queued (linger 500 ms), and without the BYE the broker keeps its entry
    ``starting`` and ignores the restarted role's HELLO until ``setup_grace`` ends. Bounded,
    since a socket left open with an unbounded linger would hold ``term`` for ever."""
    import threading

    import zmq

    ctx = zmq.Context._instance  # the role's context; None if it never made one
    if ctx is None or ctx.closed:
        return
    term = threading.Thread(target=ctx.term, daemon=True)
    term.start()
    term.join(timeout)


def spawn(
    entry: Any, argv: list[str], log_path: str, subreaper: int, env: dict[str, str] | None = None
) -> int:
    """Double-fork a role; returns its PID once it is re-parented to ``subreaper``."""
    read_fd, write_fd = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        os.close(read_fd)
        role = os.fork()
        if role == 0:
            os.close(write_fd)
            _run_role(entry, argv, log_path, subreaper, env or {})
        os.write(write_fd, f"{role}\n".encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        line = pipe.readline()
    os.waitpid(intermediate, 0)  # the role is an orphan from here: adopted by the subreaper
    return int(line)


def _log_to(path: str, early: IO[bytes] | None) -> None:
    """Send stderr to ``path`` from now on, after what ``early`` kept of it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if early is not None:
        early.seek(0)
        os.write(fd, early.read())
        early.close()
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)


def serve(entry: str = ENTRY_MODULE, log_later: bool = False) -> None:
    """The zygote's loop: preload, then one spawn per request line until stdin closes.
    ``log_later``: keep stderr in a temporary file until a ``{"log": PATH}`` line."""
    subreaper = os.getppid()
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when we stop
    early = tempfile.TemporaryFile() if log_later else None  # noqa: SIM115 - closed in _log_to
    if early is not None:
        os.dup2(early.fileno(), 2)
    module = preload(entry)
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        reply: dict[str, Any]
        try:
            req = json.loads(line)
            if "argv" not in req and "log" in req:  # never answered, so never an error reply
                try:
                    _log_to(str(req["log"]), early)
                    early = None
                except OSError:
                    pass  # stderr stays where it was
                continue
            env = {str(k): str(v) for k, v in (req.get("env") or {}).items()}
            reply = {
                "pid": spawn(module, [str(a) for a in req["argv"]], str(req["log"]), subreaper, env)
            }
        except Exception as exc:  # noqa: BLE001 - answered, the supervisor falls back
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def set_parent_death_signal() -> None:
    # Children die with the supervisor even if it is SIGKILLed: nothing is left running.
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Zygote:
    """The client of ``python -m zrl.run.zygote``: roles forked from one pre-imported process."""

    def __init__(self, entry: str = ENTRY_MODULE) -> None:
        self.entry = entry  # the module the roles run through (see ENTRY_MODULE)
        self.proc: subprocess.Popen[str] | None = None
        self.ready = False

    def start(self, log_path: Path | None) -> None:
        """Start importing torch & co. in the zygote (see the module docstring); its stderr
        goes to ``log_path``, or, if None, to the file :meth:`set_log` names later. Without
        a subreaper (not Linux) roles are plain subprocesses."""
        if os.environ.get("ZRL_NO_ZYGOTE") or not become_subreaper():
            return
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "zrl.run.zygote",
                f"--entry={self.entry}",
                *([] if log_path else ["--log-later"]),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(log_path, "ab") if log_path else subprocess.DEVNULL,  # noqa: SIM115
            text=True,
            bufsize=1,
            preexec_fn=set_parent_death_signal,
        )

    def set_log(self, log_path: Path) -> None:
        """The zygote's log file, for one started without it (read after its imports)."""
        if self.proc is not None and self.proc.stdin:
            try:
                self.proc.stdin.write(json.dumps({"log": str(log_path)}) + "\n")
                self.proc.stdin.flush()
            except OSError:
                pass  # it died: the first fork finds out and falls back

    def _call(self, request: dict[str, Any] | None) -> dict[str, Any] | None:
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        try:
            if request is not None:
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            return json.loads(line) if line else None
        except (OSError, ValueError):
            return None

    def fork(
        self, argv: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> ForkedRole | None:
        """``zrl ARGV`` in a child forked from the zygote, with ``env`` added to its
        environment (it travels on the zygote's stdin pipe, seen by no other process); None
        if there is no zygote or it failed."""
        if self.proc is None:
            return None
        if not self.ready:
            self.ready = (self._call(None) or {}).get("ready") is True
        request = {"argv": argv, "log": str(log_path), "env": env or {}}
        reply = self._call(request) if self.ready else None
        if reply is None or "pid" not in reply:
            log.warning("the zygote failed (%s): starting roles as plain processes", reply)
            self.stop()
            return None
        return ForkedRole(int(reply["pid"]))

    def close_input(self) -> None:
        """Close the zygote's input: it forks nothing more and exits by itself (``stop``
        waits for that)."""
        if self.proc is not None and self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.close_input()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
            if self.proc.stdout:
                self.proc.stdout.close()
            self.proc = None

    def kill(self) -> None:
        """Stop it at once, mid-import too (a config found bad after it started)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=5)
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe:
                    pipe.close()
            self.proc = None


class ForkedRole:
    """A role the zygote forked, driven like ``subprocess.Popen`` (poll, wait, signals)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: we cannot know how it ended
                self.returncode = -1
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                import subprocess

                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    _entries = [a.removeprefix("--entry=") for a in sys.argv[1:] if a.startswith("--entry=")]
    serve(_entries[-1] if _entries else ENTRY_MODULE, log_later="--log-later" in sys.argv[1:])
