"""zrl.cli.common: the head's exit code from its summary."""

from __future__ import annotations

import pytest

from zrl.cli.common import exit_code


@pytest.mark.parametrize(
    ("summary", "code"),
    [
        ({"stop_reason": "eval_return", "failed": False, "signal": None}, 0),
        ({"stop_reason": "wall_time", "failed": False, "signal": None}, 0),
        ({"stop_reason": "interrupted", "failed": False, "signal": "SIGINT"}, 130),
        ({"stop_reason": "interrupted", "failed": False, "signal": "SIGTERM"}, 143),
        # Ctrl-C raised inside the loop before a handler saw it: still Ctrl-C's code.
        ({"stop_reason": "interrupted", "failed": False, "signal": None}, 130),
        # A failed run is a failure whatever stopped it.
        ({"stop_reason": "interrupted", "failed": True, "signal": "SIGINT"}, 1),
        ({"stop_reason": "error", "failed": True, "signal": None}, 1),
    ],
)
def test_exit_code_follows_the_summary(summary: dict[str, object], code: int) -> None:
    assert exit_code(summary) == code
