"""AlphaZero for real: `zrl run configs/tictactoe_alphazero.yaml`, every role its own process
(broker, one self-play actor, params, the learner, the evaluator), to the config's stop rule:
perfect play, the greedy policy's exploitability 0 from both seats, confirmed by a second
evaluation of the same weights. Bounded by env steps (moves of self-play) with a generous
wall-clock guard. The untrained weights lose most games to alpha-beta at depth 4."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest

from zrl.testing.processes import GUARD_S, run_zrl

ENV_STEPS = 200_000
"""The bound on self-play moves. Three quiet runs reached perfect play at 50,218, 50,720 and
66,192 moves (35-45 s on a quiet 2-core machine)."""


def eval_rows(run_dir: Path) -> list[dict[str, float]]:
    with open(run_dir / "eval.csv", newline="") as f:
        return [
            {k: float(v) for k, v in row.items() if v not in ("", None)}
            for row in csv.DictReader(f)
        ]


@pytest.mark.slow
def test_tictactoe_alphazero_learns_perfect_play_through_the_real_roles(tmp_path: Path) -> None:
    started = time.monotonic()
    summary = run_zrl(
        tmp_path,
        "tictactoe_alphazero.yaml",
        f"stop.env_steps={ENV_STEPS}",
        wall_time=GUARD_S,  # a guard: the run stops at its target or its env steps
        beats=None,
    )
    took = time.monotonic() - started
    rows = eval_rows(summary["dir"])
    last = rows[-1]
    assert summary["stop_reason"] == "exploitability", (
        summary["stop_reason"],
        [(r["env_steps"], r["exploitability"], r.get("losing_lines")) for r in rows],
    )
    # The untrained weights lose most games against alpha-beta at depth 4.
    assert rows[0]["alphabeta4_loss_rate"] > 0.5, rows[0]
    # The confirming evaluation: no best response beats the greedy policy from either seat,
    # and neither alpha-beta depth wins a game against it or against the search player.
    assert last["episodes"] == 100 and last["exploitability"] == 0.0, last
    assert last["exploitability_first"] == 0.0 and last["exploitability_second"] == 0.0, last
    for opponent in ("alphabeta2", "alphabeta4"):
        for seat in ("first", "second"):
            assert last[f"{opponent}_{seat}_loss_rate"] == 0.0, last
            assert last[f"search_{opponent}_{seat}_loss_rate"] == 0.0, last
    assert "search_exploitability" in last
    print(
        f"tictactoe_alphazero: perfect play at {summary['env_steps_to_target']} env steps, "
        f"{summary['seconds_to_target']} s of run, {took:.0f} s with start and teardown"
    )
