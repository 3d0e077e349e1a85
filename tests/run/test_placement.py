"""Where ``zrl run`` places roles, the address other hosts are told, the ``zrl host`` lines it
prints, and the roster of roles that took part (zrl.run.placement, zrl.run.roster)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import Factories
from zrl.config.sections import HostConfig
from zrl.run import placement as placement_module
from zrl.run.placement import (
    BrokerAccess,
    advertised_host,
    host_specs,
    remote_commands,
    role_trust_args,
)
from zrl.run.roster import ANY_HOST, HERE, MAX_UNPLANNED, Roster


def two_host_config(**broker: object) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.roles.actors, cfg.roles.replay = 5, 2
    cfg.hosts = [
        HostConfig(name="b", roles={"actors": 2, "replay": 1}),
        HostConfig(name="c", address="10.9.0.1", roles={"actors": 2}),
    ]
    for key, value in broker.items():
        setattr(cfg.broker, key, value)
    return cfg


def access(cfg: ExperimentConfig, **kw: object) -> BrokerAccess:
    return BrokerAccess.of(
        cfg, inproc=False, port=None, keys_dir=None, insecure=True, inproc_name="t", **kw
    )  # type: ignore[arg-type]


def test_host_specs_group_consecutive_indices_per_role():
    roles = [("replay", 1), ("actor", 1), ("actor", 2), ("actor", 4)]
    assert host_specs(roles) == ["replay=1@1", "actor=2@1", "actor=1@4"]


def test_remote_commands_are_one_zrl_host_line_per_host_with_its_broker_address():
    cfg = two_host_config(host="0.0.0.0", advertise="10.8.0.1")
    acc = access(cfg)
    port = acc.public_addr.rsplit(":", 1)[1]
    commands = remote_commands(cfg, Factories(), acc)
    assert commands == {
        "b": f"zrl host --broker tcp://10.8.0.1:{port} replay=1@1 actor=2@1",
        # Host c reaches the broker's host at its own address for it.
        "c": f"zrl host --broker tcp://10.9.0.1:{port} actor=2@3",
    }


def test_only_roles_on_the_heads_host_get_its_checkpoint_directory_as_their_root():
    """On another host the head's path means nothing: its `zrl host` line names no checkpoint
    root, and its roles keep their files under their own working directory."""
    cfg = two_host_config(host="0.0.0.0", advertise="10.8.0.1")
    cfg.checkpoint.dir = "/home/me/node1/runs/exp1/checkpoints"
    local = role_trust_args(cfg, Factories())
    assert local[local.index("--checkpoint-root") + 1] == cfg.checkpoint.dir
    assert "--checkpoint-root" not in role_trust_args(cfg, Factories(), here=False)
    for line in remote_commands(cfg, Factories(), access(cfg)).values():
        assert "--checkpoint-root" not in line and cfg.checkpoint.dir not in line, line


def test_the_advertised_address_is_never_a_hostname(monkeypatch: pytest.MonkeyPatch):
    assert advertised_host("10.1.2.3", None) == "10.1.2.3"
    assert advertised_host("0.0.0.0", "192.0.2.7") == "192.0.2.7"

    class NoRoute(socket.socket):
        def connect(self, address: object) -> None:
            raise OSError("Network is unreachable")

    monkeypatch.setattr(placement_module.socket, "socket", NoRoute)
    monkeypatch.setattr(placement_module, "non_loopback_addresses", lambda: ["10.88.0.1"])
    assert advertised_host("0.0.0.0", None) == "10.88.0.1"
    monkeypatch.setattr(placement_module, "non_loopback_addresses", lambda: [])
    with pytest.raises(ValueError, match="no address but loopback"):
        advertised_host("0.0.0.0", None)
    monkeypatch.setattr(
        placement_module, "non_loopback_addresses", lambda: ["10.1.0.1", "10.2.0.1"]
    )
    with pytest.raises(ValueError, match=r"broker.advertise=10.1.0.1"):
        advertised_host("0.0.0.0", None)
    # Placing roles elsewhere with only loopback known is refused before anything starts.
    monkeypatch.setattr(placement_module, "non_loopback_addresses", lambda: [])
    with pytest.raises(ValueError, match="no address but loopback"):
        access(two_host_config(host="0.0.0.0"))


def test_a_head_on_a_given_bind_expects_every_role_from_elsewhere():
    cfg = ExperimentConfig()
    acc = access(cfg, bind="tcp://127.0.0.1:47000", elsewhere=True)
    assert (acc.bind_addr, acc.broker_addr, acc.public_addr) == (
        "tcp://127.0.0.1:47000",
        "tcp://127.0.0.1:47000",
        "tcp://127.0.0.1:47000",
    )


def test_the_roster_names_missing_roles_and_keeps_those_the_registry_forgot():
    roster = Roster.of(
        [("learner", 0)], {"b": [("actor", 1), ("actor", 2)], ANY_HOST: []}, wait_s=30.0
    )
    rows = [
        {"id": "learner-0", "role": "learner", "host": "a", "pid": 1, "state": "alive"},
        {"id": "actor-1", "role": "actor", "host": "b", "pid": 7, "state": "alive", "restarts": 1},
        {"id": "host-0", "role": "host", "host": "b", "pid": 6, "state": "alive"},
    ]
    roster.update(rows, 2.0)
    assert roster.missing() == ["actor-2"]
    assert roster.describe_missing() == "actor-2 (b)"
    assert roster.overdue(10.0) == [] and roster.overdue(31.0) == ["actor-2"]
    assert roster.still_running_elsewhere() == ["actor-1", "host-0"]
    roster.update([], 40.0)  # the registry forgot them: the roster does not
    roster.ended_here({"learner-0": -9, "actor-9": 0})
    summary = roster.summary({"learner-0": 2})
    assert summary["never_came"] == ["actor-2"]
    assert summary["took_part"]["actor-1"]["placed"] == "b"
    assert summary["took_part"]["actor-1"]["restarts"] == 1
    assert summary["took_part"]["learner-0"] | {"first_seen": 0} == {
        "first_seen": 0,
        "role": "learner",
        "host": "a",
        "address": None,
        "pid": 1,
        "state": "exited -9",
        "restarts": 2,
        "placed": HERE,
    }
    assert summary["took_part"]["host-0"]["placed"] == "unplanned"


def test_the_roster_keeps_where_each_role_keeps_its_files_on_its_host():
    roster = Roster.of([("learner", 0)], {"b": [("actor", 0)]}, wait_s=None)
    learner = {"id": "learner-0", "role": "learner", "host": "a", "state": "alive"}
    actor = {"id": "actor-0", "role": "actor", "host": "b", "state": "alive", "info": {}}
    roster.update([{**learner, "info": {"checkpoint_dir": "/b/node2/exp1"}}, actor], 1.0)
    # A row without it (a host agent's report of liveness alone) or with junk keeps it.
    roster.update([{**learner, "info": {}}, actor], 2.0)
    roster.update([{**learner, "info": {"checkpoint_dir": ["/etc"]}}], 3.0)
    roster.update([{**learner, "info": {"checkpoint_dir": "x" * 5000}}], 4.0)
    took_part = roster.summary({})["took_part"]
    assert took_part["learner-0"]["checkpoint_dir"] == "/b/node2/exp1"
    assert "checkpoint_dir" not in took_part["actor-0"]  # it keeps no files


def test_the_roster_counts_a_restart_a_host_agent_made_before_the_role_registered_again():
    """A role killed moments before the run stopped: its host agent restarted it, but the new
    process had not registered, so the registry's row still says 0 restarts (the summary said
    so: tests/launchers/test_ssh_launcher.py under load). The agent's report of its children
    counts, for planned roles the roster has seen; malformed reports count as none."""
    roster = Roster.of([("learner", 0)], {"b": [("actor", 0), ("actor", 1)]}, wait_s=None)
    actor = {"id": "actor-0", "role": "actor", "host": "b", "pid": 7, "state": "dead"}
    agent = {"id": "host-0", "role": "host", "host": "b", "pid": 6, "state": "alive"}
    children = [
        {"id": "actor-0", "pid": 8, "state": "running", "restarts": 1},
        {"id": "actor-1", "restarts": 5},  # never registered: not in took_part
        {"id": "learner-9", "restarts": 3},  # not planned
        {"id": "actor-0", "restarts": "many"},
        "junk",
    ]
    roster.update([actor, {**agent, "info": {"children": children}}], 5.0)
    roster.update([actor, {**agent, "role": "actor", "info": {"children": [children[1]]}}], 6.0)
    summary = roster.summary({})
    assert summary["took_part"]["actor-0"]["restarts"] == 1
    assert "actor-1" not in summary["took_part"] and "learner-9" not in summary["took_part"]
    roster.update([{**actor, "restarts": 2}], 7.0)  # the registry's own count, when higher
    assert roster.summary({})["took_part"]["actor-0"]["restarts"] == 2


def test_the_roster_keeps_its_plan_and_a_bounded_number_of_unplanned_ids():
    """Anyone who reaches the broker can register under new ids (issue 27: 52,919 of them in
    summary.json): the roster keeps every planned role and MAX_UNPLANNED others, and counts
    the rest. A malformed restart count counts as none."""
    roster = Roster.of([("learner", 0)], {}, wait_s=None)
    for wave in range(20):
        rows = [
            {
                "id": f"actor-{1000 * wave + k}",
                "role": "actor",
                "state": "alive",
                "restarts": "many",
            }
            for k in range(50)
        ]
        roster.update([*rows, {"id": "learner-0", "role": "learner", "state": "alive"}], 1.0)
    summary = roster.summary({})
    assert len(summary["took_part"]) == 1 + MAX_UNPLANNED and "learner-0" in summary["took_part"]
    assert summary["unplanned_not_listed"] == 50 and summary["never_came"] == []
    assert all(r["restarts"] == 0 for r in summary["took_part"].values())


def test_the_roster_waits_for_ever_without_a_limit(tmp_path: Path):
    roster = Roster.of([], {ANY_HOST: [("actor", 0)]}, wait_s=None)
    assert roster.overdue(1e9) == []
    assert roster.missing() == ["actor-0"]


def test_each_actor_knows_the_inference_roles_placed_beside_it():
    cfg = ExperimentConfig.model_validate(
        {
            "algo": "appo",
            "replay": {"table": "fifo"},
            "roles": {"actors": 5, "inference": 3},
            "hosts": [
                {"name": "b", "roles": {"actors": 2, "inference": 2}},
                {"name": "c", "roles": {"actors": 1}},
            ],
        }
    )
    assert cfg.indices_by_host("actors") == {None: [0, 1], "b": [2, 3], "c": [4]}
    assert cfg.indices_by_host("inference") == {None: [0], "b": [1, 2], "c": []}
    assert [cfg.beside("actors", i, "inference") for i in range(5)] == [
        [0],
        [0],
        [1, 2],
        [1, 2],
        [],  # host c has none: its actor runs its own model
    ]
    assert cfg.beside("actors", 9, "inference") == []  # not a planned actor
    local, remote = placement_module.placement(cfg)
    assert ("inference", 0) in local and remote["b"][:2] == [("inference", 1), ("inference", 2)]
