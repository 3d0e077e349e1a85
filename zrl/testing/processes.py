"""Real ``zrl`` processes in tests: starting them, asking them, and never leaving one behind.

Cleanup is by PID, of processes the test started (or that name its run in their command line),
never by a broad name match: other zrl runs on the machine are left alone.

- :data:`REPO`: the source checkout this zrl is imported from (``configs/``, ``launchers/``).
- :func:`start_zrl`: ``python -m zrl ARGS...`` with its output in a log file.
- :func:`kill_pids`: SIGTERM, wait, then SIGKILL (reaping our children).
- :func:`zrl_processes`: the processes whose command line names a run (its broker address or
  run directory): what a finished run must not leave behind.
- :func:`run_broker_address`, :func:`zrl_status_json`, :func:`status_rows`: a running run's
  broker address, and its role table as ``zrl status --json`` and straight from the registry.
- :func:`run_zrl`: a whole ``zrl run`` of a shipped config that must learn and clean up.
- :func:`tensorboard_tags`: the scalar tags a run directory's TensorBoard files hold.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import zmq

from zrl.roles.errors import RoleError
from zrl.roles.registry_client import read_status
from zrl.testing.probes import wait_for
from zrl.transport.security import Keys, load_keys

REPO = Path(__file__).resolve().parents[2]
_LOGS: dict[int, Path] = {}
"""The log file of each process :func:`start_zrl` started, by pid (:func:`output_of`)."""
RANDOM_POLICY_RETURN = 22.0  # mean CartPole-v1 return of uniformly random actions
GUARD_S = 600
"""The wall time of a test run bounded by env steps or updates: a guard, not the measure (at
load 20 a 2-core box gives a role a tenth of its quiet speed, or less)."""


def kill_pids(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM, wait, then SIGKILL every pid still alive (processes we started only)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            time.sleep(0.05)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def start_zrl(
    *args: str, log: Path, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``python -m zrl ARGS...`` with stdout and stderr in ``log`` and ``env`` added to
    ours; the caller kills it (:func:`kill_pids`)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zrl", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env={**os.environ, **env} if env else None,
        )
    _LOGS[proc.pid] = log
    return proc


def output_of(proc: subprocess.Popen[bytes], limit: int = 3000) -> str:
    """The last ``limit`` characters a process :func:`start_zrl` started wrote (its stdout and
    stderr), for an assertion's message; empty when there is none to read."""
    log = _LOGS.get(proc.pid)
    try:
        return log.read_text(errors="replace")[-limit:] if log is not None else ""
    except OSError:
        return ""


def zrl_processes(marker: str) -> list[psutil.Process]:
    """Processes whose command line mentions ``marker`` (a run's broker address or run dir)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def zrl_run_command(config: Path, run_dir: Path, overrides: list[str]) -> list[str]:
    """The `zrl run CONFIG --run-dir RUN_DIR --set ...` command line, on this Python."""
    cmd = [sys.executable, "-m", "zrl", "run", str(config), "--run-dir", str(run_dir)]
    return cmd + [arg for item in overrides for arg in ("--set", item)]


def run_broker_address(
    proc: subprocess.Popen, run_dir: Path, log: Path, timeout: float = 60.0
) -> str:
    """The broker address a `zrl run` child writes into its run directory (fails with the
    run's log if it exits first)."""
    addr_file = run_dir / "broker_address"
    wait_for(lambda: addr_file.exists() or proc.poll() is not None, timeout=timeout)
    assert proc.poll() is None, log.read_text()[-3000:]
    return note_run(addr_file.read_text().strip(), run_dir)


def note_run(addr: str, run_dir: Path) -> str:
    """Remember the keys of the run in ``run_dir`` whose broker is at ``addr`` (for
    ``run_keys``, ``status_rows``, ``zrl_status_json``); returns ``addr``."""
    if (run_dir / "keys").is_dir():  # made before the broker, so whole by now
        _RUN_KEYS[addr] = load_keys(run_dir / "keys")
    return addr


_RUN_KEYS: dict[str, Keys] = {}
"""The keys of each run whose broker address ``note_run`` was given, loaded once."""


def run_keys(addr: str) -> Keys | None:
    """The keys of the `zrl run` whose broker is at ``addr`` (a run makes its own by
    default), None for a run without keys (``--insecure``) or one this process never saw."""
    return _RUN_KEYS.get(addr)


def end_run(proc: subprocess.Popen, addr: str) -> list[psutil.Process]:
    """After a test of a background `zrl run`: the run stopped (SIGTERM, then SIGKILL past 15
    s) if it is still going, and every process of it that outlived it (``addr``: its broker
    address, "" if it never had one) killed. Returns those leftovers: there must be none."""
    if proc.poll() is None:
        kill_pids([proc.pid], grace=15)
    leftovers = zrl_processes(addr) if addr else []
    for p in leftovers:
        p.kill()
    psutil.wait_procs(leftovers, timeout=5)
    return leftovers


def zrl_status_json(addr: str) -> dict[str, Any]:
    """`zrl status --json` as a user would run it (a real subprocess)."""
    out = subprocess.run(
        [sys.executable, "-m", "zrl", "status", "--broker", addr, "--json", "--timeout", "5"]
        + (["--keys", str(_RUN_KEYS[addr].directory)] if addr in _RUN_KEYS else []),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def status_rows(ctx: zmq.Context, addr: str) -> dict[str, dict[str, Any]]:
    """The broker's role table by id ({} when it does not answer within a second)."""
    try:
        reply = read_status(ctx, addr, 1.0, run_keys(addr))
    except RoleError:
        return {}
    return {r["id"]: r for r in reply["roles"]}


def run_zrl(
    tmp_path: Path,
    config: str,
    *overrides: str,
    wall_time: int = 60,
    beats: float | None = 5 * RANDOM_POLICY_RETURN,
    env: dict[str, str] | None = None,
) -> dict:
    """`zrl run` of ``configs/<config>`` to one evaluation at the target or ``wall_time``: it
    must exit 0, reach a best evaluation above ``beats`` (by default clearly above a random
    CartPole policy; None: no evaluation asked, for a run without an evaluator), and leave no
    process of the run behind. Returns the summary, with the run dir under "dir" and what
    the run printed under "output". ``env``: variables added to ours."""
    run_dir = tmp_path / "run"
    cmd = zrl_run_command(
        REPO / "configs" / config,
        run_dir,
        [f"stop.wall_time={wall_time}", "stop.eval_window=1", *overrides],
    )
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        env={**os.environ, **env} if env else None,
    )
    try:
        out, _ = proc.communicate(timeout=wall_time + 90)
    finally:
        if proc.poll() is None:
            kill_pids([proc.pid])
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    # Clearly beats a random policy: learning happened.
    if beats is not None:
        assert summary["best_eval_return"] > beats, (summary, text[-3000:])
    broker = (run_dir / "broker_address").read_text().strip()
    time.sleep(0.5)  # the run's children exit just after it: give them that moment
    left = zrl_processes(broker)
    assert not left, [p.cmdline() for p in left]
    summary["dir"] = run_dir
    summary["output"] = text
    return summary


def zrl_eval(run_dir: Path, episodes: int) -> tuple[float, str]:
    """`zrl eval RUN_DIR --episodes N`: it must exit 0; its mean return (the last line's) and
    everything it printed."""
    ev = subprocess.run(
        [sys.executable, "-m", "zrl", "eval", str(run_dir), "--episodes", str(episodes)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ev.returncode == 0, ev.stderr
    return float(ev.stdout.strip().splitlines()[-1].split()[1]), ev.stdout


def tensorboard_tags(run_dir: Path) -> set[str]:
    """The scalar tags in ``run_dir``'s TensorBoard event files, read as TensorBoard does."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return set(events.Tags()["scalars"])
