"""launchers/ssh.py: the hosts file, the exact commands, the remote watchdog, and a real
launch over a real sshd on loopback (two "hosts" on one sshd) that must leave nothing behind."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import psutil
import pytest
import yaml

from tests.launchers.conftest import Sshd
from zrl.testing.probes import wait_for
from zrl.testing.processes import REPO, kill_pids

CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
LAUNCHER = REPO / "launchers" / "ssh.py"

HOSTS = """\
# name  ssh target       roles
node1   root@10.0.0.1    broker params learner replay=1   # the central roles
node2   root@10.0.0.2    actor=4 evaluator

node3   10.0.0.3         actor=2
"""


# --- hosts file -------------------------------------------------------------------------


def test_parse_hosts_reads_names_targets_and_counts(ssh_launcher: ModuleType) -> None:
    hosts = ssh_launcher.parse_hosts(HOSTS, "hosts.txt")
    assert [(h.name, h.target, h.roles, h.line) for h in hosts] == [
        ("node1", "root@10.0.0.1", {"broker": 1, "params": 1, "learner": 1, "replay": 1}, 2),
        ("node2", "root@10.0.0.2", {"actor": 4, "evaluator": 1}, 3),
        ("node3", "10.0.0.3", {"actor": 2}, 5),
    ]


@pytest.mark.parametrize(
    ("text", "where", "fragment"),
    [
        ("n1 h broker\nn2 h actr=2\n", "hosts.txt:2:", "unknown role 'actr'"),
        ("n1 h broker\n\nn2 h actor=x\n", "hosts.txt:3:", "whole number"),
        ("n1 h broker actor=0\n", "hosts.txt:1:", "whole number"),
        ("n1 h broker\nn2\n", "hosts.txt:2:", "expected 'HOST [user@]ssh-target"),
        ("n1 broker params\n", "hosts.txt:1:", "second field must be the ssh target"),
        ("n1 h broker\nn1 h2 actor\n", "hosts.txt:2:", "already defined on line 1"),
        ("n1 h broker actor actor=2\n", "hosts.txt:1:", "given twice"),
        ("n1 h broker\nn2 h\n", "hosts.txt:2:", "has no roles"),
        ("n1 h broker params\nn2 h params\n", "hosts.txt:2:", "params is already on line 1"),
        ("n1 h broker=2\n", "hosts.txt:1:", "runs one broker"),
        ("# only a comment\nn1 h actor\n", "hosts.txt:", "no host runs the broker"),
        ("# nothing\n\n", "hosts.txt:", "no hosts"),
    ],
)
def test_hosts_file_errors_name_the_line(
    ssh_launcher: ModuleType, text: str, where: str, fragment: str
) -> None:
    with pytest.raises(ssh_launcher.HostsFileError) as err:
        ssh_launcher.parse_hosts(text, "hosts.txt")
    assert str(err.value).startswith(where), err.value
    assert fragment in str(err.value)


def test_plan_starts_the_broker_first_with_global_indices(ssh_launcher: ModuleType) -> None:
    plan = ssh_launcher.plan_launches(ssh_launcher.parse_hosts(HOSTS))
    labels = [launch.label for launch in plan]
    assert labels[0] == "node1 broker"
    actors = [label for label in labels if "actor" in label]
    assert actors == [f"node2 actor-{i}" for i in range(4)] + ["node3 actor-4", "node3 actor-5"]
    assert set(labels[1:5]) == {"node1 params-0", "node1 learner-0", "node1 replay-0",
                                "node2 evaluator-0"}  # fmt: skip


def test_split_ssh_options_takes_everything_after_it(ssh_launcher: ModuleType) -> None:
    rest, ssh = ssh_launcher.split_ssh_options(
        ["h", "--ssh-option=-l bob", "--dry-run", "--ssh-option", "-p", "22", "--port", "1"]
    )
    assert rest == ["h", "--dry-run"]
    assert ssh == ["-l", "bob", "-p", "22", "--port", "1"]


# --- the commands (--dry-run) ------------------------------------------------------------


def _dry_run(ssh_launcher: ModuleType, tmp_path: Path, *args: str) -> tuple[int, str]:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(HOSTS)
    out = io.StringIO()
    code = ssh_launcher.main([str(hosts), "--config", str(CONFIG), "--dry-run", *args], out=out)
    return code, out.getvalue()


def _commands(output: str) -> list[list[str]]:
    """The printed commands (not the # comments), split as a shell would."""
    commands, current = [], ""
    for line in output.splitlines(keepends=True):
        if not current and line.startswith("#"):
            continue
        current += line
        try:
            commands.append(shlex.split(current))
            current = ""
        except ValueError:
            continue  # inside a quoted multi-line script
    assert not current
    return commands


def test_dry_run_prints_the_exact_commands(ssh_launcher: ModuleType, tmp_path: Path) -> None:
    code, output = _dry_run(
        ssh_launcher, tmp_path, "--insecure", "--set", "env.num_envs=2", "--python",
        "/opt/venv/bin/python", "--ssh-option", "-p", "2222", "-i", "/keys/id",
    )  # fmt: skip
    assert code == 0, output
    commands = _commands(output)
    # broker, its status check, 3 central roles + evaluator, 6 actors, the kill template
    assert len(commands) == 1 + 1 + 4 + 6 + 1
    for argv in commands:
        assert argv[:5] == ["ssh", "-p", "2222", "-i", "/keys/id"]  # the user's options win
        assert "BatchMode=yes" in argv
    broker, status, *roles, kill = commands
    assert broker[-2] == "root@10.0.0.1"
    script = broker[-1]
    assert (
        "/opt/venv/bin/python -m zrl start broker --bind tcp://0.0.0.0:5555 "
        '--config "$cfg" --log-level INFO --insecure' in script
    )
    config_text = script.split("<<\\ZRL_CONFIG_EOF\n", 1)[1].split("\nZRL_CONFIG_EOF\n", 1)[0]
    config = yaml.safe_load(config_text)
    assert config["env"]["num_envs"] == 2  # --set applied before shipping
    assert config["roles"] == {  # the counts of the hosts file
        "actors": 6, "replay": 1, "params": 1, "learners": 1, "evaluator": 1, "league": 0
    }  # fmt: skip
    assert status[-1] == (
        "/opt/venv/bin/python -m zrl status --broker tcp://10.0.0.1:5555 --timeout 2"
    )
    actor5 = [argv for argv in roles if "--index 5" in argv[-1]]
    assert len(actor5) == 1 and actor5[0][-2] == "10.0.0.3"
    assert (
        "PYTHONUNBUFFERED=1 /opt/venv/bin/python -m zrl start actor --broker "
        "tcp://10.0.0.1:5555 --index 5 --connect-timeout 120 --log-level INFO" in actor5[0][-1]
    )
    assert kill[-2:] == ["TARGET", "kill -KILL PID"]


def test_dry_run_passes_keys_to_every_role(ssh_launcher: ModuleType, tmp_path: Path) -> None:
    code, output = _dry_run(ssh_launcher, tmp_path, "--keys", "/srv/zrl-keys")
    assert code == 0, output
    for argv in _commands(output)[:-1]:
        assert "--keys /srv/zrl-keys" in argv[-1], argv[-1]
    assert "--insecure" not in output


def test_public_broker_without_keys_is_refused(
    ssh_launcher: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, output = _dry_run(ssh_launcher, tmp_path)
    assert code == 2 and output == ""
    assert "--keys DIR" in capsys.readouterr().err


def test_loopback_broker_far_from_other_hosts_is_refused(
    ssh_launcher: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = _dry_run(ssh_launcher, tmp_path, "--broker-host", "127.0.0.1")
    assert code == 2
    assert "node2, node3 cannot reach: pass --broker-host" in capsys.readouterr().err


def test_a_bad_config_fails_before_any_ssh(
    ssh_launcher: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, output = _dry_run(ssh_launcher, tmp_path, "--insecure", "--set", "replay.capacity=abc")
    assert code == 2 and output == ""
    assert "replay.capacity" in capsys.readouterr().err


def test_remote_config_is_passed_with_overrides(ssh_launcher: ModuleType, tmp_path: Path) -> None:
    code, output = _dry_run(
        ssh_launcher, tmp_path, "--insecure", "--remote-config", "--set", "seed=3"
    )
    assert code == 0, output
    script = _commands(output)[0][-1]
    assert "ZRL_CONFIG_EOF" not in script
    assert f"--config {CONFIG} --set=seed=3 --set=roles.actors=6 " in script


def test_runs_as_a_script(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(HOSTS)
    done = subprocess.run(
        [sys.executable, str(LAUNCHER), str(hosts), "--config", str(CONFIG), "--insecure",
         "--dry-run"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# broker address tcp://10.0.0.1:5555")


# --- the remote wrapper, run by local shells ---------------------------------------------


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("shell", ["sh", "bash"])
@pytest.mark.parametrize(
    ("command", "expected_code"),
    [
        ("exec sleep 30", 143),  # stops on SIGTERM
        ("sh -c 'trap \"\" TERM; exec sleep 30'", 137),  # ignores it: SIGKILL after the grace
    ],
)
def test_watchdog_stops_the_role_when_stdin_closes(
    ssh_launcher: ModuleType, shell: str, command: str, expected_code: int
) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} not installed")
    script = ssh_launcher.remote_script(command, grace=0.5)
    proc = subprocess.Popen(
        [shell, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        marker = proc.stdout.readline().decode()
        assert marker.startswith(ssh_launcher.PID_MARKER), marker
        pid = int(marker.strip().split("=", 1)[1])
        time.sleep(0.3)  # the role is running, and stays so while stdin is open
        assert _alive(pid) and proc.poll() is None
        proc.stdin.close()
        assert proc.wait(timeout=10) == expected_code
        assert not _alive(pid)
    finally:
        kill_pids([proc.pid])


# --- a real launch over a real sshd --------------------------------------------------------


def _port(broker_addr: str) -> int:
    return int(broker_addr.rsplit(":", 1)[1])


def _remote_processes(port: int) -> list[psutil.Process]:
    """Every process of the launch: ssh clients, remote shells, `zrl start` (not this test)."""
    needle = f"127.0.0.1:{port}"
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] != os.getpid() and needle in cmd and "zrl" in cmd:
            found.append(p)
    return found


def _kill_leftovers(port: int) -> None:
    for p in _remote_processes(port):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _start_launcher(
    sshd: Sshd, tmp_path: Path, hosts: str, port: int, *extra: str
) -> tuple[subprocess.Popen[bytes], Path]:
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(hosts.format(target=sshd.target))
    out = tmp_path / "launcher.out"
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(LAUNCHER), str(hosts_file), "--config", str(CONFIG),
             "--port", str(port), "--python", sys.executable, "--grace", "5", *extra,
             "--ssh-option", *sshd.ssh_options],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path,
        )  # fmt: skip
    return proc, out


def _status(broker_addr: str) -> dict[str, str]:
    """`zrl status --json`: role id -> state ({} while the broker does not answer)."""
    done = subprocess.run(
        [sys.executable, "-m", "zrl", "status", "--broker", broker_addr, "--json",
         "--timeout", "2"],
        capture_output=True, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        return {}
    return {r["id"]: r["state"] for r in json.loads(done.stdout)["roles"]}


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_launch_over_ssh_registers_streams_and_stops_everything(
    sshd: Sshd, tmp_path: Path, broker_addr: str
) -> None:
    port = _port(broker_addr)
    hosts = (
        "node1 {target} broker params replay learner actor\n"
        "node2 {target} actor evaluator   # a second 'host' on the same sshd\n"
    )
    launcher, out = _start_launcher(
        sshd, tmp_path, hosts, port, "--set", "env.num_envs=2", "--set", "evaluator.episodes=1"
    )
    expected = {"params-0", "replay-0", "learner-0", "actor-0", "actor-1", "evaluator-0"}
    try:

        def all_alive() -> bool:
            assert launcher.poll() is None, out.read_text(errors="replace")
            states = _status(broker_addr)
            return set(states) == expected and set(states.values()) == {"alive"}

        wait_for(all_alive, timeout=90, interval=0.5)

        labels = ["node1 broker", "node1 params-0", "node1 replay-0", "node1 learner-0",
                  "node1 actor-0", "node2 actor-1", "node2 evaluator-0"]  # fmt: skip

        def streamed() -> bool:
            text = out.read_text(errors="replace")
            return all(f"[{label}] " in text for label in labels)

        wait_for(streamed, timeout=30)
        text = out.read_text(errors="replace")
        assert re.search(r"^\[node2 actor-1\] .*registered as actor-1", text, re.M), text
        assert "@zrl-launch" not in text  # the wrapper's PID line is for the launcher only

        launcher.send_signal(signal.SIGINT)
        wait_for(lambda: not _remote_processes(port), timeout=15, interval=0.2)
        assert launcher.wait(timeout=15) == 0
        text = out.read_text(errors="replace")
        for label in labels:
            assert f"[launcher] {label} stopped (code" in text, text
    finally:
        kill_pids([launcher.pid])
        _kill_leftovers(port)


@pytest.mark.timeout(90)
def test_remote_processes_die_when_the_launcher_is_killed(
    sshd: Sshd, tmp_path: Path, broker_addr: str
) -> None:
    port = _port(broker_addr)
    launcher, out = _start_launcher(sshd, tmp_path, "node1 {target} broker\n", port)
    try:
        wait_for(lambda: "the broker answers" in out.read_text(errors="replace"), timeout=60)
        assert _remote_processes(port)
        launcher.kill()  # no chance to clean up: the remote watchdogs must see the end
        launcher.wait()
        wait_for(lambda: not _remote_processes(port), timeout=15, interval=0.2)
    finally:
        kill_pids([launcher.pid])
        _kill_leftovers(port)
