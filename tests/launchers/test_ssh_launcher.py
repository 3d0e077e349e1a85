"""launchers/ssh.py: the hosts file, the exact commands, the remote watchdog, a real launch
over a real sshd on loopback (two "hosts" on one sshd) stopped with Ctrl-C, and a real run on
hosts that are network namespaces (an sshd each) that ends at its target. No launch may leave
anything behind."""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Collection
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import pytest
import yaml

from tests.launchers.conftest import NetnsSshd, Sshd
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


def test_plan_starts_the_head_then_one_agent_per_host_with_global_indices(
    ssh_launcher: ModuleType,
) -> None:
    plan = ssh_launcher.plan_launches(ssh_launcher.parse_hosts(HOSTS))
    assert [(launch.label, launch.specs) for launch in plan] == [
        ("node1 head", ()),
        ("node1 host", ("params=1@0", "replay=1@0", "learner=1@0")),
        ("node2 host", ("evaluator=1@0", "actor=4@0")),
        ("node3 host", ("actor=2@4",)),
    ]


def test_a_broker_only_host_runs_no_agent(ssh_launcher: ModuleType) -> None:
    hosts = ssh_launcher.parse_hosts("n1 h1 broker\nn2 h2 actor=2 learner\nn3 h3 actor\n")
    assert [(launch.label, launch.specs) for launch in ssh_launcher.plan_launches(hosts)] == [
        ("n1 head", ()),
        ("n2 host", ("learner=1@0", "actor=2@0")),
        ("n3 host", ("actor=1@2",)),
    ]
    assert json.loads(ssh_launcher.placement_json(hosts)) == [
        {"name": "n2", "roles": {"actors": 2, "learners": 1}},
        {"name": "n3", "roles": {"actors": 1}},
    ]


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
        ssh_launcher,
        tmp_path,
        "--insecure",
        "--set",
        "env.num_envs=2",
        "--python",
        "/opt/venv/bin/python",
        "--run-dir",
        "runs/exp1",
        "--ssh-option",
        "-p",
        "2222",
        "-i",
        "/keys/id",
    )
    assert code == 0, output
    commands = _commands(output)
    # the head, its status check, one agent per host (3), the kill template
    assert len(commands) == 1 + 1 + 3 + 1
    for argv in commands:
        assert argv[:5] == ["ssh", "-p", "2222", "-i", "/keys/id"]  # the user's options win
        assert "BatchMode=yes" in argv
    head, status, *agents, kill = commands
    assert head[-2] == "root@10.0.0.1"
    script = head[-1]
    assert (
        "/opt/venv/bin/python -m zrl start broker --run-dir runs/exp1 --bind tcp://0.0.0.0:5555 "
        '--config "$cfg" --log-level INFO --insecure' in script
    )
    assert "sleep 60;" in script  # --head-grace: the head has time to stop the run everywhere
    config_text = script.split("<<\\ZRL_CONFIG_EOF\n", 1)[1].split("\nZRL_CONFIG_EOF\n", 1)[0]
    config = yaml.safe_load(config_text)
    assert config["env"]["num_envs"] == 2  # --set applied before shipping
    assert config["roles"] == {  # the counts of the hosts file
        "actors": 6,
        "replay": 1,
        "params": 1,
        "learners": 1,
        "evaluator": 1,
        "league": 0,
        "inference": 0,
        "pbt": 0,
    }
    assert config["hosts"] == [  # and its placement, so the head names the hosts
        {"name": "node1", "address": None, "roles": {"params": 1, "learners": 1, "replay": 1}},
        {"name": "node2", "address": None, "roles": {"actors": 4, "evaluator": 1}},
        {"name": "node3", "address": None, "roles": {"actors": 2}},
    ]
    assert config["broker"]["advertise"] == "10.0.0.1"
    # relative: under every role's working directory, whatever the host's login directory
    assert config["checkpoint"]["dir"] == "runs/exp1/checkpoints"
    assert status[-1] == (
        "/opt/venv/bin/python -m zrl status --broker tcp://10.0.0.1:5555 --timeout 2"
    )
    assert [argv[-2] for argv in agents] == ["root@10.0.0.1", "root@10.0.0.2", "10.0.0.3"]
    assert (
        "PYTHONUNBUFFERED=1 /opt/venv/bin/python -m zrl host --broker tcp://10.0.0.1:5555 "
        "--connect-timeout 120 --log-dir zrl-logs/exp1/node3 --checkpoint-root "
        "runs/exp1/checkpoints --log-level INFO actor=2@4 </dev/null" in agents[2][-1]
    )
    assert "evaluator=1@0 actor=4@0 </dev/null" in agents[1][-1]
    assert "sleep 10;" in agents[1][-1]  # --grace
    assert kill[-2:] == ["TARGET", "kill -KILL PID"]


def test_default_run_dir_is_named_after_the_config_and_the_time(
    ssh_launcher: ModuleType, tmp_path: Path
) -> None:
    code, output = _dry_run(ssh_launcher, tmp_path, "--insecure", "--log-dir", "/var/log/zrl")
    assert code == 0, output
    run_dir = re.search(r"^# run directory (\S+) on node1", output, re.M)
    assert run_dir is not None, output
    assert re.fullmatch(r"runs/cartpole_apex_dqn-\d{8}-\d{6}", run_dir[1])
    assert f"--run-dir {run_dir[1]} " in output
    assert "--log-dir /var/log/zrl/node2 " in output


def test_dry_run_passes_keys_to_every_role(ssh_launcher: ModuleType, tmp_path: Path) -> None:
    code, output = _dry_run(ssh_launcher, tmp_path, "--keys", "/srv/zrl-keys")
    assert code == 0, output
    for argv in _commands(output)[:-1]:
        assert "--keys /srv/zrl-keys" in argv[-1], argv[-1]
    assert "--insecure" not in output


def test_dry_run_passes_factory_references_to_the_head_and_every_agent(
    ssh_launcher: ModuleType, tmp_path: Path
) -> None:
    code, output = _dry_run(
        ssh_launcher,
        tmp_path,
        "--keys",
        "/srv/zrl-keys",
        "--env-factory",
        "mysim.envs:make",
        "--model-factory",
        "mysim.nets:build",
        "--env-id",
        "mysim.envs:Sim-v0",
    )
    assert code == 0, output
    commands = [argv[-1] for argv in _commands(output)[:-1]]
    head = [c for c in commands if "start broker" in c]
    agents = [c for c in commands if " host " in c]
    assert len(head) == 1 and agents, output
    assert "--env-factory mysim.envs:make --model-factory mysim.nets:build" in head[0]
    for agent in agents:
        assert (
            "--env-factory mysim.envs:make --model-factory mysim.nets:build "
            "--env-id mysim.envs:Sim-v0" in agent
        ), agent


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
        ssh_launcher,
        tmp_path,
        "--insecure",
        "--remote-config",
        "--set",
        "seed=3",
        "--run-dir",
        "/data/run1",
    )
    assert code == 0, output
    head, _, *agents, _ = _commands(output)
    script = head[-1]
    assert "ZRL_CONFIG_EOF" not in script
    assert f"--config {CONFIG} --set=seed=3 --set=roles.actors=6 " in script
    assert "'--set=hosts=[{" in script and "--set=broker.advertise=10.0.0.1 " in script
    assert "--set=checkpoint.dir=/data/run1/checkpoints " in script
    assert all("--checkpoint-root /data/run1/checkpoints " in a[-1] for a in agents)
    # a checkpoint.dir of the user's own is kept, and is every agent's checkpoint root
    code, output = _dry_run(
        ssh_launcher, tmp_path, "--insecure", "--remote-config", "--set", "checkpoint.dir=/ckpt"
    )
    head, _, *agents, _ = _commands(output)
    assert "--set=checkpoint.dir=/ckpt " in head[-1]
    assert "--set=checkpoint.dir=runs/" not in head[-1]
    assert all("--checkpoint-root /ckpt " in a[-1] for a in agents)


def test_runs_as_a_script(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(HOSTS)
    done = subprocess.run(
        [
            sys.executable,
            str(LAUNCHER),
            str(hosts),
            "--config",
            str(CONFIG),
            "--insecure",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
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
# ssh gives the remote commands a fresh environment: `env PYTHONPATH=REPO python` makes the
# hosts run this checkout's zrl, whatever is installed.
REMOTE_PYTHON = f"env PYTHONPATH={REPO} {sys.executable}"


def _port(broker_addr: str) -> int:
    return int(broker_addr.rsplit(":", 1)[1])


def _remote_processes(port: int) -> list[psutil.Process]:
    """Every process of the launch: ssh clients, remote shells, head, agents, roles (whose
    command lines name the broker's port), not this test."""
    needles = (f"127.0.0.1:{port}", f"tcp://0.0.0.0:{port}")
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] != os.getpid() and any(n in cmd for n in needles) and "zrl" in cmd:
            found.append(p)
    return found


def _kill_leftovers(port: int) -> None:
    kill_pids([p.pid for p in _remote_processes(port)])


def _start_launcher(
    sshd: Sshd, tmp_path: Path, hosts: str, port: int, *extra: str
) -> tuple[subprocess.Popen[bytes], Path]:
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(hosts.format(target=sshd.target))
    out = tmp_path / "launcher.out"
    # --head-grace 40: under CI load the head's own stop (every role, summary.json, the
    # learning curve) took over 15 s, and the watchdog's SIGKILL made it exit 137.
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(LAUNCHER),
                str(hosts_file),
                "--config",
                str(CONFIG),
                "--port",
                str(port),
                "--python",
                REMOTE_PYTHON,
                "--grace",
                "5",
                "--head-grace",
                "40",
                "--run-dir",
                str(tmp_path / "run"),
                "--log-dir",
                str(tmp_path / "logs"),
                *extra,
                "--ssh-option",
                *sshd.ssh_options,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
        )
    return proc, out


def _status(
    broker_addr: str,
    run: Callable[..., subprocess.CompletedProcess[str]] | None = None,
    keys: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """`zrl status --json`: role id -> its row ({} while the broker does not answer); ``run``
    runs the command elsewhere (inside a namespace), with ``keys`` where the run has some."""
    argv = [
        sys.executable,
        "-m",
        "zrl",
        "status",
        "--broker",
        broker_addr,
        "--json",
        "--timeout",
        "2",
        *(["--keys", str(keys)] if keys is not None else []),
    ]
    if run is None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    else:
        done = run(*argv, timeout=60)
    if done.returncode != 0:
        return {}
    return {r["id"]: r for r in json.loads(done.stdout)["roles"]}


ROLE_IDS = {"params-0", "replay-0", "learner-0", "actor-0", "actor-1", "evaluator-0"}


@pytest.mark.waits  # mostly waits: roles starting over ssh, then stopping after the Ctrl-C
@pytest.mark.timeout(150)
@pytest.mark.slow
def test_launch_over_ssh_runs_a_head_and_agents_and_ctrl_c_stops_everything(
    sshd: Sshd, tmp_path: Path, broker_addr: str
) -> None:
    port = _port(broker_addr)
    hosts = (
        "node1 {target} broker params replay learner actor\n"
        "node2 {target} actor evaluator   # a second 'host' on the same sshd\n"
    )
    # No return target: Ctrl-C is what ends this run. At load 10 the config's own target
    # (475) came 40 s in, before the test's status checks were done.
    launcher, out = _start_launcher(
        sshd,
        tmp_path,
        hosts,
        port,
        *("--set", "env.num_envs=2", "--set", "evaluator.episodes=1"),
        *("--set", "stop.eval_return=null"),
    )
    try:

        def all_alive() -> bool:
            assert launcher.poll() is None, out.read_text(errors="replace")
            rows = _status(broker_addr)
            return set(ROLE_IDS) <= set(rows) and all(rows[r]["state"] == "alive" for r in ROLE_IDS)

        wait_for(all_alive, timeout=90, interval=0.5)
        agents = [r for r in _status(broker_addr).values() if r["role"] == "host"]
        assert len(agents) == 2, agents  # one agent per host, registered as role `host`

        labels = ["node1 head", "node1 host", "node2 host"]

        def streamed() -> bool:
            text = out.read_text(errors="replace")
            return all(f"[{label}] " in text for label in labels)

        wait_for(streamed, timeout=30)
        text = out.read_text(errors="replace")
        assert "@zrl-launch" not in text  # the wrapper's PID line is for the launcher only
        # each agent says where its roles log; the roles log to files on their host
        assert re.search(
            rf"^\[node2 host\] .*{re.escape(str(tmp_path / 'logs' / 'node2'))}", text, re.M
        ), text
        log = tmp_path / "logs" / "node2" / "actor-1.log"  # actor-1 is alive (above)
        wait_for(lambda: log.exists() and log.stat().st_size > 0, timeout=10)

        launcher.send_signal(signal.SIGINT)
        # Ctrl-C's exit code; the head, stopped by the launcher's SIGTERM, exits 143.
        assert launcher.wait(timeout=60) == 130, out.read_text(errors="replace")
        wait_for(lambda: not _remote_processes(port), timeout=15, interval=0.2)
        text = out.read_text(errors="replace")
        assert "[launcher] stop requested: stopping the head" in text, text
        head_end = r"^\[launcher\] node1 head (stopped|exited) \(code 143\)$"
        assert re.search(head_end, text, re.M), text
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["stop_reason"] == "interrupted"
        assert set(summary["roles"]["took_part"]) >= ROLE_IDS
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
        wait_for(lambda: not _remote_processes(port), timeout=30, interval=0.2)
    finally:
        kill_pids([launcher.pid])
        _kill_leftovers(port)


# --- a real run on hosts that are network namespaces ----------------------------------------


def _in_namespaces(hosts: Any, skip: Collection[int]) -> list[int]:
    """PIDs of every process inside the namespaces of ``hosts``, but ``skip``."""
    inodes = set()
    for ns in [hosts.switch, *hosts.names]:
        with contextlib.suppress(OSError):
            inodes.add(os.stat(f"/run/netns/{ns}").st_ino)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.waits  # a multi-host launch: mostly waiting on hosts; a low CartPole target
@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_launch_on_namespaced_hosts_reaches_its_target_and_leaves_nothing(
    netns_sshd: NetnsSshd, tmp_path: Path
) -> None:
    """The launcher on h0 (no sshd), the head and the central roles on node1 = h1, two actors
    and the evaluator on node2 = h2, each reached over ssh at its own address. An actor killed
    with -9 comes back (its agent restarts it, and summary.json counts that restart even when
    the run met its target before the new process registered); the head stops the run at the
    target; the agents exit by themselves; the launcher exits 0; nothing is left in any
    namespace. With keys (one `zrl keys init` directory at the same path on every host): the
    restarted actor proves its id and takes it over at once."""
    hosts = netns_sshd.hosts
    keys = tmp_path / "keys"
    subprocess.run(
        [sys.executable, "-m", "zrl", "keys", "init", str(keys)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(
        f"node1 {netns_sshd.target(1)} broker params replay learner\n"
        f"node2 {netns_sshd.target(2)} actor=2 evaluator\n"
    )
    run_dir = tmp_path / "run"
    out = tmp_path / "launcher.out"
    broker = f"tcp://{hosts.addrs[1]}:5555"  # a namespace of our own: no port can clash
    launcher = hosts.exec(
        0,
        sys.executable,
        str(LAUNCHER),
        str(hosts_file),
        "--config",
        str(CONFIG),
        "--keys",
        str(keys),
        "--run-dir",
        str(run_dir),
        "--log-dir",
        str(tmp_path / "logs"),
        "--python",
        REMOTE_PYTHON,
        "--grace",
        "5",
        "--head-grace",
        "30",
        "--set",
        # The mean of 8 evaluations, 2 s apart (random: 22): a run of some 20 s at least, so
        # the killed actor's restart comes before the stop even where learning takes seconds.
        "stop.eval_return=80",
        "--set",
        "stop.eval_window=8",
        "--set",
        "stop.wall_time=150",
        "--ssh-option",
        *netns_sshd.ssh_options,
        log=out,
    )
    try:

        def status() -> dict[str, dict[str, Any]]:
            assert launcher.poll() is None, out.read_text(errors="replace")[-3000:]
            return _status(
                broker, lambda *argv, timeout: hosts.run(0, *argv, timeout=timeout), keys
            )

        victim = "actor-1"
        actor_log = tmp_path / "logs" / "node2" / f"{victim}.log"

        def victim_pid() -> int | None:
            """actor-1's process on node2 once it has registered. Found by its command line
            and namespace, not by `zrl status`: a status call starts a Python process, which
            at load 10 took longer than the run took to meet its target."""
            text = actor_log.read_text(errors="replace") if actor_log.is_file() else ""
            if f"registered as {victim}" not in text:
                return None
            for proc in psutil.process_iter(["pid", "cmdline"]):
                line = " ".join(proc.info["cmdline"] or [])
                if re.search(r"zrl start actor .*--index 1( |$)", line) and (
                    hosts.netns_of(proc.info["pid"]) == hosts.names[2]
                ):
                    return int(proc.info["pid"])
            return None

        first_pid = wait_for(victim_pid, timeout=90, message=f"{victim} never came up on node2")
        assert isinstance(first_pid, int)
        os.kill(first_pid, signal.SIGKILL)

        def back() -> bool:
            if launcher.poll() is not None:  # the run met its target first: summary.json
                return True  # must still count the restart (asserted below)
            row = status().get(victim, {})
            return row.get("state") == "alive" and row.get("pid") != first_pid

        wait_for(back, timeout=60, message="the host agent did not bring the actor back")
        try:
            code = launcher.wait(timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail(out.read_text(errors="replace")[-3000:])
        text = out.read_text(errors="replace")
        assert code == 0, text[-3000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["reached_target"], (summary, text[-3000:])
        took_part = summary["roles"]["took_part"]
        assert summary["roles"]["never_came"] == []
        placed = {rid: r["placed"] for rid, r in took_part.items() if rid in ROLE_IDS}
        assert placed == {
            "params-0": "node1",
            "replay-0": "node1",
            "learner-0": "node1",
            "actor-0": "node2",
            "actor-1": "node2",
            "evaluator-0": "node2",
        }
        assert summary["restarts"].get(victim, 0) >= 1, summary["restarts"]
        # The head ended the run; the agents heard the stop and ended by themselves.
        for line in (
            "[launcher] node1 head exited (code 0)",
            "[launcher] node1 host exited (code 0)",
            "[launcher] node2 host exited (code 0)",
        ):
            assert line in text, text[-3000:]
        assert "killing what is left" not in text
        wait_for(
            lambda: not _in_namespaces(hosts, netns_sshd.sshd_pids),
            timeout=10,
            message="processes of the launch are left in the namespaces",
        )
    finally:
        kill_pids([launcher.pid])
        kill_pids(_in_namespaces(hosts, netns_sshd.sshd_pids))
