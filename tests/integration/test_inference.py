"""The inference role for real: `zrl run` of APPO on CartPole with the actors' forwards run by
an inference role process, learning as it does without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from zrl.testing.processes import GUARD_S, run_zrl


@pytest.mark.slow
def test_appo_learns_with_its_actors_acting_through_an_inference_role(tmp_path: Path) -> None:
    # Bounded by env steps (it met 200 at 4,906 in a CI run); the wall time is a guard.
    summary = run_zrl(
        tmp_path,
        "cartpole_appo.yaml",
        "roles.inference=1",
        "stop.eval_return=200",
        "stop.env_steps=60000",
        wall_time=GUARD_S,
    )
    beats = summary["heartbeats"]
    server = beats["inference-0"]
    assert server["forwards"] > 0 and server["requests_refused"] == 0, server
    assert server["weights_version"] > 0, server  # it followed the learner's weights
    for actor in ("actor-0", "actor-1"):
        info = beats[actor]
        assert info["inference_requests"] > 0, info
        assert info["inference_replies_refused"] == 0, info
    # Every request was answered by one forward or joined with another actor's (the roles'
    # last heartbeats are not taken at one moment, so the counts are not compared across them).
    assert 0 < server["forwards"] <= server["requests"], server
    # Only at the stop: an actor that left with its one request unanswered.
    assert server["replies_dropped"] <= 2, server
