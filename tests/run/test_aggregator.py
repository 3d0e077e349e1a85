"""The head's wire figures: bytes per env step of each experience path (summary.json's
``wire``). The other figures of ``Aggregator`` are tested beside the supervisor."""

from __future__ import annotations

from zrl.run.aggregator import Aggregator


def test_wire_divides_each_paths_bytes_by_the_env_steps_across_restarts():
    agg = Aggregator()
    assert agg.wire() == {}  # nothing sent yet: no path shown
    agg.on_metrics(
        {"id": "actor-0", "role": "actor", "env_steps": 100, "wire_bytes_experience": 3000}
    )
    agg.on_metrics(
        {"id": "actor-1", "role": "actor", "env_steps": 300, "wire_bytes_experience": 9000}
    )
    agg.on_metrics({"id": "replay-0", "role": "replay", "wire_bytes_batches": 6000})
    assert agg.wire() == {
        "trajectories": {"bytes": 12000, "env_steps": 400, "bytes_per_env_step": 30.0},
        "batches": {"bytes": 6000, "env_steps": 400, "bytes_per_env_step": 15.0},
    }
    # actor-0 restarted: its counters start again from 0, and the totals carry on.
    agg.on_metrics(
        {"id": "actor-0", "role": "actor", "env_steps": 50, "wire_bytes_experience": 2000}
    )
    assert agg.wire()["trajectories"] == {
        "bytes": 14000,
        "env_steps": 450,
        "bytes_per_env_step": 31.1,
    }


def test_wire_names_the_path_of_each_algorithm_and_ignores_malformed_counts():
    agg = Aggregator()
    agg.on_metrics({"id": "actor-0", "role": "actor", "env_steps": 8, "wire_bytes_rollouts": 100})
    agg.on_metrics({"id": "actor-1", "role": "actor", "env_steps": 8, "wire_bytes_gradients": 60})
    agg.on_metrics({"id": "actor-2", "role": "actor", "wire_bytes_experience": "lots"})
    agg.on_metrics({"id": "learner-0", "role": "learner", "wire_bytes_batches": 10**9})
    assert agg.wire() == {
        "rollouts": {"bytes": 100, "env_steps": 16, "bytes_per_env_step": 6.2},
        "gradients": {"bytes": 60, "env_steps": 16, "bytes_per_env_step": 3.8},
    }


def test_an_evaluations_exploitability_is_kept_only_within_its_range():
    agg = Aggregator()
    row = agg.on_eval(
        {
            "mean": 0.9,
            "exploitability": 0.5,
            "exploitability_first": -1,
            "exploitability_second": 0,
            "losing_lines": 12,
        },
        1.0,
    )
    assert (row["exploitability"], row["exploitability_first"]) == (0.5, -1)
    assert (row["exploitability_second"], row["losing_lines"]) == (0, 12)
    forged = agg.on_eval(
        {
            "mean": 0.9,
            "exploitability": 7.0,
            "exploitability_first": "-1",
            "exploitability_second": -3,
            "losing_lines": 1e12,
        },
        2.0,
    )
    assert not {"exploitability", "exploitability_first", "losing_lines"} & set(forged)
    assert "exploitability_second" not in forged


def test_the_row_has_samples_trained_per_second_and_the_last_evaluations_version_and_age():
    agg = Aggregator()
    agg.on_metrics({"id": "learner-0", "role": "learner", "updates": 0, "samples_trained": 0})
    first = agg.row(0.0)
    assert first["samples_trained_per_s"] == 0.0
    assert first["eval_return"] is None and first["eval_version"] is None
    assert first["eval_age_s"] is None
    for t in range(1, 4):
        agg.on_metrics(
            {"id": "learner-0", "role": "learner", "updates": 2 * t, "samples_trained": 512 * t}
        )
        row = agg.row(float(t))
    assert row["samples_trained"] == 1536
    assert row["samples_trained_per_s"] == 512.0
    agg.on_eval({"mean": 21.5, "std": 1.0, "weights_version": 40, "episodes": 10}, 2.5)
    row = agg.row(14.0)
    assert (row["eval_return"], row["eval_version"], row["eval_age_s"]) == (21.5, 40, 11.5)
