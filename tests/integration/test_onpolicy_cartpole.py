"""IMPALA, APPO, A3C and PPO for real: `zrl run` on CartPole with every role its own process."""

from __future__ import annotations

import re
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
    log = (summary["dir"] / "logs" / "learner-0.log").read_text()
    closing = [line for line in log.splitlines() if "mixed-version rounds" in line]
    assert closing, log[-2000:]
    assert "(sync)" in closing[-1]
    assert "mixed-version rounds 0," in closing[-1], closing[-1]
    rounds = int(re.search(r": (\d+) rounds", closing[-1]).group(1))  # type: ignore[union-attr]
    assert rounds >= 3, closing[-1]  # every round after the first follows a weight change
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
    summary = run_zrl(
        tmp_path, "cartpole_ppo.yaml", "ppo.mode=async", "roles.learners=2", STOP, wall_time=45
    )
    logs = summary["dir"] / "logs"
    leader = [ln for ln in (logs / "learner-0.log").read_text().splitlines() if "rounds (" in ln]
    follower = [ln for ln in (logs / "learner-1.log").read_text().splitlines() if "rounds (" in ln]
    assert leader and follower
    assert "(async)" in leader[-1] and "allreduce timeouts 0" in leader[-1], leader[-1]
    # Averaged gradients applied by both: the follower's weights equal the leader's.
    assert "weight drift 0," in follower[-1], follower[-1]


@pytest.mark.slow
def test_impala_learns_through_the_fifo_queue(tmp_path: Path) -> None:
    # APPO shares this wiring and its learner base (zrl.algos.unrolls); its loss is tested
    # against a reference loop, and tests/integration/test_atari.py trains it on Pong frames.
    summary = run_zrl(tmp_path, "cartpole_impala.yaml")  # to 475: "> 50 updates" needs it
    log = (summary["dir"] / "logs" / "learner-0.log").read_text()
    closing = [line for line in log.splitlines() if "stale unrolls dropped" in line]
    assert closing, log[-2000:]
    assert summary["updates"] > 50, summary


@pytest.mark.slow
def test_a3c_workers_gradients_applied_by_params(tmp_path: Path) -> None:
    summary = run_zrl(tmp_path, "cartpole_a3c.yaml", STOP, wall_time=60)
    log = (summary["dir"] / "logs" / "params-0.log").read_text()
    closing = [line for line in log.splitlines() if "gradients," in line and "updates from" in line]
    assert closing, log[-2000:]
    updates = int(re.search(r": (\d+) updates", closing[-1]).group(1))  # type: ignore[union-attr]
    assert updates > 100, closing[-1]
