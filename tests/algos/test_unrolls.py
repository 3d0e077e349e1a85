"""``UnrollUpdate``'s learner group (``roles.learners: 2`` of IMPALA and APPO): two learners,
threads of this process as ``zrl run --inproc`` runs them, form their ``torch.distributed``
group through the "broker" (rank 0's heartbeat info), each trains its own batches, and their
weights are bit-identical after every batch, including a batch whose unrolls are all stale
on one learner, a follower resumed from other weights (rank 0's taken as the group forms) and
weights that drift apart later (corrected from rank 0 at the next batch); a batch that came
before the group formed is dropped, not trained behind the others; a learner that leaves is
replaced by a new one of its rank, which re-forms the group with rank 0 on generation 2 and
takes rank 0's weights."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest
import torch

from tests.helpers.ranks import run_ranks
from tests.helpers.updates import GroupServices, batch, config, setup, unroll_batch
from zrl.algos.api.learner import UpdateResult
from zrl.algos.appo.update import AppoUpdate
from zrl.algos.impala.update import ImpalaUpdate
from zrl.algos.kernel import policy_learners
from zrl.algos.kernel.unrolls import UnrollUpdate
from zrl.testing.probes import wait_for

VERSION = 5  # rank 0's weights version (acked by params); rank 1 never publishes: it has 0
# The unrolls' versions on each rank, per batch: rank 1's first batch has two stale ones
# (more than max_lag 2 behind the group's version 5, not behind its own 0), its third only
# stale ones (it trains on rank 0's gradients alone).
VERSIONS = {
    0: [[5] * 8, [4] * 8, [5, 5, 2, 2]],
    1: [[5, 5, 5, 5, 5, 5, 1, 1], [5, 4, 4], [0, 1, 2]],
}
UPDATES = {
    "appo": {"epochs": 2, "minibatches": 4, "max_lag": 2},
    "impala": {"epochs": 2, "max_lag": 2},
}
# Steps taken per batch, the same on both: appo's 2 x 4 minibatches, but in the third batch
# rank 0's 2 fresh unrolls fill 2 minibatches of each epoch and rank 1 has none: a step no
# learner had a sample for is not taken.
STEPS = {"appo": [8, 8, 4], "impala": [2, 2, 2]}


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def group_of_two(algo: str) -> list[UnrollUpdate]:
    cfg = config(algo, roles={"learners": 2}, replay={"batch_size": 8}, **{algo: UPDATES[algo]})
    registry: dict[str, dict[str, Any]] = {}
    kind = AppoUpdate if algo == "appo" else ImpalaUpdate
    ups = [kind(setup(cfg, index=i, services=GroupServices(i, registry))) for i in (0, 1)]
    registry["learner-0"] = ups[0].heartbeat_info()  # rank 0's heartbeat: the store address
    return ups


@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_two_learners_train_their_own_batches_to_identical_weights(algo: str) -> None:
    leader, follower = group_of_two(algo)
    assert leader.group is not None and follower.group is not None
    assert not leader.may_publish() and not follower.may_publish()  # not formed yet
    start = state(leader.model)
    with torch.no_grad():  # a follower resumed from an older checkpoint: other weights
        next(follower.model.parameters()).add_(0.25)
    formed: dict[int, dict[str, torch.Tensor]] = {}
    after: dict[int, list[dict[str, torch.Tensor]]] = {0: [], 1: []}
    results: dict[int, list[UpdateResult | None]] = {0: [], 1: []}
    ups = (leader, follower)

    def run(rank: int) -> None:
        up = ups[rank]
        try:
            early = unroll_batch(np.random.default_rng(99), [0] * 8)
            up.receive(batch(early), 0)  # before the group formed: dropped, not trained late
            while not up.members.ready:
                assert up.train(0) is None
            formed[rank] = state(up.model)  # rank 0's weights everywhere once formed
            if rank == 1:
                with torch.no_grad():  # then weights that drifted apart: corrected at a batch
                    next(up.model.parameters()).add_(0.25)
            for b, versions in enumerate(VERSIONS[rank]):
                arrays = unroll_batch(np.random.default_rng(10 * rank + b), versions)
                version = VERSION if rank == 0 else 0  # the role's own: 0 for a follower
                up.receive(batch(arrays), version)
                results[rank].append(up.train(version))
                after[rank].append(state(up.model))
        except BaseException:
            up.members.services.stop_event.set()  # the other rank's wait ends too
            raise

    try:
        run_ranks(run)
        assert len(after[0]) == len(after[1]) == len(VERSIONS[0])
        for mine, theirs in zip(after[0], after[1], strict=True):  # same bits after each batch
            assert all(torch.equal(mine[k], theirs[k]) for k in mine)
        assert any(not torch.equal(after[0][-1][k], start[k]) for k in start)
        for rank in (0, 1):
            updates = [r.updates for r in results[rank] if r is not None]
            assert updates == STEPS[algo], (rank, updates)
        assert leader.updates == follower.updates == sum(STEPS[algo])
        # Rank 1 measured staleness against the group's version, not its own 0.
        assert follower.members.version == VERSION and follower.stale_unrolls == 8 + 2 + 3
        assert leader.stale_unrolls == 8 + 2  # [5, 5, 2, 2]: two more than 2 behind
        assert leader.members.backlog_batches == follower.members.backlog_batches == 1
        assert results[1][2] is not None and results[1][2].samples == 0  # all stale: idle
        # The follower's other start was replaced by rank 0's as the group formed; its later
        # drift was measured at the first batch and taken from rank 0, once.
        assert all(torch.equal(formed[0][k], formed[1][k]) for k in formed[0])
        assert all(torch.equal(formed[0][k], start[k]) for k in start)
        assert leader.members.drift_corrections == follower.members.drift_corrections == 1
        assert leader.members.weight_drift == follower.members.weight_drift == 0.0
        assert leader.may_publish() and not follower.may_publish()
        info = follower.heartbeat_info()
        assert (info["group_rank"], info["group_size"], info["group_formed"]) == (1, 2, True)
        assert "group_store" in leader.heartbeat_info() and "group_store" not in info
    finally:
        leader.close()
        follower.close()


def test_three_appo_learners_stay_identical_after_every_batch() -> None:
    """``roles.learners: 3``: three ranks, each its own fresh batches (of different sizes),
    the same bits on every rank after each batch."""
    cfg = config("appo", roles={"learners": 3}, replay={"batch_size": 8}, appo=UPDATES["appo"])
    registry: dict[str, dict[str, Any]] = {}
    ups = [AppoUpdate(setup(cfg, index=i, services=GroupServices(i, registry))) for i in range(3)]
    registry["learner-0"] = ups[0].heartbeat_info()
    after: dict[int, list[dict[str, torch.Tensor]]] = {r: [] for r in range(3)}

    def run(rank: int) -> None:
        up = ups[rank]
        try:
            while not up.members.ready:
                assert up.train(0) is None
            for b in range(3):
                versions = [VERSION] * (8 - 2 * rank)  # 8, 6 and 4 unrolls
                arrays = unroll_batch(np.random.default_rng(100 * rank + b), versions)
                up.receive(batch(arrays), VERSION if rank == 0 else 0)
                assert up.train(VERSION if rank == 0 else 0) is not None
                after[rank].append(state(up.model))
        except BaseException:
            for other in ups:
                other.members.services.stop_event.set()
            raise

    try:
        run_ranks(run, ranks=3)
        for b in range(3):
            for rank in (1, 2):
                mine, theirs = after[0][b], after[rank][b]
                assert all(torch.equal(mine[k], theirs[k]) for k in mine), (b, rank)
        assert all(u.members.weight_drift == 0.0 and u.members.drift_corrections == 0 for u in ups)
        assert [u.heartbeat_info()["group_size"] for u in ups] == [3, 3, 3]
    finally:
        for up in ups:
            up.close()


def test_a_learner_without_batches_joins_the_round_of_one_that_has_one(monkeypatch) -> None:
    """Batches dealt out unevenly (or a shard that stopped): after ``IDLE_ROUND_S`` without
    a batch, learner 1 joins learner 0's round with none, so learner 0 does not wait for it;
    both step on learner 0's gradients and stay identical."""
    monkeypatch.setattr(policy_learners, "IDLE_ROUND_S", 0.05)
    leader, follower = group_of_two("appo")
    ups = (leader, follower)
    before = state(leader.model)

    def run(rank: int) -> None:
        up = ups[rank]
        try:
            while not up.members.ready:
                assert up.train(0) is None
            if rank == 0:
                up.receive(batch(unroll_batch(np.random.default_rng(1), [5] * 8)), VERSION)
                assert up.train(VERSION) is not None
            else:  # no batch: train() joins a round once IDLE_ROUND_S has passed
                wait_for(lambda: up.train(0) is not None, timeout=120)
        except BaseException:
            up.members.services.stop_event.set()
            raise

    try:
        run_ranks(run)
        assert leader.updates == follower.updates == STEPS["appo"][0]
        assert follower.members.idle_rounds == 1 and leader.members.idle_rounds == 0
        mine, theirs = state(leader.model), state(follower.model)
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
        assert any(not torch.equal(mine[k], before[k]) for k in mine)
        assert follower.heartbeat_info()["idle_rounds"] == 1
    finally:
        leader.close()
        follower.close()


def test_a_replaced_learner_reforms_the_group_and_takes_rank_0s_weights() -> None:
    """Learner 1 leaves (its group closed, as a killed process's would be); learner 0's next
    batch fails its collective and is dropped, without stopping it; a new learner 1 (other
    weights, no Adam state: a restart from an older checkpoint or none) joins, the group
    forms again on generation 2, and the new learner holds rank 0's weights and Adam state
    before either trains: their next batches leave them identical, with no drift to correct."""
    cfg = config("appo", roles={"learners": 2}, replay={"batch_size": 8}, appo=UPDATES["appo"])
    leader, follower = group_of_two("appo")
    registry = cast(GroupServices, leader.members.services).registry
    replacement: UnrollUpdate | None = None

    def train_one(ups: tuple[UnrollUpdate, UnrollUpdate], seed: int) -> None:
        def run(rank: int) -> None:
            wait_for(lambda: ups[rank].members.poll(), timeout=120)
            arrays = unroll_batch(np.random.default_rng(seed + rank), [5] * 8)
            ups[rank].receive(batch(arrays), VERSION)
            assert ups[rank].train(VERSION) is not None

        run_ranks(run)

    try:
        train_one((leader, follower), 1)
        follower.close()
        leader.receive(batch(unroll_batch(np.random.default_rng(3), [5] * 8)), VERSION)
        assert leader.train(VERSION) is None  # the collective failed: batch dropped
        assert not leader.members.ready and leader.members.group is not None
        assert leader.members.group.generation == 2
        replacement = AppoUpdate(setup(cfg, index=1, services=GroupServices(1, registry)))
        with torch.no_grad():
            next(replacement.model.parameters()).add_(0.25)
        assert not replacement.optimizer.state_dict()["state"]  # no Adam moments yet
        ups = (leader, replacement)
        run_ranks(lambda r: wait_for(lambda: ups[r].members.poll(), timeout=120))
        mine, theirs = state(leader.model), state(replacement.model)
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
        moments = [up.optimizer.state_dict()["state"] for up in ups]
        assert moments[0].keys() == moments[1].keys() and moments[0]
        for key, values in moments[0].items():
            assert all(torch.equal(v, moments[1][key][n]) for n, v in values.items())
        for up in ups:
            info = up.heartbeat_info()
            assert (info["group_generation"], info["group_reforms"]) == (2, 1), info
            assert info["group_formed"] is True, info
        train_one(ups, 5)
        mine, theirs = state(leader.model), state(replacement.model)
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
        assert leader.members.drift_corrections == replacement.members.drift_corrections == 0
    finally:
        leader.close()
        follower.close()
        if replacement is not None:
            replacement.close()
