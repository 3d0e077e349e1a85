"""IMPALA, APPO, A3C and PPO for real: `zrl run` on CartPole with every role its own process."""

from __future__ import annotations

from pathlib import Path

import pytest

from zrl.testing.processes import run_zrl, tensorboard_tags

# The PPO and A3C runs stop at the first evaluation of 200 (the configs' 475 takes twice as
# long): well above run_zrl's bar of five times a random policy, and these tests check wiring.
STOP = "stop.eval_return=200"


@pytest.mark.slow
def test_ppo_sync_rounds_never_mix_versions(tmp_path: Path) -> None:
    # 12 s, not a stop at the first evaluation of 200: that came after one second of
    # training, before the learner's first report of its training figures.
    summary = run_zrl(tmp_path, "cartpole_ppo.yaml", "stop.eval_return=null", wall_time=12)
    learner = summary["heartbeats"]["learner-0"]
    assert learner["mixed_rounds"] == 0, learner
    assert "group_rank" not in learner, learner  # one learner: no group to average with
    assert learner["rounds"] >= 3, learner  # every round after the first follows a weight change
    # PPO's training figures, as docs/running.md's table lists them, in TensorBoard.
    ppo_tags = {
        "learner/loss",
        "learner/grad_norm",
        "learner/update_ms",
        "learner/lr",
        "learner/policy_loss",
        "learner/value_loss",
        "learner/entropy",
        "learner/approx_kl",
        "learner/clip_fraction",
        "learner/round_s",
        "learner/policy_lag",
        "learner/policy_lag_max",
        "actor/episode_return",
        "actor/episode_length",
        "eval/return_mean",
    }
    tb = tensorboard_tags(summary["dir"])
    assert ppo_tags <= tb, sorted(ppo_tags - tb)


@pytest.mark.slow
def test_ppo_async_and_dd_ppo_learners_stay_in_lockstep(tmp_path: Path) -> None:
    # A fixed 15 s, not a stop at the first evaluation of 200: the initial weights' greedy
    # policy may already reach it, before a round was trained.
    summary = run_zrl(
        tmp_path,
        "cartpole_ppo.yaml",
        "ppo.mode=async",
        "roles.learners=2",
        "stop.eval_return=null",
        wall_time=15,
    )
    leader, follower = summary["heartbeats"]["learner-0"], summary["heartbeats"]["learner-1"]
    assert leader["rounds"] > 1 and follower["rounds"] > 1, (leader, follower)
    # One torch.distributed group (gloo), its rendezvous through the broker (learner 0's store).
    assert (leader["group_rank"], follower["group_rank"]) == (0, 1), (leader, follower)
    assert leader["group_size"] == follower["group_size"] == 2, (leader, follower)
    for rank, name in enumerate(("learner-0", "learner-1")):
        log = (Path(summary["dir"]) / "logs" / f"{name}.log").read_text()
        assert f"learner group of 2 formed (gloo, rank {rank})" in log, log[-2000:]
    # Averaged gradients applied by both: the follower's weights equal the leader's.
    assert follower["weight_drift"] == 0, follower


@pytest.mark.slow
def test_impala_learns_through_the_fifo_queue(tmp_path: Path) -> None:
    # APPO shares this wiring and its learner base (zrl.algos.unrolls); its loss is tested
    # against a reference loop, and tests/integration/test_atari.py trains it on Pong frames.
    summary = run_zrl(tmp_path, "cartpole_impala.yaml")  # to 475: "> 50 updates" needs it
    learner = summary["heartbeats"]["learner-0"]
    assert learner["trained_unrolls"] > 0 and learner["stale_unrolls"] >= 0, learner
    assert summary["updates"] > 50, summary


@pytest.mark.slow
def test_a3c_workers_gradients_applied_by_params(tmp_path: Path) -> None:
    summary = run_zrl(tmp_path, "cartpole_a3c.yaml", STOP, wall_time=60)
    params = summary["heartbeats"]["params-0"]  # the server applying the workers' gradients
    assert params["updates"] > 100 and params["applied_gradients"] >= params["updates"], params
