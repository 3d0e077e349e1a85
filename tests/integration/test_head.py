"""The head owns the run across hosts: ``zrl run`` with a ``hosts:`` section, its printed
``zrl host`` line (with the run's own keys, the default) pasted into another network
namespace, a remote role killed with -9 and brought back by the host agent at once (its
restart proves the id with the run's secret), the target reached, every role in the summary
and nothing left running anywhere afterwards.

The hosts are network namespaces (:class:`tests.integration.netns.Hosts`). h0 has no default
route, only its 10.213.N.1 address: the printed command must name that address, which is
what other hosts reach, and never the machine's hostname.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.integration.netns import REPO, Hosts
from zrl.testing.probes import wait_for

pytestmark = [pytest.mark.netns, pytest.mark.slow]

CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
TARGET = 60.0
"""A random policy scores about 22 (the mean of an evaluation's 20 episodes: 22 +- 3): 60 is
learning, across hosts, which is what this test checks; not how fast."""


def status_rows(hosts: Hosts, broker: str, keys: Path) -> dict[str, dict[str, Any]]:
    done = hosts.run(
        0,
        sys.executable,
        "-m",
        "zrl",
        "status",
        "--broker",
        broker,
        "--json",
        "--timeout",
        "3",
        "--keys",
        str(keys),
    )
    if done.returncode != 0:
        return {}
    return {r["id"]: r for r in json.loads(done.stdout)["roles"]}


def processes_of(broker: str) -> list[psutil.Process]:
    """Live zrl processes whose command line names this broker."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any(broker in part for part in cmd) and p.pid != os.getpid():
            found.append(p)
    return found


@pytest.mark.waits  # a multi-host launch: mostly waiting on hosts; a low CartPole target
@pytest.mark.timeout(300)
def test_zrl_run_with_a_remote_host_reaches_its_target_and_leaves_nothing_running(
    make_hosts: Callable[[int], Hosts], tmp_path: Path
) -> None:
    hosts = make_hosts(2)
    cfg = yaml.safe_load(CONFIG.read_text())
    # The only actor is remote: while it is dead no data arrives and the rate limiter holds
    # the learner, so the target cannot be reached before the restart registers.
    cfg["roles"]["actors"] = 1
    cfg["hosts"] = [{"name": "h1", "roles": {"actors": 1}}]
    config = tmp_path / "two_hosts.yaml"
    config.write_text(yaml.safe_dump(cfg))
    run_dir = tmp_path / "run"
    head = hosts.zrl(
        0,
        "run",
        str(config),
        "--run-dir",
        str(run_dir),
        "--set",
        "broker.host=0.0.0.0",
        "--set",
        f"stop.eval_return={TARGET}",
        "--set",
        "stop.eval_window=1",
        "--set",
        "stop.wall_time=200",
        log=tmp_path / "head.out",
    )
    commands = run_dir / "remote_commands.txt"
    wait_for(commands.exists, timeout=60, message="zrl run printed no remote commands")
    lines = commands.read_text().splitlines()
    line = lines[lines.index("# on h1:") + 1]
    broker = f"tcp://{hosts.addrs[0]}:"
    assert line.startswith(f"zrl host --broker {broker}"), line
    broker = shlex.split(line)[3]
    argv = shlex.split(line)
    agent = hosts.exec(
        1,
        sys.executable,
        "-m",
        "zrl",
        *argv[1:],
        "--log-dir",
        str(tmp_path / "h1-logs"),
        log=tmp_path / "agent.out",
    )

    remote = "actor-0"
    # Killed as soon as it registers, before it has collected much: with no other actor the
    # learner has no data until the restart, so the target comes after it (on a loaded
    # machine, waiting for "alive" once let training reach the target before the kill).
    wait_for(
        lambda: status_rows(hosts, broker, run_dir / "keys").get(remote, {}).get("pid"),
        timeout=120,
        message=f"{remote} never came up on h1",
    )
    first_pid = status_rows(hosts, broker, run_dir / "keys")[remote]["pid"]
    assert hosts.netns_of(first_pid) == hosts.names[1]
    os.kill(first_pid, signal.SIGKILL)

    def back() -> bool:
        # The run may reach its target moments after the restart registers, before a status
        # probe sees it alive: then the summary's restart count below is the evidence.
        if head.poll() is not None:
            return True
        row = status_rows(hosts, broker, run_dir / "keys").get(remote, {})
        return row.get("state") == "alive" and row.get("pid") != first_pid

    wait_for(back, timeout=90, message="the host agent did not bring the actor back")
    try:
        head.wait(timeout=200)
    except Exception:
        pytest.fail((tmp_path / "head.out").read_text()[-3000:])
    out = (tmp_path / "head.out").read_text()
    assert head.returncode == 0, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reached_target"], (summary, out[-3000:])
    roles = summary["roles"]
    assert roles["never_came"] == []
    assert roles["took_part"][remote]["placed"] == "h1"
    assert summary["restarts"].get(remote, 0) >= 1, summary["restarts"]
    assert {rid for rid, r in roles["took_part"].items() if r["placed"] != "unplanned"} == {
        "params-0",
        "replay-0",
        "learner-0",
        "evaluator-0",
        "actor-0",
    }
    # The stop reached h1: the agent and its roles ended by themselves, cleanly.
    assert agent.wait(timeout=60) == 0, (tmp_path / "agent.out").read_text()[-3000:]
    time.sleep(0.5)
    assert processes_of(broker) == []
