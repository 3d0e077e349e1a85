"""``BatchUpdate``'s learner group (``roles.learners: 2`` of Ape-X DQN, DDPG / TD3 and SAC):
two learners, threads of this process as ``zrl run --inproc`` runs them, form their
``torch.distributed`` group through the "broker" (rank 0's heartbeat info), each trains the
batches dealt to it, and their whole update state (weights, targets, every optimizer, SAC's
temperature, the update count) is bit-identical after every batch; a follower started from
other weights, targets and update count takes rank 0's as the group forms; a learner without
a batch joins the round of one that has one, adding nothing to the mean (the result equals a
lone learner's step on the other's batch), and where no learner has a batch no step is taken."""

from __future__ import annotations

import copy
from typing import Any, cast

import numpy as np
import pytest
import torch

from tests.helpers.ranks import run_ranks
from tests.helpers.updates import (
    SHARD,
    B,
    GroupServices,
    batch,
    config,
    continuous_batch,
    dqn_batch,
    setup,
)
from zrl.algos.apex_ddpg.update import ApexDDPGUpdate
from zrl.algos.apex_dqn.update import ApexDQNUpdate
from zrl.algos.api.learner import UpdateResult
from zrl.algos.kernel import policy_learners
from zrl.algos.kernel.batch_update import BatchUpdate
from zrl.algos.sac.update import SACLearnerUpdate
from zrl.testing.probes import wait_for

torch.set_num_threads(1)

ALGOS = [
    pytest.param("apex_dqn", {"learner": {"target_update_interval": 2}}, id="dqn"),
    pytest.param("apex_ddpg", {"ddpg": {"twin": True, "policy_delay": 2}}, id="td3"),
    pytest.param("sac", {}, id="sac"),
]


def group_of_two(algo: str, sections: dict[str, Any]) -> list[BatchUpdate]:
    cfg = config(algo, roles={"learners": 2}, **sections)
    registry: dict[str, dict[str, Any]] = {}
    kind = {"apex_dqn": ApexDQNUpdate, "apex_ddpg": ApexDDPGUpdate, "sac": SACLearnerUpdate}[algo]
    # seed=index: the follower starts from other weights (a resume from another checkpoint)
    ups = [kind(setup(cfg, seed=i, index=i, services=GroupServices(i, registry))) for i in (0, 1)]
    registry["learner-0"] = ups[0].heartbeat_info()  # rank 0's heartbeat: the store address
    return ups


def arrays_for(algo: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return dqn_batch(rng) if algo == "apex_dqn" else continuous_batch(rng)


def flat_state(update: BatchUpdate) -> dict[str, Any]:
    """Every tensor and number of the update's checkpoint state, by path."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value):
                walk(f"{prefix}/{i}", v)
        elif isinstance(value, torch.Tensor):
            out[prefix] = value.detach().clone()
        else:
            out[prefix] = value

    walk("", {**update.state_dict(), "updates": update.updates})
    return out


def same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            if not torch.equal(v, b[k]):
                return False
        elif v != b[k]:
            return False
    return True


def stop_all(ups: list[BatchUpdate]) -> None:
    for up in ups:
        up.members.services.stop_event.set()


@pytest.mark.parametrize(("algo", "sections"), ALGOS)
def test_two_learners_train_their_own_batches_to_identical_state(
    algo: str, sections: dict[str, Any]
) -> None:
    ups = group_of_two(algo, sections)
    leader, follower = ups
    assert leader.group is not None and follower.group is not None
    assert not leader.may_publish() and not follower.may_publish()  # not formed yet
    start = flat_state(leader)
    with torch.no_grad():  # a follower resumed from elsewhere: other targets and phase too
        next(follower.target.parameters()).add_(0.5)
    follower.updates = 7
    assert not same_state(start, flat_state(follower))
    formed: dict[int, dict[str, Any]] = {}
    after: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    results: dict[int, list[UpdateResult | None]] = {0: [], 1: []}

    def run(rank: int) -> None:
        up = ups[rank]
        try:
            up.receive(batch(arrays_for(algo, np.random.default_rng(99))), 0)  # before forming
            while not up.members.ready:
                assert up.train(0) is None
            formed[rank] = flat_state(up)
            for b in range(3):
                arrays = arrays_for(algo, np.random.default_rng(10 * rank + b))
                up.receive(batch(arrays, shard=f"replay-{rank}"), 0)
                results[rank].append(up.train(0))
                after[rank].append(flat_state(up))
        except BaseException:
            stop_all(ups)
            raise

    try:
        run_ranks(run)
        assert same_state(formed[0], start) and same_state(formed[1], start)
        for b, (mine, theirs) in enumerate(zip(after[0], after[1], strict=True)):
            assert same_state(mine, theirs), b
        assert not same_state(after[0][-1], start)
        assert leader.updates == follower.updates == 3
        for rank in (0, 1):
            for r in results[rank]:  # each learner's priorities go to its own batch's shard
                assert r is not None and r.updates == 1 and r.samples == B
                assert r.priorities is not None and r.priorities.shard == f"replay-{rank}"
        assert leader.members.backlog_batches == follower.members.backlog_batches == 1
        assert leader.members.weight_drift == follower.members.weight_drift == 0.0
        assert leader.members.drift_corrections == follower.members.drift_corrections == 0
        assert leader.may_publish() and not follower.may_publish()
        info = follower.heartbeat_info()
        assert (info["group_rank"], info["group_size"], info["group_formed"]) == (1, 2, True)
        assert "group_store" in leader.heartbeat_info() and "group_store" not in info
        assert follower.summary() == "rank 1 of a group of 2"
    finally:
        leader.close()
        follower.close()


def test_an_idle_learner_joins_the_round_and_adds_nothing(monkeypatch) -> None:
    """After a batch each, learner 0 has a second batch and learner 1 none: past
    ``IDLE_ROUND_S`` learner 1 joins the round on its last batch with weight 0, so both take
    exactly the step a lone learner takes on learner 0's batch. Then neither has a batch: their
    idle round takes no step."""
    monkeypatch.setattr(policy_learners, "IDLE_ROUND_S", 0.05)
    sections = {"learner": {"target_update_interval": 2}}
    ups = group_of_two("apex_dqn", sections)
    leader, follower = ups
    lone = ApexDQNUpdate(setup(config("apex_dqn", **sections)))
    second = dqn_batch(np.random.default_rng(2))
    at: dict[str, dict[str, Any]] = {}
    idle: list[UpdateResult | None] = []

    def run(rank: int) -> None:
        up = ups[rank]
        try:
            while not up.members.ready:
                assert up.train(0) is None
            up.receive(batch(dqn_batch(np.random.default_rng(rank))), 0)
            assert up.train(0) is not None
            if rank == 0:
                at["first"] = {**copy.deepcopy(up.state_dict()), "updates": up.updates}
                up.receive(batch(second), 0)
                assert up.train(0) is not None
            else:  # no batch: train() joins a round once IDLE_ROUND_S has passed
                wait_for(lambda: bool(idle.append(up.train(0)) or idle[-1]), timeout=120)
            updates = up.updates
            assert not up.pending
            wait_for(up.members.idle_due, timeout=120)
            assert up.train(0) is None  # every learner idle: no step
            assert up.updates == updates
        except BaseException:
            stop_all(ups)
            raise

    try:
        run_ranks(run)
        result = idle[-1]
        assert result is not None and result.updates == 1
        assert result.samples == 0 and result.priorities is None
        assert follower.members.idle_rounds == 2 and leader.members.idle_rounds == 1
        mine, theirs = flat_state(leader), flat_state(follower)
        assert same_state(mine, theirs) and leader.updates == 2
        # A lone learner from the state after the first batch, on learner 0's second batch:
        # the same bits (learner 1's part of the mean was exactly zero).
        lone.load_state_dict(at["first"])
        lone.receive(batch(second), 0)
        assert lone.train(0) is not None
        assert same_state(flat_state(lone), mine)
    finally:
        leader.close()
        follower.close()


def test_a_lone_learner_has_no_group_and_publishes() -> None:
    update = ApexDQNUpdate(setup(config("apex_dqn")))
    assert update.group is None and update.may_publish()
    assert update.heartbeat_info() == {} and update.summary() == ""
    update.receive(batch(dqn_batch(np.random.default_rng(0))), 0)
    result = update.train(0)
    assert result is not None and result.priorities is not None
    assert result.priorities.shard == SHARD


def test_a_replaced_sac_learner_reforms_the_group_and_takes_rank_0s_whole_state() -> None:
    """SAC learner 1 leaves (its group closed, as a killed process's would be); learner 0's
    next batch fails its collective and is dropped, without stopping it; a new learner 1 (its
    own weights, targets and temperature, no optimizer state, update count 0) joins on
    generation 2 and holds rank 0's whole update state before either trains; their next
    batches leave them identical, with no drift to correct."""
    ups = group_of_two("sac", {})
    leader, follower = ups
    registry = cast(GroupServices, leader.members.services).registry
    replacement: BatchUpdate | None = None

    def train_one(pair: list[BatchUpdate], seed: int) -> None:
        def run(rank: int) -> None:
            try:
                wait_for(lambda: pair[rank].members.poll(), timeout=120)
                pair[rank].receive(batch(continuous_batch(np.random.default_rng(seed + rank))), 0)
                assert pair[rank].train(0) is not None
            except BaseException:
                stop_all(pair)
                raise

        run_ranks(run)

    try:
        train_one(ups, 1)
        follower.close()
        leader.receive(batch(continuous_batch(np.random.default_rng(3))), 0)
        assert leader.train(0) is None  # the collective failed: batch dropped
        assert not leader.members.ready and leader.members.group is not None
        assert leader.members.group.generation == 2 and leader.updates == 1
        cfg = config("sac", roles={"learners": 2})
        replacement = SACLearnerUpdate(
            setup(cfg, seed=5, index=1, services=GroupServices(1, registry))
        )
        pair = [leader, replacement]
        assert not same_state(flat_state(leader), flat_state(replacement))
        run_ranks(lambda r: wait_for(lambda: pair[r].members.poll(), timeout=120))
        assert same_state(flat_state(leader), flat_state(replacement))
        for up in pair:
            info = up.heartbeat_info()
            assert (info["group_generation"], info["group_reforms"]) == (2, 1), info
        train_one(pair, 5)
        assert same_state(flat_state(leader), flat_state(replacement))
        assert leader.updates == replacement.updates == 2
        assert leader.members.drift_corrections == replacement.members.drift_corrections == 0
    finally:
        leader.close()
        follower.close()
        if replacement is not None:
            replacement.close()
