"""configs/dmc_cartpole_balance_ppo.yaml for real: `zrl run` on the DeepMind Control Suite's
cartpole-balance through shimmy, every role its own process, for a fixed number of env steps,
then `zrl eval` of the saved policy. Skipped, with the reason, where dm-control is missing or
cannot load its physics with the installed mujoco.

What is checked is the env's path through the roles (actors, the learner's PPO rounds, the
evaluator, model.pt, `zrl eval`), bounded by env steps. How fast the config learns (900 in
60-85 s on 2 idle cores) is measured in docs/envs.md, not here: Gaussian PPO's learning is
the suite's business on Pendulum (tests/integration/test_gaussian.py), and learning
cartpole-balance cost this suite 150 s on its critical path."""

from __future__ import annotations

from pathlib import Path

import pytest

from zrl.config.sections import EnvConfig
from zrl.envs.base import EnvError
from zrl.envs.dmcontrol import DM_CONTROL_INSTALL, make_dm_control_env
from zrl.testing.processes import GUARD_S, run_zrl, zrl_eval

ROUNDS = 2
"""PPO rounds of 8 envs x 256 steps (the config's), each 10 epochs of 8 minibatches."""
ENV_STEPS = ROUNDS * 8 * 256


@pytest.mark.slow
def test_dm_control_cartpole_balance_runs_through_the_roles(tmp_path: Path) -> None:
    pytest.importorskip("shimmy", reason=f"dm_control needs its extra: {DM_CONTROL_INSTALL}")
    pytest.importorskip("dm_control", reason=f"dm_control needs its extra: {DM_CONTROL_INSTALL}")
    try:
        make_dm_control_env(EnvConfig(id="dm_control/cartpole-balance-v0")).close()
    except EnvError as exc:
        pytest.skip(str(exc))
    summary = run_zrl(
        tmp_path,
        "dmc_cartpole_balance_ppo.yaml",
        "evaluator.episodes=1",
        "evaluator.interval=5",
        "stop.eval_return=null",
        f"stop.env_steps={ENV_STEPS}",
        wall_time=GUARD_S,  # a guard: the run stops at its env steps
        beats=0.0,  # returns are in [0, 1000]: any evaluation at all scores above 0
    )
    assert summary["stop_reason"] == "env_steps", summary["output"][-3000:]
    assert summary["env_steps"] >= ENV_STEPS, summary
    assert summary["updates"] >= ROUNDS * 10 * 8 - 80, summary  # the last round may be cut
    assert summary["evaluations"] >= 1, summary
    assert summary["restarts"] == {} and summary["error"] is None, summary
    mean, printed = zrl_eval(summary["dir"], 1)
    assert 0.0 < mean <= 1000.0, printed
