"""Role base class against an in-process Broker: registration, spec, heartbeats, reconnects."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

import zrl.roles.base as base
from zrl import __version__
from zrl.broker.broker import Broker
from zrl.config.experiment import ExperimentConfig
from zrl.roles.base import Role
from zrl.roles.errors import RoleError
from zrl.roles.registry_client import registry_request
from zrl.testing.fakes import welcome_message
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P

_names = itertools.count()


class FakeRole(Role):
    role = "fake"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps = 0
        self.error: BaseException | None = None

    def step(self) -> None:
        self.steps += 1
        self.stop_event.wait(0.02)


def make_config() -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "role-base-test",
            "seed": 17,
            "broker": {"heartbeat_interval": 0.1, "heartbeat_timeout": 0.6, "setup_grace": 5.0},
        }
    )


class Running:
    """Brokers and roles run in threads; everything is stopped and joined at teardown."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.ctx = ctx
        self.brokers: list[tuple[Broker, threading.Thread]] = []
        self.roles: list[tuple[Role, threading.Thread]] = []

    def broker(self, addr: str, cfg: ExperimentConfig | None = None) -> Broker:
        deadline = time.monotonic() + 5
        while True:
            try:
                b = Broker(addr, cfg or make_config(), ctx=self.ctx)
                break
            except OSError:  # the previous broker's inproc names may take a moment to go
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        t = threading.Thread(target=b.run, name="test-broker", daemon=True)
        t.start()
        self.brokers.append((b, t))
        return b

    def stop_broker(self, b: Broker) -> None:
        for broker, t in self.brokers:
            if broker is b:
                broker.stop()
                t.join(5)
                assert not t.is_alive(), "broker did not stop"

    def role(self, addr: str, cls: type[FakeRole] = FakeRole, **kwargs) -> FakeRole:
        r = cls(addr, ctx=self.ctx, **kwargs)

        def run() -> None:
            try:
                r.run()
            except BaseException as exc:  # reported by the test, not lost in the thread
                r.error = exc

        t = threading.Thread(target=run, name="test-role", daemon=True)
        t.start()
        self.roles.append((r, t))
        return r

    def close(self) -> None:
        for r, t in self.roles:
            r.request_stop()
            t.join(5)
        for b, t in self.brokers:
            b.stop()
            t.join(5)


@pytest.fixture
def running(zmq_ctx) -> Iterator[Running]:
    run = Running(zmq_ctx)
    yield run
    run.close()


@pytest.fixture
def inproc_addr() -> str:
    return f"inproc://zrl-role-base-{os.getpid()}-{next(_names)}"


def registered(b: Broker, r: Role, state: str = "alive") -> Callable[[], bool]:
    return lambda: r.id in b.roles and b.roles[r.id].state == state


class LongStepRole(FakeRole):
    """A step of 3 s (a PPO actor's long trajectory) in 0.1-s pieces, heartbeating between
    them with ``heartbeat_if_due``."""

    def step(self) -> None:
        for _ in range(30):
            if self.stop_event.wait(0.1):
                return
            self.heartbeat_if_due()
        self.steps += 1


def liveness_config(**broker: float) -> ExperimentConfig:
    settings = {"heartbeat_interval": 0.1, "heartbeat_timeout": 1.0, "setup_grace": 5.0}
    return ExperimentConfig.model_validate(
        {"name": "role-base-test", "broker": {**settings, **broker}}
    )


def test_a_long_step_that_heartbeats_inside_turns_its_loop_and_is_never_stalled(
    running, inproc_addr
):
    b = running.broker(inproc_addr, liveness_config(stall_after=2.0))
    r = running.role(inproc_addr, LongStepRole, connect_timeout=5)
    wait_for(registered(b, r), timeout=10)
    seen: set[tuple[str, bool]] = set()

    def two_steps() -> bool:
        e = b.roles[r.id]
        seen.add((e.state, e.stalled))
        return r.steps >= 2

    wait_for(two_steps, timeout=30, interval=0.05)
    assert seen == {("alive", False)} and r.error is None
    assert r.registrations == 1  # no re-registration after a missed ack


BLOCK_S = 4.0


class BlockingRole(FakeRole):
    """Once ``block`` is set, one step holds the loop for BLOCK_S (four heartbeat timeouts):
    asleep (``how`` "sleep": the GIL free), or in a busy Python loop ("busy": the GIL taken
    back only at each switch interval)."""

    how = "sleep"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.block = threading.Event()
        self.unblocked = threading.Event()

    def step(self) -> None:
        if self.block.is_set() and not self.unblocked.is_set():
            if self.how == "sleep":
                time.sleep(BLOCK_S)
            else:
                end = time.monotonic() + BLOCK_S
                while time.monotonic() < end:
                    pass
            self.unblocked.set()
        super().step()


@pytest.mark.parametrize("how", ["sleep", "busy", "control"])
def test_a_role_whose_step_blocks_past_the_heartbeat_timeout_stays_alive_shown_stalled(
    running, inproc_addr, monkeypatch, how
):
    """Issue 40: heartbeats from the loop alone made a learner held by a slow update look
    dead. With its heartbeat thread the role stays alive through a step of four heartbeat
    timeouts, and the broker's row (what `zrl status` and the head read) shows it stalled,
    with its id and for how long. The control: the loop's heartbeats alone, it goes dead."""
    if how == "control":
        monkeypatch.setattr(Role, "start_pulse", lambda self: None)
    monkeypatch.setattr(BlockingRole, "how", "sleep" if how == "control" else how)
    b = running.broker(inproc_addr, liveness_config(stall_after=1.5))
    r = running.role(inproc_addr, BlockingRole, connect_timeout=5)
    wait_for(registered(b, r), timeout=10)
    rid = r.id
    wait_for(lambda: b.roles[rid].loop is not None, timeout=10)
    states: list[str] = []
    rows: list[dict] = []

    def watch() -> bool:
        entry = b.roles[rid]
        states.append(entry.state)
        if entry.stalled and not rows:  # the row as STATUS gives it
            reply = registry_request(running.ctx, inproc_addr, P.Message(P.STATUS), 5.0)
            rows.extend(row for row in reply.meta["roles"] if row["id"] == rid)
        return r.unblocked.is_set()

    r.block.set()
    wait_for(watch, timeout=BLOCK_S + 30, interval=0.05)
    if how == "control":
        assert "dead" in states
        return
    assert set(states) == {"alive"}, states
    assert r.pulses > 0 and r.registrations == 1 and r.error is None
    (row,) = rows
    assert (row["id"], row["state"]) == (rid, "alive")
    assert 1.5 <= row["stalled_s"] <= BLOCK_S + 5 and row["age"] < 1.0
    # The loop turns again: no longer stalled, and never re-registered.
    wait_for(lambda: not b.roles[rid].stalled and b.roles[rid].loop != row["loop"], timeout=10)
    reply = registry_request(running.ctx, inproc_addr, P.Message(P.STATUS), 5.0)
    assert [row["stalled_s"] for row in reply.meta["roles"] if row["id"] == rid] == [None]
    assert r.registrations == 1 and b.roles[rid].state == "alive"


def test_heartbeat_now_waits_for_the_ack_of_its_own_heartbeat(zmq_ctx):
    """A heartbeat sent inside a long step leaves its ack unread; ``heartbeat_now`` must not
    take that stale ack for the ack of the heartbeat it sends (a server asking the registry
    next would not see the info it carries). A hand-driven broker acks what it is told to."""
    addr = f"inproc://zrl-acks-{os.getpid()}-{next(_names)}"
    spec = make_config().model_dump(mode="json")
    t = rogue_broker(zmq_ctx, addr, spec, "fake-0", keep_open=True)
    r = FakeRole(addr, ctx=zmq_ctx, connect_timeout=10)
    try:
        r.connect()
        t.join(10)
        sock = t.sock  # type: ignore[attr-defined]

        def next_beat() -> tuple[bytes, dict]:
            assert sock.poll(5_000), "no heartbeat came"
            ident, *frames = sock.recv_multipart()
            msg = P.decode(frames)
            assert msg.kind == P.HEARTBEAT
            return ident, msg.meta

        def ack(ident: bytes, meta: dict) -> None:
            ack = P.Message(P.HEARTBEAT_ACK, meta={"seq": meta["seq"]})
            sock.send_multipart([ident, *P.encode(ack)])

        r._next_metrics = float("inf")  # this WELCOME names no topic bus to publish on
        r.heartbeat_interval = 3600.0  # only the heartbeats the test makes, however slow it runs
        r._next_heartbeat = 0.0
        r.heartbeat_if_due()  # inside a step: its ack stays unread
        ident, first = next_beat()
        ack(ident, first)
        assert r._registry is not None and r._registry.sock.poll(5_000)  # the ack waits
        # Not acknowledged: the stale ack of the first heartbeat does not count.
        assert not r.heartbeat_now(timeout=0.3)
        ident, second = next_beat()
        assert second["seq"] == first["seq"] + 1
        # Acknowledged (the unanswered one's ack late, then its own): it returns True.
        ack(ident, second)
        acked: list[bool] = []
        waiting = threading.Thread(target=lambda: acked.append(r.heartbeat_now(5.0)))
        waiting.start()
        ident, third = next_beat()
        ack(ident, third)
        waiting.join(10)
        assert acked == [True]
    finally:
        r.close()
        t.join(10)
        if getattr(t, "sock", None) is not None:
            t.sock.close(linger=0)  # type: ignore[attr-defined]


def test_role_registers_gets_spec_and_heartbeats(running, inproc_addr):
    b = running.broker(inproc_addr)
    r = running.role(inproc_addr, index=3, connect_timeout=5)
    wait_for(registered(b, r), timeout=5)
    assert r.error is None
    assert r.id == "fake-3"
    entry = b.roles["fake-3"]
    assert (entry.role, entry.pid, entry.host) == ("fake", os.getpid(), r.host)
    # The experiment spec and the liveness settings came from the broker.
    assert r.config.name == "role-base-test" and r.config.seed == 17
    assert (r.heartbeat_interval, r.heartbeat_timeout) == (0.1, 0.6)
    assert set(r.endpoints) == set(b.endpoints)
    assert r.state == "running"
    # Heartbeats keep arriving (and carry the role's stream counters).
    first = b.registry.stats.received
    wait_for(lambda: b.registry.stats.received >= first + 5, timeout=5)
    assert "registry" in b.roles["fake-3"].stats
    assert b.roles["fake-3"].stats["registry"]["sent"] >= 5
    assert r.steps > 0
    # A clean stop says bye.
    r.request_stop()
    wait_for(registered(b, r, "stopped"), timeout=5)


def test_two_roles_without_index_get_distinct_ids(running, inproc_addr):
    b = running.broker(inproc_addr)
    r1 = running.role(inproc_addr, connect_timeout=5)
    r2 = running.role(inproc_addr, connect_timeout=5)
    wait_for(lambda: registered(b, r1)() and registered(b, r2)(), timeout=5)
    assert {r1.id, r2.id} == {"fake-0", "fake-1"}


def test_role_reregisters_after_broker_restart(running, inproc_addr):
    b1 = running.broker(inproc_addr)
    r = running.role(inproc_addr, connect_timeout=5)
    wait_for(registered(b1, r), timeout=5)
    rid = r.id
    assert r.registrations == 1
    running.stop_broker(b1)
    time.sleep(0.3)  # the role notices the silence only after heartbeat_timeout
    b2 = running.broker(inproc_addr)
    assert rid not in b2.roles
    t0 = time.monotonic()
    wait_for(registered(b2, r), timeout=8)
    wait_for(lambda: r.registrations == 2, timeout=5)
    assert time.monotonic() - t0 < 8
    assert r.error is None
    assert r.id == rid and list(b2.roles) == [rid]
    assert b2.roles[rid].pid == os.getpid()
    assert b2.roles[rid].restarts == 0  # same process: a reconnect, not a restart
    # Heartbeats flow to the new broker.
    first = b2.registry.stats.received
    wait_for(lambda: b2.registry.stats.received >= first + 3, timeout=5)


def test_connect_without_broker_fails_after_timeout(zmq_ctx, broker_addr):
    r = FakeRole(broker_addr, ctx=zmq_ctx, connect_timeout=1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(RoleError, match="no answer from a broker at") as info:
            r.connect()
    finally:
        r.close()
    elapsed = time.monotonic() - t0
    assert broker_addr in str(info.value)
    assert elapsed >= 1.0  # it waited its connect_timeout, then gave up (no hang)


def test_connect_refused_on_zrl_version_mismatch(running, inproc_addr, monkeypatch):
    b = running.broker(inproc_addr)
    monkeypatch.setattr(base, "__version__", "99.0.0")
    r = FakeRole(inproc_addr, ctx=running.ctx, connect_timeout=3.0)
    try:
        with pytest.raises(RoleError, match="refused") as info:
            r.connect()
    finally:
        r.close()
    assert "99.0.0" in str(info.value) and __version__ in str(info.value)
    assert b.roles == {}


def test_connect_stops_when_asked(zmq_ctx, broker_addr):
    stop = threading.Event()
    r = FakeRole(broker_addr, ctx=zmq_ctx, connect_timeout=30.0, stop_event=stop)
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(RoleError, match="stopped before the broker answered"):
            r.connect()
    finally:
        r.close()
    assert time.monotonic() - t0 < 3.0


def test_lookup_and_status_through_registry_request(running, inproc_addr):
    b = running.broker(inproc_addr)

    class Service(FakeRole):
        role = "params"

        def bind(self) -> None:
            self.bind_rpc()

    svc = Service(inproc_addr, ctx=running.ctx, connect_timeout=5)
    t = threading.Thread(target=svc.run, daemon=True)
    t.start()
    running.roles.append((svc, t))
    wait_for(registered(b, svc), timeout=5)
    assert svc.rpc_endpoint.startswith("inproc://")
    client = FakeRole(inproc_addr, ctx=running.ctx)
    services = client.lookup("params", timeout=2.0)
    assert services == [{"id": svc.id, "rpc": svc.rpc_endpoint, "host": svc.host}]
    assert client.lookup("learner", timeout=2.0) == []
    reply = registry_request(running.ctx, inproc_addr, P.Message(P.STATUS), 2.0)
    assert [row["id"] for row in reply.meta["roles"]] == [svc.id]
    assert reply.meta["broker"]["experiment"] == "role-base-test"


# --- what a WELCOME may name (issue 12): checkpoint paths and factory references ---------------


def welcome(checkpoint_dir: str | None = None, rid: str = "fake-0", **factories: str) -> P.Message:
    """A WELCOME as the broker sends it (or as a forger would)."""
    spec = make_config().model_dump(mode="json")
    spec["checkpoint"]["dir"] = checkpoint_dir
    return welcome_message(spec, rid, factories)


TCP = "tcp://127.0.0.1:1"  # never connected: _on_welcome is fed directly


def test_welcome_checkpoint_dir_outside_the_root_becomes_the_runs_own_under_it(zmq_ctx, tmp_path):
    """A checkpoint.dir under the role's root is used as it is (the head's own host); one
    outside (the head's path, on another host) becomes <root>/<run>: every file of the role
    still lies under its root, and nothing is refused."""
    root = tmp_path / "run" / "checkpoints"
    r = FakeRole(TCP, ctx=zmq_ctx, checkpoint_root=root)
    r._on_welcome(welcome(str(root)))
    assert r.config.checkpoint.dir == str(root.resolve())
    r._on_welcome(welcome(str(root / "sub")))
    assert r.config.checkpoint.dir == str((root / "sub").resolve())
    # The run's name: a head's RUN_DIR/checkpoints gives RUN_DIR's; any other, its own; a
    # directory without a plain name (the root of the filesystem), the experiment's.
    for outside, run in (
        (str(tmp_path / "node1" / "runs" / "exp1" / "checkpoints"), "exp1"),
        ("/etc", "etc"),
        (str(root / ".." / "elsewhere"), "elsewhere"),
        (str(tmp_path), tmp_path.name),
        ("/", "role-base-test"),
    ):
        r._on_welcome(welcome(outside))
        assert r.config.checkpoint.dir == str(root.resolve() / run), outside
    # A link in the root that leads out of it: the run's own directory would be outside.
    root.mkdir(parents=True)
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(RoleError, match="not inside its checkpoint root") as info:
        r._on_welcome(welcome(str(root / "link")))
    assert str(root.resolve()) in str(info.value) and "--checkpoint-root" in str(info.value)
    assert r.config.checkpoint.dir == str(root.resolve() / "role-base-test")  # kept as it was


def test_welcome_checkpoint_root_defaults_to_the_working_directory(zmq_ctx, tmp_path, monkeypatch):
    node2 = tmp_path / "node2"
    node2.mkdir()
    monkeypatch.chdir(node2)
    r = FakeRole(TCP, ctx=zmq_ctx)
    r._on_welcome(welcome("ckpt"))
    assert r.config.checkpoint.dir == str(node2.resolve() / "ckpt")
    # The head's checkpoints on another host's path: this role's own, named after the run.
    r._on_welcome(welcome(str(tmp_path / "node1" / "runs" / "exp1" / "checkpoints")))
    assert r.config.checkpoint.dir == str(node2.resolve() / "exp1")
    assert r.files_root == node2.resolve() and r.files_dir is None  # no file asked for yet
    r._on_welcome(welcome(None))  # no checkpoints at all: nothing to check
    assert r.config.checkpoint.dir is None
    # An inproc broker lives in this process: its config is the user's own.
    inproc = FakeRole("inproc://zrl-test-welcome", ctx=zmq_ctx)
    inproc._on_welcome(welcome("/anywhere/ckpt"))
    assert inproc.config.checkpoint.dir == "/anywhere/ckpt"


def test_a_role_that_asks_for_a_checkpoint_file_says_where_it_keeps_files(zmq_ctx, tmp_path):
    root = tmp_path / "node2"
    r = FakeRole(TCP, ctx=zmq_ctx, checkpoint_root=root)
    r._on_welcome(welcome(str(tmp_path / "node1" / "runs" / "exp1" / "checkpoints")))
    assert r.files_dir is None  # an actor never asks: it keeps no files, and says none
    path = r.checkpoint_file(".pt")
    assert path == root.resolve() / "exp1" / f"{r.id}.pt"
    assert r.files_dir == str(root.resolve() / "exp1")  # what its heartbeats carry


def test_the_heartbeats_of_a_role_that_keeps_files_say_where(running, inproc_addr, tmp_path):
    class Keeper(FakeRole):
        def setup(self) -> None:
            self.checkpoint_file(".pt")  # as the learner, params and a replay shard do

    cfg = make_config()
    cfg.checkpoint.dir = str(tmp_path / "node1" / "runs" / "exp1" / "checkpoints")
    b = running.broker(inproc_addr, cfg)
    keeper = running.role(inproc_addr, Keeper, checkpoint_root=tmp_path / "node2")
    plain = running.role(inproc_addr)
    own = str((tmp_path / "node2").resolve() / "exp1")

    def info(r: FakeRole) -> dict:
        entry = b.roles.get(r.id) if r.id else None
        return entry.info if entry is not None else {}

    wait_for(lambda: info(keeper).get("checkpoint_dir") == own, timeout=5)
    wait_for(lambda: "rss_mb" in info(plain), timeout=5)
    assert "checkpoint_dir" not in info(plain)  # a role that keeps no files names none


def test_welcome_factory_references_need_keys_or_the_same_local_reference(zmq_ctx):
    r = FakeRole(TCP, ctx=zmq_ctx)
    with pytest.raises(RoleError, match="unauthenticated") as info:
        r._on_welcome(welcome(env="os:abort"))
    message = str(info.value)
    assert "'os:abort'" in message and "--keys" in message and "--env-factory" in message
    # Given the same reference locally (zrl run and `zrl start --env-factory` do): accepted.
    mine = FakeRole(TCP, ctx=zmq_ctx, local_factories={"env": "tests.roles.test_base:make_env"})
    mine._on_welcome(welcome(env="tests.roles.test_base:make_env"))
    assert mine.factories.env == "tests.roles.test_base:make_env"
    # ... but not a different one, nor one for the other factory.
    with pytest.raises(RoleError, match="'os:abort'"):
        mine._on_welcome(welcome(env="os:abort"))
    with pytest.raises(RoleError, match="model factory 'os:abort'"):
        mine._on_welcome(welcome(env="tests.roles.test_base:make_env", model="os:abort"))
    # Over an authenticated broker (keys) or inproc, the broker's references are the user's.
    keyed = FakeRole(TCP, ctx=zmq_ctx, keys=object())  # type: ignore[arg-type]
    keyed._on_welcome(welcome(model="tests.roles.test_base:make_env"))
    assert keyed.factories.model == "tests.roles.test_base:make_env"


def make_env() -> None:
    """A factory reference target for the tests above (never called)."""


def test_unauthenticated_broker_naming_os_abort_is_refused_end_to_end(running, broker_addr):
    from zrl.config.factories import Factories

    b = Broker(broker_addr, make_config(), ctx=running.ctx, factories=Factories(env="os:abort"))
    t = threading.Thread(target=b.run, name="test-broker", daemon=True)
    t.start()
    running.brokers.append((b, t))
    r = FakeRole(broker_addr, ctx=running.ctx, connect_timeout=10)
    try:
        with pytest.raises(RoleError, match="env factory 'os:abort' over an unauthenticated"):
            r.connect()
    finally:
        r.close()
    assert r.factories.env is None  # never taken, never imported


# --- a role's id names its files (issue 27, observation 5) ------------------------------------

ESCAPING_IDS = [
    "/abs/x/pwn-replay",
    "replay-0/../../../x/pwn-replay",
    "replay-0/x",
    "replay-07",
    "replay-" + "9" * 50,
    "actor-0",
    "replay-",
    "replay-0\x00",
    "",
]


def rogue_broker(
    ctx: zmq.Context, addr: str, spec: dict, rid: str, keep_open: bool = False
) -> threading.Thread:
    """A broker that answers the first HELLO with a WELCOME giving the id ``rid``; with
    ``keep_open`` its socket stays open for the caller (``thread.sock``, once joined)."""
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(addr)

    def answer() -> None:
        try:
            if sock.poll(10_000):
                ident, *_ = sock.recv_multipart()
                sock.send_multipart([ident, *P.encode(welcome_message(spec, rid))])
        finally:
            if not keep_open:
                sock.close(linger=1000)

    t = threading.Thread(target=answer, name="rogue-broker", daemon=True)
    t.sock = sock if keep_open else None  # type: ignore[attr-defined]
    t.start()
    return t


@pytest.mark.parametrize("rid", ["/abs/x/pwn-replay", "replay-0/../../../x/pwn-replay"])
def test_a_replay_shard_refuses_an_id_that_would_put_its_snapshot_outside_the_root(
    zmq_ctx, tmp_path, rid
):
    """A rogue broker's WELCOME id made a shard write its snapshot outside the checkpoint root:
    the real shard, run against such a broker, refuses the id and writes nothing anywhere."""
    from zrl.roles.replay import ReplayServer

    root = tmp_path / "run" / "checkpoints"
    root.mkdir(parents=True)
    spec = make_config().model_dump(mode="json")
    spec["checkpoint"].update(dir=str(root), replay=True, interval=0.01)
    addr = f"inproc://zrl-rogue-broker-{os.getpid()}-{next(_names)}"
    t = rogue_broker(zmq_ctx, addr, spec, rid.replace("/abs", str(tmp_path / "abs")))
    shard = ReplayServer(addr, ctx=zmq_ctx, connect_timeout=10, checkpoint_root=root)
    try:
        with pytest.raises(RoleError, match="refusing it") as info:
            shard.run()
    finally:
        shard.close()
    t.join(10)
    assert "replay-<n>" in str(info.value) and shard.id == ""
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("role_name", ["replay", "learner", "params"])
def test_the_checkpoint_files_of_every_role_lie_under_its_root(zmq_ctx, tmp_path, role_name):
    """What the learner, params and a replay shard read and write: ``checkpoint_file``, one
    checked function (``checked_file``) for all three."""
    from zrl.roles import role_class

    root = tmp_path / "checkpoints"
    r = role_class(role_name)(TCP, ctx=zmq_ctx, checkpoint_root=root)
    suffix = ".snapshot" if role_name == "replay" else ".pt"
    for rid in ESCAPING_IDS:
        with pytest.raises(RoleError, match="refusing it"):
            r._on_welcome(welcome(str(root), rid=rid.replace("replay", role_name)))
    r._on_welcome(welcome(str(root), rid=f"{role_name}-3"))
    assert (r.id, r.index) == (f"{role_name}-3", 3)
    assert r.checkpoint_file(suffix) == root.resolve() / f"{role_name}-3{suffix}"
    r.id = f"{role_name}-0/../../x"  # however a bad id came to be held: no file for it
    with pytest.raises(RoleError, match="no checkpoint file"):
        r.checkpoint_file(suffix)
    # A link in the directory that leads out of the root: the final path is checked.
    r.id = f"{role_name}-4"
    root.mkdir(parents=True)
    (root / f"{role_name}-4{suffix}").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RoleError, match="would leave"):
        r.checkpoint_file(suffix)
    with pytest.raises(RoleError, match="would leave"):
        base.checked_file(root, "../x")


def test_a_role_stops_once_its_broker_is_gone_past_the_orphan_timeout(running, inproc_addr):
    cfg = make_config()
    cfg.broker.orphan_timeout = 1.5
    b = running.broker(inproc_addr, cfg)
    r = running.role(inproc_addr, connect_timeout=5)
    wait_for(registered(b, r), timeout=10)
    assert not r.orphaned
    running.stop_broker(b)
    # It reconnects meanwhile (heartbeat_timeout 0.6 s), then gives up and stops cleanly.
    wait_for(lambda: r.stop_event.is_set(), timeout=30)
    assert r.orphaned and r.error is None


def test_a_role_under_a_host_agent_heartbeats_it_and_says_hello_again_when_told(
    running, inproc_addr, tmp_path, monkeypatch, zmq_ctx
):
    """The agent's side is played here by hand: a DEALER registered as ``host-0`` on this
    host, and the ipc ROUTER its roles heartbeat (``AGENT_ENDPOINT_ENV``)."""
    cfg = make_config()
    cfg.broker.heartbeat_timeout = 3.0
    b = running.broker(inproc_addr, cfg)
    agent = zmq_ctx.socket(zmq.DEALER)
    agent.setsockopt(zmq.LINGER, 0)
    agent.connect(inproc_addr)
    beats_in = zmq_ctx.socket(zmq.ROUTER)
    beats_in.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/heartbeats"
    beats_in.bind(endpoint)

    def to_broker(kind: str, **meta: object) -> P.Message:
        agent.send_multipart(P.encode(P.Message(kind, meta=meta)))
        assert agent.poll(5000), f"no answer to {kind}"
        return P.decode(agent.recv_multipart())

    try:
        hello = {"role": "host", "index": 0, "host": socket.gethostname(), "pid": os.getpid()}
        assert to_broker(P.HELLO, zrl_version=__version__, **hello).meta["id"] == "host-0"
        monkeypatch.setenv(base.AGENT_ID_ENV, "host-0")
        monkeypatch.setenv(base.AGENT_ENDPOINT_ENV, endpoint)
        r = running.role(inproc_addr, index=0, connect_timeout=5)

        def next_beat(full: bool = True) -> tuple[bytes, P.Message]:
            """The next heartbeat; ``full``: the next from the role's loop (with its figures),
            past those of its heartbeat thread (the loop held a moment: ``id``, ``seq``,
            ``state`` and ``loop`` alone)."""
            while True:
                assert beats_in.poll(10_000), "the role sent its agent no heartbeat"
                ident, *frames = beats_in.recv_multipart()
                beat = P.decode(frames)
                if not full or "info" in beat.meta:
                    return ident, beat
                assert set(beat.meta) == {"id", "seq", "state", "loop"}

        ident, beat = next_beat()
        assert beat.kind == P.HEARTBEAT and beat.meta["id"] == "fake-0"
        assert b.roles["fake-0"].agent == "host-0" and b.roles["fake-0"].state == "starting"
        # The agent reports it; the broker keeps what the role said, and the agent acks it.
        report = {k: beat.meta[k] for k in ("id", "stats", "info")}
        assert to_broker(P.HEARTBEAT, id="host-0", roles=[report]).meta["unknown"] == []
        assert b.roles["fake-0"].state == "alive" and "agent" in b.roles["fake-0"].stats
        beats_in.send_multipart([ident, *P.encode(P.Message(P.HEARTBEAT_ACK))])
        # Told that the broker does not know it under its agent: it says HELLO again.
        ident, _ = next_beat(full=False)
        beats_in.send_multipart(
            [ident, *P.encode(P.Message(P.UNKNOWN_ROLE, meta={"id": "fake-0"}))]
        )
        wait_for(lambda: r.registrations == 2, timeout=20)
        assert r.error is None and b.roles["fake-0"].agent == "host-0"
    finally:
        agent.close(linger=0)
        beats_in.close(linger=0)
