"""``zrl host``, the per-host agent: role specs, its children's states and reports (unit), and
real agents against a real broker: a killed role restarts with its id, a role that keeps
crashing is given up with its last lines shown, the broker's stop ends the agent cleanly, and
a vanished broker ends it with an error. No process is left behind (checked by PID)."""

from __future__ import annotations

import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq
from typer.testing import CliRunner

from zrl import __version__
from zrl.broker.limits import info_fits
from zrl.cli.common import UserError
from zrl.cli.main import app
from zrl.roles.base import MAX_ROLE_INDEX, PARENT_REPORT_ENV, Role, write_parent_report
from zrl.roles.errors import RoleError
from zrl.roles.registry_client import read_status, registry_request
from zrl.run import host_agent
from zrl.run.children import RestartPolicy
from zrl.run.host_agent import (
    CHILD_BEAT_SLACK_BYTES,
    HostAgent,
    HostChild,
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
from zrl.transport.sockets import make_socket

CONFIG = "configs/cartpole_apex_dqn.yaml"
CRASHING_ENV = "tests.run.test_host_agent:make_env_crashing_in_actors"


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


class Launched:
    """The agent's real ``spawn`` with ``launch`` replaced: each life a ``FakeProc`` (pids
    from 1000 on), its command line and environment kept."""

    def __init__(self) -> None:
        self.pids = iter(range(1000, 2000))
        self.argvs: list[list[str]] = []
        self.envs: list[dict[str, str]] = []

    def __call__(
        self, argv: list[str], log_path: Path, zygote: Any = None, env: dict[str, str] | None = None
    ) -> FakeProc:
        self.argvs.append(argv)
        self.envs.append(dict(env or {}))
        return FakeProc(next(self.pids))


def make_agent(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *tokens: str,
    budget: int = 2,
    broker: str = "tcp://127.0.0.1:1",
    **options: Any,
) -> tuple[HostAgent, Launched]:
    agent = HostAgent(
        broker,
        parse_role_specs(list(tokens)),
        log_dir=tmp_path,
        role_args=[],
        restart=RestartPolicy((0.0,), budget),
        **options,
    )
    launched = Launched()
    monkeypatch.setattr(host_agent, "launch", launched)
    agent.open_reports()
    for child in agent.children:
        agent.spawn(child)
    return agent, launched


def child_says(child: HostChild, rid: str, state: str, pid: int | None = None) -> None:
    """What the child's ``Role`` writes to the file its agent named (PARENT_REPORT_ENV)."""
    assert child.proc is not None and child.report_path is not None
    write_parent_report(child.report_path, rid, child.proc.pid if pid is None else pid, state)


def test_agent_learns_ids_from_its_children_restarts_crashes_and_gives_up(tmp_path, monkeypatch):
    agent, launched = make_agent(tmp_path, monkeypatch, "actor=1", "replay=1@0", "params")
    actor, replay, params = agent.children
    # Each life is told where to report, in a directory of the agent's own.
    assert (
        agent.reports_dir is not None and oct(agent.reports_dir.stat().st_mode & 0o777) == "0o700"
    )
    assert [e[PARENT_REPORT_ENV] for e in launched.envs] == [
        str(c.report_path) for c in agent.children
    ]
    child_says(actor, "actor-7", "running")
    child_says(replay, "replay-0", "starting")
    child_says(params, "params-3", "running", pid=4242)  # not the pid we started: not ours
    agent.read_reports()
    assert (actor.name, actor.index, replay.name, params.name) == (
        "actor-7",
        7,
        "replay-0",
        "params.0",
    )
    agent._tend(0.0)
    assert actor.came_up and not replay.came_up

    actor.proc.code = -signal.SIGKILL  # type: ignore[union-attr]
    replay.proc.code = 0  # type: ignore[union-attr]
    agent._tend(1.0)
    assert (actor.state, replay.state, params.state) == ("restarting", "ended", "running")
    agent._tend(2.0)  # the back-off is over: a new life, same id
    assert (actor.state, actor.restarts, actor.proc.pid) == ("running", 1, 1003)  # type: ignore[union-attr]
    assert launched.argvs[-1][:5] == ["start", "actor", "--broker", "tcp://127.0.0.1:1", "--index"]
    assert launched.argvs[-1][5] == "7"
    assert not actor.report_path.exists()  # type: ignore[union-attr]  # the last life's report
    for life in range(2):
        actor.proc.code = 1  # type: ignore[union-attr]
        agent._tend(3.0 + life)
        agent._tend(3.5 + life)
    assert actor.state == "given up" and actor.restarts == 2
    assert actor.report(tail=False) == {
        "id": "actor-7",
        "pid": 1004,
        "state": "given up",
        "restarts": 2,
        "log": str(tmp_path / "actor.0.log"),
        "exit_code": 1,
    }
    assert agent.given_up == [actor]
    params.proc.code = 0  # type: ignore[union-attr]
    agent._tend(10.0)
    assert not all(c.ended for c in agent.children)  # a given-up role is still reported
    reports = agent.reports_dir
    agent.teardown()
    assert not reports.exists()


@pytest.mark.parametrize(
    "rid", ["actor-" + "9" * 50, "actor-07", "actor--1", "replay-0", "actor-x"]
)
def test_a_child_report_with_a_bad_id_teaches_the_agent_nothing(tmp_path, monkeypatch, rid):
    agent, _ = make_agent(tmp_path, monkeypatch, "actor=1")
    (actor,) = agent.children
    child_says(actor, rid, "running")
    agent.read_reports()
    assert (actor.index, actor.running) == (None, False)
    for junk in (b"{" * 100_000, b"[" * 100_000, b"\xff" * 10, b'{"id": "actor-1", "pid": 1000}'):
        actor.report_path.write_bytes(junk)  # type: ignore[union-attr]
        agent.read_reports()
        assert (actor.index, actor.running) == (None, False)


def test_a_role_index_is_bounded_so_a_role_never_dies_encoding_its_hello(zmq_ctx):
    """Issue 27, observation 7: an index of 50 digits made the child crash encoding its own
    HELLO. A role refuses it when made, naming it; every index it accepts encodes."""
    for bad in (10**50, -1, MAX_ROLE_INDEX + 1):
        with pytest.raises(RoleError, match=f"bad role index {bad}"):
            Role("tcp://127.0.0.1:1", index=bad, ctx=zmq_ctx)
    with pytest.raises(ValueError, match="role indices go from 0 to"):
        parse_role_specs([f"actor=2@{MAX_ROLE_INDEX}"])
    role = Role("tcp://127.0.0.1:1", index=MAX_ROLE_INDEX, ctx=zmq_ctx, connect_timeout=0.1)
    role._open_registry()
    try:
        role._hello()  # encodes (the broker is not there: nothing is sent)
    finally:
        role.close()


def forge_rows(ctx: zmq.Context, broker: str, host: str, pid: int, *ids: str) -> list[zmq.Socket]:
    """Registry rows naming ``host`` and ``pid`` (a child of the agent) under ``ids``, as
    anyone who reaches the broker can register them, kept alive by heartbeats."""
    socks = []
    for k, rid in enumerate(ids):
        sock = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=2000, sndtimeo_ms=2000)
        sock.connect(broker)
        hello = {
            "role": rid.split("-")[0],
            "id": rid,
            "index": None,
            "host": host,
            "pid": pid,
            "address": "127.0.0.1",
            "rpc": "",
            "instance": f"forged{k}",
            "zrl_version": __version__,
        }
        sock.send_multipart(P.encode(P.Message(P.HELLO, meta=hello)))
        assert P.decode(sock.recv_multipart()).kind == P.WELCOME
        socks.append(sock)
    return socks


def test_forged_status_rows_cannot_make_the_agent_give_up_its_role(zmq_ctx, tmp_path, monkeypatch):
    """Issue 27, observation 7: a STATUS row with this host's name and the child's pid, under
    another id (actor-7, or an index of 50 digits), made the agent restart its actor as that
    id, which the forger held: every restart was refused until the role was given up. The
    agent's real loop (step and tick, registered with a real broker) learns the id from its
    child only, and the restarted child is actor-0 again."""
    from zrl.broker.broker import Broker
    from zrl.config.experiment import ExperimentConfig

    addr = f"inproc://zrl-test-host-agent-{os.getpid()}"
    cfg = ExperimentConfig.model_validate(
        {"name": "forged-rows", "broker": {"heartbeat_interval": 0.1, "heartbeat_timeout": 30}}
    )
    broker = Broker(addr, cfg, ctx=zmq_ctx)
    thread = threading.Thread(target=broker.run, name="test-broker", daemon=True)
    thread.start()
    forgers: list[zmq.Socket] = []
    agent, launched = make_agent(
        tmp_path, monkeypatch, "actor=1", broker=addr, ctx=zmq_ctx, connect_timeout=10
    )
    try:
        agent.connect()
        (actor,) = agent.children
        assert actor.proc is not None
        forgers = forge_rows(
            zmq_ctx, addr, agent.host, actor.proc.pid, "actor-7", "actor-" + "9" * 50
        )

        def loop(until: Any) -> Any:
            def once() -> Any:
                agent.step()
                agent.tick()
                return until()

            return wait_for(once, timeout=30)

        # The forged rows are there for anyone who reads STATUS.
        rows = registry_request(zmq_ctx, addr, P.Message(P.STATUS), 5.0).meta["roles"]
        assert {"actor-7", "actor-" + "9" * 50} <= {r["id"] for r in rows}
        for _ in range(5):  # the agent's own loop, while the child has not said anything
            agent.step()
            agent.tick()
        assert actor.index is None
        child_says(actor, "actor-0", "running")  # what the broker told the real child
        loop(lambda: actor.came_up)
        assert actor.name == "actor-0"
        actor.proc.code = 1  # type: ignore[union-attr]  # one crash
        loop(lambda: actor.restarts == 1 and actor.state == "running")
        assert launched.argvs[-1][-2:] == ["--index", "0"]
        child_says(actor, "actor-0", "running")
        loop(lambda: actor.came_up)
        assert (actor.name, actor.given_up, actor.restarts) == ("actor-0", False, 1)
    finally:
        for sock in forgers:
            sock.close(linger=0)
        agent.close()
        broker.stop()
        thread.join(10)


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
        return {
            "id": rid,
            "role": "host",
            "state": state,
            "age": age,
            "info": {"children": [{"id": "actor-0"}, child]},
        }

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
        "start",
        "broker",
        "--bind",
        addr,
        "--config",
        CONFIG,
        "--log-level",
        "WARNING",
        "--set",
        "broker.heartbeat_timeout=1.0",
        *args,
        log_name="broker",
        env={"ZRL_STOP_TOKEN": token} if token else None,
    )

    def answers() -> bool:
        try:
            registry_request(ctx, addr, P.Message(P.STATUS), 0.5)
        except RoleError:
            return False
        return True

    wait_for(lambda: proc.poll() is not None or answers(), timeout=30)
    assert proc.poll() is None, f"the broker exited with {proc.returncode}"
    return proc


def status_row(ctx: zmq.Context, addr: str, rid: str) -> dict[str, Any]:
    """One role's whole STATUS row (its stream counters, all of them)."""
    (row,) = read_status(ctx, addr, 5.0, role_id=rid)["roles"]
    return row


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
    agent = spawn(
        "host",
        "--broker",
        broker_addr,
        "params=1",
        "replay=1@0",
        "--log-dir",
        str(log_dir),
        # The name the other hosts reach this one by: the agent and its roles advertise it.
        "--advertise",
        "localhost",
        log_name="agent",
    )
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
        assert {rows[r]["address"] for r in ("host-0", "params-0", "replay-0")} == {"localhost"}
        # The agent heartbeats for its roles: they send theirs to it, not to the broker.
        assert {rows[r]["agent"] for r in ("host-0", "params-0", "replay-0")} == {"", "host-0"}

        def through_agent(rid: str, stream: str, counter: str) -> bool:
            return status_row(zmq_ctx, broker_addr, rid)["streams"][stream][counter] > 0

        for r in ("params-0", "replay-0"):
            wait_for(lambda r=r: through_agent(r, "agent", "sent"), timeout=30)
        wait_for(lambda: through_agent("host-0", "children", "received"), timeout=30)
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
            "params.0.log",
            "replay-0.log",
            "zygote.log",
        ]
    finally:
        kill_pids([agent.pid, *(p.pid for p in children)])


def test_agent_gives_up_a_role_that_keeps_crashing_and_stops_when_the_broker_is_gone(
    spawn, zmq_ctx, broker_addr, tmp_path
):
    """The back-off and budget are shortened by ``zrl host``'s hidden test options (the real
    back-off sums to 30 s)."""
    broker = start_broker(
        spawn, zmq_ctx, broker_addr, "--env-factory", CRASHING_ENV, "--no-preflight"
    )
    agent = spawn(
        "host",
        "--broker",
        broker_addr,
        "actor=1@0",
        "replay=1@0",
        "--env-factory",
        CRASHING_ENV,
        "--log-dir",
        str(tmp_path / "logs"),
        "--orphan-timeout",
        "4",
        "--restart-backoff",
        "0.1",
        "--restart-budget",
        "2",
        log_name="agent",
    )
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
        assert any("no such simulator: host-agent-crash" in line for line in report["tail"])
        rows = status_rows(zmq_ctx, broker_addr)
        assert agent_report(rows, "replay-0")["state"] == "running"

        broker.kill()  # the experiment is gone: the agent stops the replay shard and exits
        broker.wait(timeout=10)
        assert agent.wait(timeout=30) != 0
        agent_log = (tmp_path / "agent-1.log").read_text()
        assert "(--orphan-timeout): stopped the roles of this host" in agent_log
        assert_all_gone(children, broker_addr, broker.pid)
    finally:
        kill_pids([agent.pid, *(p.pid for p in children)])


@pytest.mark.slow
@pytest.mark.waits  # no learning target
def test_an_agent_with_keys_runs_its_roles_on_a_keyed_broker(spawn, zmq_ctx, broker_addr, tmp_path):
    """``zrl host --keys`` end to end: the agent and the roles it starts (which get the keys
    from it) register with a CurveZMQ broker; an agent without the keys never does."""
    from zrl.transport.security import init_keys, load_keys

    keydir = init_keys(tmp_path / "keys")
    keys = load_keys(keydir)
    start_broker_keyed = spawn(
        "start",
        "broker",
        "--bind",
        broker_addr,
        "--config",
        CONFIG,
        "--keys",
        str(keydir),
        "--log-level",
        "WARNING",
        log_name="broker",
    )

    def rows() -> dict[str, dict[str, Any]]:
        try:
            reply = registry_request(zmq_ctx, broker_addr, P.Message(P.STATUS), 0.5, keys)
        except RoleError:
            return {}
        return {r["id"]: r for r in reply.meta.get("roles", [])}

    def answers() -> bool:
        try:
            registry_request(zmq_ctx, broker_addr, P.Message(P.STATUS), 0.5, keys)
        except RoleError:
            return start_broker_keyed.poll() is not None
        return True

    # A process start at load 20 on 2 cores took over 30 s (imports, then the keys).
    wait_for(answers, timeout=120, message="the keyed broker's STATUS answer, within 120 s")
    assert start_broker_keyed.poll() is None, "the keyed broker exited"
    outsider = spawn(
        "host",
        "--broker",
        broker_addr,
        "--connect-timeout",
        "3",
        "params=1",
        "--log-dir",
        str(tmp_path / "outsider-logs"),
        log_name="outsider",
    )
    agent = spawn(
        "host",
        "--broker",
        broker_addr,
        "--keys",
        str(keydir),
        "params=1",
        "--log-dir",
        str(tmp_path / "logs"),
        log_name="agent",
    )
    try:

        def up() -> bool:
            assert agent.poll() is None, f"the agent exited with {agent.returncode}"
            state = rows()
            return state.get("params-0", {}).get("state") == "alive" and "host-0" in state

        wait_for(up, timeout=60)
        state = rows()
        assert state["host-0"]["pid"] == agent.pid
        assert state["params-0"]["pid"] in {p.pid for p in descendants(agent.pid)}
        # The outsider's handshake fails: it gives up connecting, and nothing of it registers.
        assert outsider.wait(timeout=60) != 0
        assert {r["pid"] for r in rows().values()} & {outsider.pid} == set()
        assert len([r for r in rows().values() if r["role"] == "host"]) == 1
    finally:
        kill_pids([agent.pid, outsider.pid, start_broker_keyed.pid])


def test_the_agents_report_carries_fresh_children_and_their_figures_once_a_second(
    tmp_path, monkeypatch
):
    agent, _ = make_agent(tmp_path, monkeypatch, "actor=3@0")
    agent.heartbeat_interval = 0.5
    figures = {"stats": {"experience": {"sent": 4}}, "info": {"env_steps": 9}}
    for i, when in enumerate((10.0, 10.0, 8.9)):  # actor-2 is silent past FRESH_INTERVALS
        agent.beats[f"actor-{i}"] = (when, {"id": f"actor-{i}", **figures})
    assert agent.role_reports(10.0) == [
        {"id": "actor-0", **figures},
        {"id": "actor-1", **figures},
    ]
    assert "actor-2" not in agent.beats
    # Liveness with every report, the figures at most once per FIGURES_INTERVAL_S.
    assert agent.role_reports(10.5) == [{"id": "actor-0"}, {"id": "actor-1"}]
    assert agent.role_reports(11.0) == [{"id": "actor-0", **figures}, {"id": "actor-1", **figures}]
    # Past the bytes a report may take (here the broker's message limit): ids alone.
    agent.max_message_bytes = agent.config.broker.max_info_bytes + CHILD_BEAT_SLACK_BYTES + 60
    for i in range(2):
        agent.beats[f"actor-{i}"] = (12.0, {"id": f"actor-{i}", **figures})
    assert agent.role_reports(12.0) == [{"id": "actor-0", **figures}, {"id": "actor-1"}]


def test_the_agent_answers_its_childrens_heartbeats_and_drops_anything_else(
    tmp_path, monkeypatch, zmq_ctx
):
    agent, _ = make_agent(tmp_path, monkeypatch, "actor=1")
    agent.id = "host-0"
    agent.open_heartbeats()
    (actor,) = agent.children
    child = make_socket(zmq_ctx, zmq.DEALER, rcvtimeo_ms=5000)
    child.connect(agent.endpoint)
    children = agent.stats.stream("children")

    def beat(rid: str, kind: str = P.HEARTBEAT, **more: object) -> P.Message | None:
        meta = {"id": rid, "info": {"n": 1}, **more}
        child.send_multipart(P.encode(P.Message(kind, meta=meta)))
        seen = children.received + children.dropped
        wait_for(
            lambda: agent.serve_children(50) or children.received + children.dropped > seen,
            timeout=30,
        )
        return P.decode(child.recv_multipart()) if child.poll(200) else None

    try:
        # Before the child said who it is, and for ids it never was: dropped and counted.
        assert beat("actor-0") is None and "actor-0" not in agent.beats
        child_says(actor, "actor-0", "running")
        assert beat("actor-0").kind == P.HEARTBEAT_ACK  # type: ignore[union-attr]
        assert agent.beats["actor-0"][1] == {"id": "actor-0", "stats": None, "info": {"n": 1}}
        assert beat("learner-0") is None and beat("actor-0", P.BYE) is None
        assert children.dropped == 3
        # Not acknowledged while the broker does not answer us.
        agent._last_ack -= 10 * agent.heartbeat_timeout
        assert beat("actor-0") is None
        agent._last_ack = time.monotonic()
        # What the broker said: which children to tell to say HELLO again, and the stop.
        agent.on_heartbeat_ack({"unknown": ["actor-0", "params-3"], "stop": "done"})
        assert agent.unknown == {"actor-0"}
        assert beat("actor-0").kind == P.UNKNOWN_ROLE  # type: ignore[union-attr]
        assert beat("actor-0").meta == {"stop": "done"}  # type: ignore[union-attr]
        # The child's seq comes back (a positive int only), as the broker's acks do.
        assert beat("actor-0", seq=5).meta == {"stop": "done", "seq": 5}  # type: ignore[union-attr]
        assert beat("actor-0", seq="5").meta == {"stop": "done"}  # type: ignore[union-attr]
    finally:
        child.close(linger=0)
        agent.close()
        agent.teardown()


def test_a_childs_state_and_loop_go_with_every_report_and_its_threads_beats_keep_figures(
    tmp_path, monkeypatch, zmq_ctx
):
    """A child's heartbeat thread (its loop held) sends ``id``, ``seq``, ``state`` and
    ``loop`` alone: the agent keeps the child's last figures, and every report carries the
    state (still setting up?) and loop turns (stalled?), with or without the figures."""
    agent, _ = make_agent(tmp_path, monkeypatch, "actor=1")
    agent.id = "host-0"
    agent.heartbeat_interval = 5.0  # the child's beats stay fresh however slow the test runs
    agent.open_heartbeats()
    (actor,) = agent.children
    child = make_socket(zmq_ctx, zmq.DEALER, rcvtimeo_ms=5000)
    child.connect(agent.endpoint)
    children = agent.stats.stream("children")
    child_says(actor, "actor-0", "running")

    def beat(**meta: object) -> dict[str, Any]:
        child.send_multipart(P.encode(P.Message(P.HEARTBEAT, meta={"id": "actor-0", **meta})))
        seen = children.received
        wait_for(lambda: agent.serve_children(50) or children.received > seen, timeout=30)
        assert child.poll(5000) and P.decode(child.recv_multipart()).kind == P.HEARTBEAT_ACK
        return agent.beats["actor-0"][1]

    try:
        figures = {"stats": {"experience": {"sent": 4}}, "info": {"env_steps": 9}}
        assert beat(seq=1, state="running", loop=5, **figures) == {
            "id": "actor-0",
            "state": "running",
            "loop": 5,
            **figures,
        }
        kept = beat(seq=2, state="running", loop=5)  # the thread's: the figures stay
        assert kept == {"id": "actor-0", "state": "running", "loop": 5, **figures}
        now = time.monotonic()
        assert agent.role_reports(now) == [kept]
        alone = {"id": "actor-0", "state": "running", "loop": 5}
        assert agent.role_reports(now + 0.1) == [alone]  # figures once a second; liveness always
        assert agent.role_reports(now + 1.0) == [kept]  # a report without them is no figures sent
        # What is no state or loop count is not passed on.
        assert beat(seq=3, state="x" * 100, loop="6") == {"id": "actor-0", **figures}
    finally:
        child.close(linger=0)
        agent.close()
        agent.teardown()


def test_an_agents_role_follows_weights_through_the_agents_relay(
    spawn, zmq_ctx, broker_addr, tmp_path
):
    """Real processes: params and an evaluator under ``zrl host``; the evaluator takes each
    version the params server publishes from the agent's relay (which subscribed for it and
    counts what it relayed in the agent's heartbeat info)."""
    from zrl.config.experiment import load_config
    from zrl.testing.fakes import Rpc, model_weights

    broker = start_broker(spawn, zmq_ctx, broker_addr)
    agent = spawn(
        "host",
        "--broker",
        broker_addr,
        "params=1@0",
        "evaluator=1@0",
        "--log-dir",
        str(tmp_path / "logs"),
        log_name="agent",
    )
    children: list[psutil.Process] = []
    rpc: Rpc | None = None
    try:

        def up() -> dict[str, dict[str, Any]] | None:
            assert agent.poll() is None, f"the agent exited with {agent.returncode}"
            rows = status_rows(zmq_ctx, broker_addr)
            alive = all(rows.get(r, {}).get("state") == "alive" for r in ("params-0", "host-0"))
            relay = rows.get("host-0", {}).get("info", {}).get("weights_relay", {})
            # The evaluator's follower subscribed at the relay, which subscribed upstream.
            return rows if alive and relay.get("topics") == 1 else None

        wait_for(up, timeout=120)
        children = descendants(agent.pid)
        (params,) = registry_request(
            zmq_ctx, broker_addr, P.Message(P.LOOKUP, meta={"role": "params"}), 5.0
        ).meta["services"]
        rpc = Rpc(zmq_ctx, params["rpc"], broker=broker_addr)
        cfg = load_config(CONFIG)
        pushed = [0]

        def followed() -> bool:
            pushed[0] += 1  # a new version each time, until the evaluator has taken some
            rpc.request(P.Message(P.WEIGHTS, arrays=model_weights(cfg, pushed[0])))
            rows = status_rows(zmq_ctx, broker_addr)
            relay = rows.get("host-0", {}).get("info", {}).get("weights_relay", {})
            version = rows.get("evaluator-0", {}).get("info", {}).get("weights_version", 0)
            return relay.get("relayed", 0) >= 2 and version >= 2

        wait_for(followed, timeout=120, interval=0.5)
        relay = status_rows(zmq_ctx, broker_addr)["host-0"]["info"]["weights_relay"]
        assert relay["dropped"] == 0 and relay["received"] <= pushed[0]
    finally:
        if rpc is not None:
            rpc.close()
        kill_pids([agent.pid, *(p.pid for p in children), broker.pid])
