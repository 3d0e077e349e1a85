"""``zrl host``, the per-host agent: role specs, its children's states and reports (unit), and
real agents against a real broker: a killed role restarts with its id, a role that keeps
crashing is given up with its last lines shown, the broker's stop ends the agent cleanly, and
a vanished broker ends it with an error. No process is left behind (checked by PID)."""

from __future__ import annotations

import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq
from typer.testing import CliRunner

from zrl.broker.limits import info_fits
from zrl.cli import app
from zrl.cli_common import UserError
from zrl.roles.base import RoleError, registry_request
from zrl.run.children import RestartPolicy
from zrl.run.host_agent import (
    HostAgent,
    RoleSpec,
    default_log_dir,
    find_child_report,
    fit_info,
    parse_role_specs,
    plan_children,
)
from zrl.testing.probes import wait_for
from zrl.testing.processes import kill_pids, status_rows, zrl_processes
from zrl.transport import protocol as P

CONFIG = "configs/cartpole_apex_dqn.yaml"
CRASHING_ENV = "tests.test_host_agent:make_env_crashing_in_actors"


def make_env_crashing_in_actors() -> Any:
    """An env factory that fails in actor processes only, at their setup."""
    import gymnasium as gym

    if sys.argv[1:3] == ["start", "actor"]:
        raise RuntimeError("no such simulator: host-agent-crash")
    return gym.make("CartPole-v1")


# --- role specs -------------------------------------------------------------------------------


def test_role_specs():
    assert parse_role_specs(["actor=4", "replay=1@0", "params", "learners=2@1", "actors=1"]) == [
        RoleSpec("actor", 4),
        RoleSpec("replay", 1, 0),
        RoleSpec("params", 1),
        RoleSpec("learner", 2, 1),
        RoleSpec("actor", 1),
    ]


@pytest.mark.parametrize(
    ("tokens", "named"),
    [
        (["actor=4", "robot=1"], "'robot=1'"),
        (["actor=x"], "'actor=x'"),
        (["actor=0"], "'actor=0'"),
        (["actor=2@"], "'actor=2@'"),
        (["actor:2"], "'actor:2'"),
        (["actor=2@0", "actor=2@1"], "'actor=2@1': actor-1 is given twice"),
        ([], "give the roles"),
    ],
)
def test_bad_role_specs_name_the_token(tokens, named):
    with pytest.raises(ValueError) as err:
        parse_role_specs(tokens)
    assert named in str(err.value)
    assert str(err.value).startswith("bad role spec" if tokens else "give")


def test_children_planned_from_specs(tmp_path):
    children = plan_children(parse_role_specs(["actor=2", "replay=1@3", "actor"]), tmp_path)
    assert [c.name for c in children] == ["actor.0", "actor.1", "replay-3", "actor.2"]
    assert [c.index for c in children] == [None, None, 3, None]
    assert children[2].log_path == tmp_path / "replay-3.log"
    assert children[0].log_path == tmp_path / "actor.0.log"


def test_default_log_dir():
    assert default_log_dir("tcp://10.0.0.1:5555") == Path("zrl-logs/10.0.0.1-5555")
    assert default_log_dir("ipc:///tmp/b") == Path("zrl-logs/tmp_b")


# --- children's states, ids and reports (no processes) ------------------------------------------


class FakeProc:
    """A child process that has exited with ``code`` (None: still running)."""

    def __init__(self, pid: int, code: int | None = None) -> None:
        self.pid, self.code = pid, code

    def poll(self) -> int | None:
        return self.code

    def wait(self, timeout: float | None = None) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.code = 0

    def kill(self) -> None:
        self.code = -signal.SIGKILL


def make_agent(tmp_path: Path, *tokens: str, budget: int = 2) -> HostAgent:
    agent = HostAgent(
        "tcp://127.0.0.1:1",
        parse_role_specs(list(tokens)),
        log_dir=tmp_path,
        role_args=[],
        restart=RestartPolicy((0.0,), budget),
    )
    pids = iter(range(1000, 2000))

    def spawn(child: Any) -> None:
        child.proc = FakeProc(next(pids))

    agent.spawn = spawn  # type: ignore[method-assign]
    for child in agent.children:
        spawn(child)
    return agent


def test_agent_learns_ids_restarts_crashes_and_gives_up(tmp_path):
    agent = make_agent(tmp_path, "actor=1", "replay=1@0", "params")
    actor, replay, params = agent.children
    rows = [
        {"id": "actor-7", "role": "actor", "host": agent.host, "pid": 1000, "state": "alive"},
        {"id": "replay-0", "role": "replay", "host": agent.host, "pid": 1001, "state": "starting"},
        # Same pid on another host: not ours.
        {"id": "params-3", "role": "params", "host": "elsewhere", "pid": 1002, "state": "alive"},
    ]
    agent._learn_ids(rows)
    assert (actor.name, actor.index, replay.name, params.name) == (
        "actor-7", 7, "replay-0", "params.0"
    )  # fmt: skip
    agent._tend(0.0)
    assert actor.came_up and not replay.came_up

    actor.proc.code = -signal.SIGKILL  # type: ignore[union-attr]
    replay.proc.code = 0  # type: ignore[union-attr]
    agent._tend(1.0)
    assert (actor.state, replay.state, params.state) == ("restarting", "ended", "running")
    agent._tend(2.0)  # the back-off is over: a new life, same id
    assert (actor.state, actor.restarts, actor.proc.pid) == ("running", 1, 1003)  # type: ignore[union-attr]
    for life in range(2):
        actor.proc.code = 1  # type: ignore[union-attr]
        agent._tend(3.0 + life)
        agent._tend(3.5 + life)
    assert actor.state == "given up" and actor.restarts == 2
    assert actor.report(tail=False) == {
        "id": "actor-7", "pid": 1004, "state": "given up", "restarts": 2,
        "log": str(tmp_path / "actor.0.log"), "exit_code": 1,
    }  # fmt: skip
    assert agent.given_up == [actor]
    params.proc.code = 0  # type: ignore[union-attr]
    agent._tend(10.0)
    assert not all(c.ended for c in agent.children)  # a given-up role is still reported


def test_heartbeat_info_drops_tails_then_children_to_fit(tmp_path):
    children = plan_children(parse_role_specs(["actor=12@0"]), tmp_path)
    for c in children:
        c.proc = FakeProc(100 + (c.index or 0))  # type: ignore[assignment]
        c.log_path.write_text("".join(f"line {i} " + "x" * 300 + "\n" for i in range(10)))
    roomy = fit_info({"log_dir": "d"}, children[:2], 8192)
    assert [len(r["tail"]) for r in roomy["children"]] == [3, 3]
    assert all(len(line) == 160 for line in roomy["children"][0]["tail"])
    assert "children_omitted" not in roomy

    tight = fit_info({"log_dir": "d"}, children, 3000)
    with_tail = [r for r in tight["children"] if "tail" in r]
    assert len(tight["children"]) == 12 and 0 < len(with_tail) < 12
    assert [r["id"] for r in with_tail] == [f"actor-{i}" for i in range(len(with_tail))]
    assert info_fits({**tight, "rss_mb": 123.4}, 3000)

    tiny = fit_info({"log_dir": "d"}, children, 600)
    assert not any("tail" in r for r in tiny["children"])
    assert tiny["children_omitted"] == 12 - len(tiny["children"]) > 0
    assert info_fits({**tiny, "rss_mb": 123.4}, 600)


def test_find_child_report():
    def agent_row(rid: str, state: str, age: float, log: str) -> dict[str, Any]:
        child = {"id": "actor-1", "state": "running", "log": log}
        return {"id": rid, "role": "host", "state": state, "age": age,
                "info": {"children": [{"id": "actor-0"}, child]}}  # fmt: skip

    rows = [
        agent_row("host-0", "stopped", 0.1, "/old/actor-1.log"),
        agent_row("host-1", "alive", 0.4, "/new/actor-1.log"),
        {"id": "actor-1", "role": "actor", "state": "alive", "info": {"children": "junk"}},
    ]
    found = find_child_report(rows, "actor-1")
    assert (
        found is not None and found[0]["id"] == "host-1" and found[1]["log"] == "/new/actor-1.log"
    )
    assert find_child_report(rows, "actor-9") is None


# --- real agents --------------------------------------------------------------------------------


def start_broker(spawn, ctx: zmq.Context, addr: str, *args: str, token: str = "") -> Any:
    proc = spawn(
        "start", "broker", "--bind", addr, "--config", CONFIG, "--log-level", "WARNING",
        "--set", "broker.heartbeat_timeout=1.0", *args,
        log_name="broker", env={"ZRL_STOP_TOKEN": token} if token else None,
    )  # fmt: skip

    def answers() -> bool:
        try:
            registry_request(ctx, addr, P.Message(P.STATUS), 0.5)
        except RoleError:
            return False
        return True

    wait_for(lambda: proc.poll() is not None or answers(), timeout=30)
    assert proc.poll() is None, f"the broker exited with {proc.returncode}"
    return proc


def agent_report(rows: dict[str, dict[str, Any]], rid: str) -> dict[str, Any]:
    """The host agent's report of ``rid`` ({} while there is none)."""
    found = find_child_report(list(rows.values()), rid)
    return found[1] if found is not None else {}


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def assert_all_gone(procs: list[psutil.Process], marker: str, broker_pid: int) -> None:
    left = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    left += [p for p in zrl_processes(marker) if p.pid != broker_pid]
    assert not left, [p.cmdline() for p in left]


def test_agent_restarts_a_killed_role_with_its_id_and_stops_with_the_experiment(
    spawn, zmq_ctx, broker_addr, tmp_path
):
    token = secrets.token_hex(8)
    broker = start_broker(spawn, zmq_ctx, broker_addr, token=token)
    log_dir = tmp_path / "logs"
    agent = spawn("host", "--broker", broker_addr, "params=1", "replay=1@0",
                  "--log-dir", str(log_dir), log_name="agent")  # fmt: skip
    children: list[psutil.Process] = []
    try:

        def up() -> dict[str, dict[str, Any]] | None:
            assert agent.poll() is None, f"the agent exited with {agent.returncode}"
            rows = status_rows(zmq_ctx, broker_addr)
            alive = all(rows.get(r, {}).get("state") == "alive" for r in ("params-0", "replay-0"))
            # The agent knows params-0 by the id the broker gave it.
            return rows if alive and agent_report(rows, "params-0") else None

        rows = wait_for(up, timeout=60)
        assert isinstance(rows, dict)
        children = descendants(agent.pid)
        victim = rows["params-0"]["pid"]
        assert victim in {p.pid for p in children}
        assert rows["host-0"]["role"] == "host" and rows["host-0"]["pid"] == agent.pid
        os.kill(victim, signal.SIGKILL)

        def restarted() -> dict[str, dict[str, Any]] | None:
            rows = status_rows(zmq_ctx, broker_addr)
            row, report = rows.get("params-0", {}), agent_report(rows, "params-0")
            # The broker's row and the agent's report (its next heartbeat) of the new life.
            again = (row.get("state"), row.get("restarts")) == ("alive", 1)
            return rows if again and report.get("pid") == row["pid"] else None

        rows = wait_for(restarted, timeout=30)
        assert isinstance(rows, dict)
        assert rows["params-0"]["pid"] != victim
        report = agent_report(rows, "params-0")
        assert (report["state"], report["restarts"]) == ("running", 1)
        assert report["log"] == str(log_dir / "params.0.log")
        assert any("registered as params-0" in line for line in report["tail"])
        children = [*children, *descendants(agent.pid)]

        # In this process (a real `zrl status` would add seconds of start-up on a busy CI).
        shown = CliRunner().invoke(app, ["status", "--broker", broker_addr, "--logs", "params-0"])
        assert shown.exit_code == 0, shown.output
        assert f"log: {log_dir / 'params.0.log'}" in shown.output
        assert "registered as params-0" in shown.output
        unknown = CliRunner().invoke(app, ["status", "--broker", broker_addr, "--logs", "actor-9"])
        assert isinstance(unknown.exception, UserError)
        assert "no host agent (zrl host) lists actor-9" in str(unknown.exception)

        stop = P.Message(P.STOP_RUN, meta={"token": token, "reason": "test"})
        assert registry_request(zmq_ctx, broker_addr, stop, 3.0).kind == P.STOP_RUN
        assert agent.wait(timeout=15) == 0
        assert_all_gone(children, broker_addr, broker.pid)
        assert sorted(p.name for p in log_dir.iterdir()) == [
            "params.0.log", "replay-0.log", "zygote.log"
        ]  # fmt: skip
    finally:
        kill_pids([agent.pid, *(p.pid for p in children)])


def test_agent_gives_up_a_role_that_keeps_crashing_and_stops_when_the_broker_is_gone(
    spawn, zmq_ctx, broker_addr, tmp_path
):
    """The back-off and budget are shortened by ``zrl host``'s hidden test options (the real
    back-off sums to 30 s)."""
    broker = start_broker(spawn, zmq_ctx, broker_addr, "--env-factory", CRASHING_ENV,
                          "--no-preflight")  # fmt: skip
    agent = spawn(
        "host", "--broker", broker_addr, "actor=1@0", "replay=1@0",
        "--env-factory", CRASHING_ENV, "--log-dir", str(tmp_path / "logs"),
        "--orphan-timeout", "4", "--restart-backoff", "0.1", "--restart-budget", "2",
        log_name="agent",
    )  # fmt: skip
    children: list[psutil.Process] = []
    try:

        def given_up() -> dict[str, Any] | None:
            assert agent.poll() is None, f"the agent exited with {agent.returncode}"
            rows = status_rows(zmq_ctx, broker_addr)
            children.extend(descendants(agent.pid))
            report = agent_report(rows, "actor-0")
            return report if report.get("state") == "given up" else None

        report = wait_for(given_up, timeout=60)
        assert isinstance(report, dict)
        assert report["restarts"] == 2 and report["exit_code"] not in (0, None)
        assert any("host-agent-crash" in line for line in report["tail"])
        rows = status_rows(zmq_ctx, broker_addr)
        assert agent_report(rows, "replay-0")["state"] == "running"
        agent_log = (tmp_path / "agent-1.log").read_text()
        assert "actor-0 crashed 3 times (last exit code" in agent_log
        assert "no such simulator: host-agent-crash" in agent_log

        broker.kill()  # the experiment is gone: the agent stops the replay shard and exits
        broker.wait(timeout=10)
        assert agent.wait(timeout=30) != 0
        agent_log = (tmp_path / "agent-1.log").read_text()
        assert "(--orphan-timeout): stopped the roles of this host" in agent_log
        assert_all_gone(children, broker_addr, broker.pid)
    finally:
        kill_pids([agent.pid, *(p.pid for p in children)])
