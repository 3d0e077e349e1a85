"""The ``zrl`` command line, run as real subprocesses (``python -m zrl ...``).

Every invocation of this module is started at once by a module fixture (each one is
mostly interpreter start-up, so running them side by side saves most of the wall
time); every child is waited for with a timeout and killed by PID if it overruns."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import typer.main
import yaml

from tests.conftest import REPO, kill_pids
from zrl import __version__
from zrl.cli import app
from zrl.config import DEFAULT_STREAMS, ExperimentConfig
from zrl.supervisor import free_port_range
from zrl.transport.protocol import PROTOCOL_VERSION
from zrl.transport.sockets import broker_endpoints

CONFIG = "configs/cartpole_apex_dqn.yaml"
COMMANDS = {"version", "status", "run", "eval", "plot", "start", "config", "keys"}
ROLES = {"broker", "actor", "replay", "params", "learner", "evaluator"}


@dataclass
class Result:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def _dead_address() -> str:
    n = len(broker_endpoints("tcp://127.0.0.1:1", list(DEFAULT_STREAMS)))
    return f"tcp://127.0.0.1:{free_port_range(n)}"


def _invocations() -> dict[str, tuple[str, ...]]:
    port = free_port_range(1)
    return {
        "help": ("--help",),
        "start_help": ("start", "--help"),
        "version": ("version",),
        "config_show": ("config", "show", CONFIG, "--set", "replay.capacity=5000"),
        "missing_config": ("config", "show", "configs/does_not_exist.yaml"),
        "bad_override": ("config", "show", CONFIG, "--set", "replay.capacity=abc"),
        "unknown_role": ("start", "foo", "--broker", _dead_address()),
        "status_dead": ("status", "--broker", _dead_address(), "--timeout", "0.5"),
        "public_bind": ("start", "broker", "--bind", f"tcp://0.0.0.0:{port}"),
    }


@pytest.fixture(scope="module")
def cli() -> dict[str, Result]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "zrl", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            env=env,
            text=True,
        )
        for name, args in _invocations().items()
    }
    results = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=45)
            results[name] = Result(tuple(proc.args[3:]), proc.returncode, out, err)
    finally:
        kill_pids([p.pid for p in procs.values() if p.poll() is None], grace=1.0)
    return results


def help_rows(text: str) -> dict[str, str]:
    """'name   help text' rows of a rich help panel."""
    rows = {}
    for line in text.splitlines():
        parts = line.strip("│ ").split(None, 1)
        if len(parts) == 2:
            rows[parts[0]] = parts[1].strip()
    return rows


def test_help_lists_every_command_with_its_help(cli):
    r = cli["help"]
    assert r.returncode == 0, r.stderr
    registered = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    assert set(registered) == COMMANDS
    rows = help_rows(r.stdout)
    for name, cmd in registered.items():
        assert cmd.help, f"command {name} has no help text"
        assert rows.get(name) == cmd.help.strip().splitlines()[0], r.stdout


def test_start_help_lists_broker_and_every_role(cli):
    r = cli["start_help"]
    assert r.returncode == 0, r.stderr
    rows = help_rows(r.stdout)
    for name in ROLES:
        assert rows.get(name, "").startswith("Run "), f"{name} missing from:\n{r.stdout}"


def test_version(cli):
    r = cli["version"]
    assert r.returncode == 0
    assert r.stdout == f"zrl {__version__} (protocol {PROTOCOL_VERSION})\n"


def test_config_show_applies_override(cli):
    r = cli["config_show"]
    assert r.returncode == 0, r.stderr
    assert "  capacity: 5000\n" in r.stdout
    shown = yaml.safe_load(r.stdout)
    cfg = ExperimentConfig.model_validate(shown)  # the full, resolved config
    assert cfg.replay.capacity == 5000
    assert cfg.name == "cartpole_apex_dqn"
    assert shown["broker"]["streams"] == list(DEFAULT_STREAMS)  # defaults filled in


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("missing_config", "config file not found: configs/does_not_exist.yaml"),
        ("bad_override", "replay.capacity: "),
        ("status_dead", "no answer from a broker at tcp://127.0.0.1:"),
        ("public_bind", "is reachable from other hosts"),
    ],
)
def test_bad_input_is_one_error_line(cli, name, expected):
    r = cli[name]
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ")
    assert expected in lines[0]


def test_bad_override_names_key_and_value(cli):
    line = cli["bad_override"].stderr.strip()
    assert "replay.capacity" in line and "'abc'" in line


def test_public_bind_mentions_insecure(cli):
    assert "--insecure" in cli["public_bind"].stderr


def test_unknown_role_is_usage_error(cli):
    r = cli["unknown_role"]
    assert r.returncode == 2
    assert "Traceback" not in r.stderr + r.stdout
    assert "No such command 'foo'" in r.stderr
    assert r.stdout == ""
