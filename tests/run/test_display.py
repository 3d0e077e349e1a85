"""What `zrl run` prints off a terminal (a log file, a pipe): every record on one line."""

from __future__ import annotations

import io
import re
from pathlib import Path

from zrl.config.experiment import ExperimentConfig
from zrl.run.display import StatusDisplay, eval_text, make_console
from zrl.run.supervisor import Supervisor


def display_into(tmp_path: Path) -> tuple[StatusDisplay, io.StringIO]:
    sup = Supervisor(ExperimentConfig(), run_dir=tmp_path / "run", show_status=False)
    display = StatusDisplay(sup)
    out = io.StringIO()
    display.console = make_console(file=out)  # a StringIO is no terminal
    return display, out


def test_off_a_terminal_a_long_command_is_printed_verbatim_on_one_line(tmp_path: Path):
    display, out = display_into(tmp_path)
    assert not display.console.is_terminal
    command = (
        "  zrl start actor --broker tcp://10.0.0.1:5555 --index 3 --connect-timeout 30 "
        + "--set a.b=[1, 2] " * 12
        + "--keys /home/someone/a/rather/long/path/to/the/keys/of/this/run [bold]x[/bold]"
    )
    display.message(command)
    assert out.getvalue() == command + "\n"


def test_the_summary_shows_the_rule_the_first_env_step_and_a_failed_roles_log(tmp_path: Path):
    display, out = display_into(tmp_path)
    summary = {
        "reached_target": False,
        "stop_reason": "wall_time",
        "run_dir": "/runs/x",
        "error": "learner-0 crashed 2 time(s) while starting (last exit code 1)",
        "error_log_tail": ["Traceback (most recent call last):", "RuntimeError: [no] sim"],
        "confirming_eval_return": None,
        "best_eval_return": 500.0,
        "last_eval_return": 190.0,
        "env_steps": 12_345,
        "wall_time": 8.04,
        "seconds_to_first_env_step": 2.31,
        "model_note": "model.pt: the best evaluated weights (v7, eval return 500.00); the run "
        "never met its stop rule",
    }
    display.final(summary)
    lines = out.getvalue().splitlines()
    assert lines[1] == summary["error"]
    assert lines[2:4] == ["  | Traceback (most recent call last):", "  | RuntimeError: [no] sim"]
    assert "best eval return 500.0, last 190.0" in lines[4]
    assert lines[4].endswith("first env step after 2.3 s")
    assert lines[5] == summary["model_note"]  # which weights model.pt holds


def test_the_league_line_names_each_exploiters_win_rate_elo_snapshots_and_resets():
    from zrl.run.display import league_line

    info = {
        "games": 120,
        "snapshots": 3,
        "main_win_rate": 0.61,
        "elo_top": {"main": 1040.2},
        "players": {
            "main": {"win_rate": 0.61, "elo": 1040.2, "snapshots": 1, "resets": 0},
            "main_exploiter_0": {"win_rate": 0.72, "elo": 1012.4, "snapshots": 2, "resets": 2},
        },
    }
    line = league_line(info)
    assert line.startswith("120 games, 3 snapshots, main's win rate over them 0.61; Elo: main 1040")
    assert line.endswith("; main_exploiter_0 win 0.72 Elo 1012 (2 snapshots, 2 resets)")
    del info["players"]  # a league without exploiters: the line as before
    assert league_line(info) == (
        "120 games, 3 snapshots, main's win rate over them 0.61; Elo: main 1040"
    )


def test_the_inference_line_says_how_many_requests_each_forward_joined():
    from zrl.run.display import inference_line, role_note

    info = {
        "device": "cuda:0",
        "requests": 2249,
        "forwards": 1681,
        "rows": 35968,
        "forward_s": 0.384,
        "requests_refused": 0,
        "weights_version": 69,
    }
    line = "on cuda:0: 1,681 forwards of 2,249 requests (1.3 per forward), 35,968 rows, "
    assert inference_line(info) == line + "0.384 s forwarding, 0 refused, weights v69"
    assert role_note(info) == inference_line(info)
    assert inference_line({"env_steps": 5}) == ""


def test_the_final_lines_name_a_few_pool_members_and_say_how_many_more():
    from zrl.run.display import FINAL_MEMBERS, result_lines

    members = {f"main@{k}": 0.5 for k in range(FINAL_MEMBERS + 4)}
    league = {"games": 12345, "snapshots": 10, "elo_main": 1200.4, "main_win_rate": 0.6}
    (line,) = result_lines({"league": {**league, "main_vs": members}})
    assert line.startswith("league: 12,345 games, 10 snapshots; main's Elo 1200")
    assert f"main@{FINAL_MEMBERS - 1} 0.50 (+4 more in summary.json)" in line
    assert f"main@{FINAL_MEMBERS}" not in line
    # A run without a league or a turn-based game has no such lines.
    assert result_lines({"league": None, "exploitability": None}) == []


def test_an_evaluation_is_shown_with_its_weights_version_and_age():
    assert eval_text({"eval_return": None}) == "-"
    row = {"eval_return": -21.0, "eval_version": 0, "eval_age_s": 95.4}
    assert eval_text(row) == "-21.0 (v0, 95 s ago)"


def test_the_pbt_line_shows_each_members_hyperparameters_and_fitness():
    from zrl.run.display import pbt_line

    info = {
        "exploits": 2,
        "members": {"member_0": {"lr": 0.0012, "fitness": 41.2}, "member_1": {"lr": 0.001}},
    }
    assert pbt_line(info) == "2 exploits; member_0 lr=0.0012 fitness=41.2, member_1 lr=0.001"
    assert pbt_line({"members": "x", "exploits": 1}) == "" == pbt_line({})


def test_a_stalled_role_is_shown_stalled_with_since_when_and_a_dead_one_dead(tmp_path: Path):
    from zrl.run.display import shown_state, stall_text

    stalled = {"id": "learner-0", "state": "alive", "stalled_s": 34.2}
    assert shown_state(stalled) == "stalled"
    assert re.fullmatch(r"loop stalled 34 s \(since \d\d:\d\d:\d\d\)", stall_text(stalled))
    setting_up = {"id": "actor-0", "state": "starting", "stalled_s": 70.0}
    assert stall_text(setting_up).endswith(", setting up)")
    for row in ({"state": "alive", "stalled_s": None}, {"state": "alive"}, {"state": "dead"}):
        assert shown_state(row) == row["state"] and stall_text(row) == ""
    # The live table's state and note columns.
    display, out = display_into(tmp_path)
    display.sup.monitor.status_rows = [
        {
            **stalled,
            "host": "h",
            "pid": 7,
            "age": 0.2,
            "restarts": 0,
            "msgs_in": 1,
            "msgs_out": 2,
            "dropped": 0,
            "info": {},
        },
    ]
    display.console.print(display._render())
    line = next(x for x in out.getvalue().splitlines() if "learner-0" in x)
    assert " stalled " in line and "loop stalled 34 s (since " in line


def progress_row(seconds: float, env_steps: int, updates: int) -> dict[str, object]:
    return {
        "time": seconds,
        "env_steps": env_steps,
        "env_steps_per_s": 0.0,
        "updates": updates,
        "updates_per_s": 0.0,
        "replay_size": 0,
        "samples_per_insert": 0,
        "weights_version": 1,
        "max_version_lag": 0,
        "eval_return": None,
    }


def test_off_a_terminal_the_last_figures_are_printed_when_the_run_stops(tmp_path: Path):
    """A run shorter than the status lines' 5 s used to end its log on "steps 0 updates 0"
    (a console that said nothing happened while 400 updates did)."""
    display, out = display_into(tmp_path)
    display.update(progress_row(0.0, 0, 0))
    display.update(progress_row(2.0, 900, 400))  # within 5 s of the first line: not printed
    assert "steps 900" not in out.getvalue()
    display.stop()
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("[     2s] steps 900 (0/s) updates 400 "), last
    display.stop()  # printed once
    assert out.getvalue().count("steps 900") == 1
