"""AlphaZero for real: `zrl run configs/tictactoe_alphazero.yaml`, every role its own process
(broker, one self-play actor, params, the learner, the evaluator), to the config's stop rule:
the greedy policy's exploitability 0 (no seat can be beaten by a best response), confirmed
on a fresh evaluation. The search player's figures come with every evaluation."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest

from zrl.testing.processes import run_zrl

WALL_TIME = 150
"""The guard: the run stops at the target well before (docs/alphazero.md has the times)."""


def eval_rows(run_dir: Path) -> list[dict[str, float]]:
    with open(run_dir / "eval.csv", newline="") as f:
        return [
            {k: float(v) for k, v in row.items() if v not in ("", None, "True", "False")}
            for row in csv.DictReader(f)
        ]


@pytest.mark.slow
def test_tictactoe_alphazero_reaches_perfect_play(tmp_path: Path) -> None:
    started = time.monotonic()
    summary = run_zrl(tmp_path, "tictactoe_alphazero.yaml", wall_time=WALL_TIME, beats=0.5)
    took = time.monotonic() - started
    assert summary["stop_reason"] == "exploitability", (summary, summary["output"][-3000:])
    rows = eval_rows(summary["dir"])
    last = rows[-1]
    # The confirming evaluation: no losing line from either seat, for the greedy policy...
    assert last["exploitability"] == 0 and last["losing_lines"] == 0, last
    # ...and the search player, evaluated beside it against every opponent from both seats.
    for opponent in ("random", "alphabeta2", "alphabeta4"):
        for seat in ("first", "second"):
            assert f"search_{opponent}_{seat}_loss_rate" in last, sorted(last)
            assert f"{opponent}_{seat}_loss_rate" in last
        assert last[f"{opponent}_loss_rate"] == 0, last  # unexploitable: it never loses
    assert "search_exploitability" in last
    print(
        f"tictactoe_alphazero: target at {summary['seconds_to_target']} s of the run, "
        f"{summary['wall_time']} s run, {took:.0f} s with start and teardown"
    )
