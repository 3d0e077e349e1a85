"""Population-based training for real: `zrl run` of CartPole PPO with two members, a short
ready interval, every role its own process."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from zrl.testing.processes import GUARD_S, run_zrl, tensorboard_tags

FITNESS = {
    # ranked by the actors' training returns
    "training": ["roles.evaluator=0", "pbt.min_episodes=2"],
    # ranked by each member's evaluator (evaluator i evaluates member_i)
    "evaluation": [
        "roles.evaluator=2",
        "pbt.fitness=evaluation",
        "evaluator.interval=1",
        "evaluator.episodes=5",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("fitness", sorted(FITNESS))
def test_two_members_exploit_and_the_lineage_is_written(tmp_path: Path, fitness: str) -> None:
    summary = run_zrl(
        tmp_path,
        "cartpole_ppo.yaml",
        "pbt.members=2",
        "roles.learners=2",
        "roles.pbt=1",
        *FITNESS[fitness],
        "pbt.ready_interval_s=4",
        "pbt.exploit_fraction=0.5",
        "checkpoint.interval=1",
        "stop.eval_return=null",
        # Bounded by the two learners' updates (a 30-s CI run made 7,840 to 10,060), not by
        # time: a loaded machine gives fewer updates, and so fewer chances to exploit, a second.
        "stop.updates=5000",
        wall_time=GUARD_S,
        beats=None,
    )
    beats = summary["heartbeats"]
    if fitness == "evaluation":  # each evaluator evaluated its own member's weights stream
        for i in (0, 1):
            assert beats[f"evaluator-{i}"]["evaluated_version"] > 0, beats[f"evaluator-{i}"]
    pbt = beats["pbt-0"]
    assert pbt["exploits"] >= 1, pbt
    learners = [beats["learner-0"], beats["learner-1"]]  # learner i trains member_i
    assert sum(b["pbt_exploits"] for b in learners) >= 1, learners
    with (Path(summary["dir"]) / "checkpoints" / "pbt-0.csv").open() as f:
        rows = list(csv.DictReader(f))
    # The summary holds the last PBT heartbeat the head read: the lineage has at least its
    # exploits (at load 10 the head's last reading was 8 exploits behind the file).
    assert len(rows) >= pbt["exploits"], (rows, pbt)
    for row in rows:
        assert {row["member"], row["source"]} == {"member_0", "member_1"}, row
        assert float(row["source_fitness"]) >= float(row["member_fitness"]), row
        new = json.loads(row["new_hyperparameters"])
        assert 1e-5 <= new["learner.lr"] <= 1e-2, row
    for i, b in enumerate(learners):  # each learner applied the newest seq sent to it,
        # or the one before where the newest was still on its way at the stop
        seqs = sorted(int(r["seq"]) for r in rows if r["member"] == f"member_{i}")
        assert b["pbt_seq"] in ([0, *seqs][-2:]), (b, rows)
    # Each member's fitness and hyperparameters in the training figures (TensorBoard).
    tags = tensorboard_tags(summary["dir"])
    assert {"pbt/member_0_lr", "pbt/member_1_lr", "pbt/exploits"} <= tags, sorted(tags)
