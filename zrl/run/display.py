"""The live status of ``zrl run``: a rich panel on a terminal, plain lines in a log."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from zrl.run.stop_rule import bounds_text

if TYPE_CHECKING:
    from zrl.run.supervisor import Supervisor

STATE_COLORS = {
    "alive": "green",
    "dead": "red",
    "stopped": "yellow",
    "starting": "cyan",
    "stalled": "magenta",
}


def shown_state(row: dict[str, Any]) -> str:
    """A registry row's state as the tables show it: ``stalled`` for a live role whose loop
    has not turned for ``broker.stall_after`` (it heartbeats: alive, not dead), else its
    state."""
    state = str(row.get("state", "?"))
    stalled = row.get("stalled_s")
    if state in ("starting", "alive") and isinstance(stalled, int | float):
        return "stalled"
    return state


ROLE_COUNTS = ("restarts", "in", "out", "dropped", "gaps", "rss MB")
"""The columns of a role's counters, in ``zrl status`` and the run's display (after its
state and heartbeat age)."""


def colored_state(row: dict[str, Any]) -> str:
    """The row's shown state in its color (Rich markup)."""
    state = shown_state(row)
    return f"[{STATE_COLORS.get(state, 'white')}]{state}[/]"


def role_counts(row: dict[str, Any], count: Callable[[Any], str] = str) -> list[str]:
    """A registry row's :data:`ROLE_COUNTS`, each counter written by ``count``."""
    rss = row.get("info", {}).get("rss_mb")
    counters = (
        row["restarts"],
        row["msgs_in"],
        row["msgs_out"],
        row["dropped"],
        row.get("gaps", 0),
    )
    return [*map(count, counters), f"{rss:.0f}" if isinstance(rss, int | float) else "-"]


def stall_text(row: dict[str, Any]) -> str:
    """Since when a stalled role's loop has not turned: ``loop stalled 34 s (since
    12:03:04, setting up)``; "" for any other row."""
    if shown_state(row) != "stalled":
        return ""
    seconds = float(row["stalled_s"])
    since = time.strftime("%H:%M:%S", time.localtime(time.time() - seconds))
    doing = ", setting up" if row.get("state") == "starting" else ""
    return f"loop stalled {seconds:.0f} s (since {since}{doing})"


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _rate(value: float) -> str:
    """A rate per second: whole numbers from 10 up, one decimal below (a CNN learner on a CPU
    makes well under 10 updates a second)."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def eval_text(row: dict[str, Any]) -> str:
    """The last evaluation's return with the weights version it played and its age, ``-``
    before the first: ``21.5 (v40, 12 s ago)``."""
    if row.get("eval_return") is None:
        return "-"
    age = row.get("eval_age_s")
    when = f", {age:.0f} s ago" if isinstance(age, int | float) else ""
    return f"{_fmt(row['eval_return'])} (v{row.get('eval_version')}{when})"


def make_console(**kwargs: Any) -> Console:
    """A rich console; off a terminal (a log file, a pipe) one that never wraps: a record
    split over two lines cannot be grepped, and a wrapped command cannot be pasted."""
    console = Console(**kwargs)
    if console.is_terminal:
        return console
    return Console(width=100_000, **kwargs)  # tables keep their natural width


def league_line(info: dict[str, Any]) -> str:
    """A league role's population and Elo ratings, from its heartbeat info ("" for others)."""
    elo = info.get("elo_top")
    if not isinstance(elo, dict):
        return ""
    ratings = ", ".join(f"{name} {rating:.0f}" for name, rating in elo.items())
    line = (
        f"{info.get('games', 0)} games, {info.get('snapshots', 0)} snapshots, main's win rate "
        f"over them {info.get('main_win_rate', 0):.2f}; Elo: {ratings}"
    )
    players = info.get("players")
    if isinstance(players, dict):  # a league with exploiters: each learning player's figures
        line += "; " + ", ".join(
            f"{name} win {p.get('win_rate', 0):.2f} Elo {p.get('elo', 0):.0f} "
            f"({p.get('snapshots', 0)} snapshots, {p.get('resets', 0)} resets)"
            for name, p in players.items()
            if isinstance(p, dict) and name != "main"
        )
    return line


def result_lines(summary: dict[str, Any]) -> list[str]:
    """The final lines of a turn-based game's run, from summary.json: the last evaluation
    against each reference opponent, the exploitability (last and best) and the league's
    record (main's Elo, its win rate against each pool member, the snapshots)."""
    lines = []
    rates = summary.get("reference_opponents")
    if isinstance(rates, dict) and rates:
        lines.append(
            "last evaluation, win/draw/loss: "
            + ", ".join(
                f"{name} {r.get('win', 0):.2f}/{r.get('draw', 0):.2f}/{r.get('loss', 0):.2f}"
                for name, r in rates.items()
            )
        )
    found = summary.get("exploitability")
    if isinstance(found, dict):
        last = found.get("last", {})
        lines.append(
            f"exploitability {last.get('exploitability', 0):g} (v{last.get('weights_version')}: "
            f"{_OUTCOME.get(last.get('exploitability_first'), '?')} moving first, "
            f"{_OUTCOME.get(last.get('exploitability_second'), '?')} moving second, "
            f"{last.get('losing_lines', 0):.0f} losing lines), best {found.get('best', 0):g} "
            f"(v{found.get('best_weights_version')})"
        )
    league = summary.get("league")
    if isinstance(league, dict):
        vs = list((league.get("main_vs") or {}).items())
        shown = ", ".join(f"{k} {v:.2f}" for k, v in vs[:FINAL_MEMBERS])
        more = (
            f" (+{len(vs) - FINAL_MEMBERS} more in summary.json)" if len(vs) > FINAL_MEMBERS else ""
        )
        lines.append(
            f"league: {league.get('games', 0):,.0f} games, {league.get('snapshots', 0):.0f} "
            f"snapshots; main's Elo {league.get('elo_main', 0):.0f}, win rate over its "
            f"snapshots {league.get('main_win_rate', 0):.2f}"
            + (f"; against {shown}{more}" if vs else "")
        )
    return lines


FINAL_MEMBERS = 6
"""Pool members whose win rate the final lines name (the fixed players, then the newest)."""
_OUTCOME = {1: "wins", 0: "draws", -1: "loses"}
"""The policy's result under a best response (1.0 finds 1 too)."""


def inference_line(info: dict[str, Any]) -> str:
    """An inference role's forwards and what it refused, from its heartbeat info ("" for
    others)."""
    forwards, requests = info.get("forwards"), info.get("requests")
    if not isinstance(forwards, int) or not isinstance(requests, int) or "rows" not in info:
        return ""
    per = f" ({requests / forwards:.1f} per forward)" if forwards else ""
    return (
        f"on {info.get('device', '?')}: {forwards:,} forwards of {requests:,} requests{per}, "
        f"{info.get('rows', 0):,} rows, {info.get('forward_s', 0)} s forwarding, "
        f"{info.get('requests_refused', 0)} refused, weights v{info.get('weights_version', 0)}"
    )


def pbt_line(info: dict[str, Any]) -> str:
    """A pbt role's exploits and each member's hyperparameters and fitness, from its heartbeat
    info ("" for others): ``2 exploits; member_0 lr=0.001 fitness=41.2, member_1 ...``."""
    members, exploits = info.get("members"), info.get("exploits")
    if not isinstance(members, dict) or not isinstance(exploits, int):
        return ""
    parts = []
    for name, figures in list(members.items())[:16]:
        if isinstance(figures, dict):
            shown = " ".join(f"{k}={v}" for k, v in list(figures.items())[:4])
            parts.append(f"{str(name)[:20]} {shown}")
    return f"{exploits} exploits; " + ", ".join(parts)


def role_note(info: dict[str, Any]) -> str:
    """Why a role is waiting or what went wrong, from its heartbeat info (the league: its
    Elo ratings)."""
    if info.get("sampling_blocked"):
        return str(info["sampling_blocked"])
    if "waiting_for_batches_s" in info:
        return f"waiting for batches {info['waiting_for_batches_s']}s"
    if info.get("env_errors"):
        return f"{info['env_errors']} env errors (reset and went on)"
    if info.get("blocked_s"):
        return f"waiting {info['blocked_s']}s for replay to take trajectories"
    return league_line(info) or inference_line(info)


class StatusDisplay:
    def __init__(self, sup: Supervisor, enabled: bool = True) -> None:
        self.sup = sup
        self.enabled = enabled
        self.console = make_console(stderr=False)
        self.live: Live | None = None
        self.row: dict[str, Any] = {}
        self._next_plain = 0.0
        self._printed: dict[str, Any] | None = None
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[label]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        stop = sup.cfg.stop
        self.tasks: dict[str, Any] = {}
        if stop.eval_return is not None:
            self.tasks["eval"] = self.progress.add_task(
                "eval return", total=stop.eval_return, label=""
            )
        if stop.env_steps is not None:
            self.tasks["steps"] = self.progress.add_task(
                "env steps", total=stop.env_steps, label=""
            )
        if stop.updates is not None:
            self.tasks["updates"] = self.progress.add_task("updates", total=stop.updates, label="")
        if stop.wall_time is not None:
            self.tasks["time"] = self.progress.add_task("wall time", total=stop.wall_time, label="")

    def message(self, text: str) -> None:
        if self.enabled:
            # Verbatim: commands, paths and log lines may hold [brackets] rich would eat.
            self.console.print(text, markup=False, highlight=False)

    def start(self) -> None:
        if self.enabled and self.console.is_terminal:
            self.live = Live(
                self._render(), console=self.console, refresh_per_second=2, transient=False
            )
            self.live.start()

    def update(self, row: dict[str, Any]) -> None:
        self.row = row
        stop = self.sup.cfg.stop
        best = max((e["mean"] for e in self.sup.agg.evals), default=0.0)
        if "eval" in self.tasks:
            last = row.get("eval_return")
            # The bar shows what the stop rule compares with the target, not the best eval.
            recent = [e["mean"] for e in self.sup.agg.evals][-stop.eval_window :]
            mean = sum(recent) / len(recent) if recent else 0.0
            self.progress.update(
                self.tasks["eval"],
                completed=max(mean, 0.0),
                label=f"mean of last {len(recent)} {mean:.1f} / {stop.eval_return:.0f} "
                f"(best {best:.1f}, last {_fmt(last)})",
            )
        if "steps" in self.tasks:
            self.progress.update(
                self.tasks["steps"],
                completed=row["env_steps"],
                label=f"{row['env_steps']:,} / {stop.env_steps:,}",
            )
        if "updates" in self.tasks:
            self.progress.update(
                self.tasks["updates"],
                completed=row["updates"],
                label=f"{row['updates']:,} / {stop.updates:,}",
            )
        if "time" in self.tasks:
            self.progress.update(
                self.tasks["time"],
                completed=row["time"],
                label=f"{row['time']:.0f} / {stop.wall_time:.0f} s",
            )
        if self.live is not None:
            self.live.update(self._render())
        elif self.enabled and time.monotonic() >= self._next_plain:
            self._next_plain = time.monotonic() + 5.0
            self._print_plain(row)

    def _print_plain(self, row: dict[str, Any]) -> None:
        """``row`` as one status line (a console that is no terminal: a log, a pipe)."""
        self._printed = row
        # Out of the roles the run placed: one that never came counts as not alive.
        planned = self.sup.roster.planned
        ours = [r for r in self.sup.monitor.status_rows if r.get("id") in planned]
        alive = sum(1 for r in ours if r["state"] == "alive")
        stalled = [f"{r['id']} {r['stalled_s']:.0f} s" for r in ours if shown_state(r) == "stalled"]
        self.console.print(
            f"[{row['time']:6.0f}s] steps {row['env_steps']:,} "
            f"({row['env_steps_per_s']:,.0f}/s) "
            f"updates {row['updates']:,} ({_rate(row['updates_per_s'])}/s) "
            f"trained {_rate(row.get('samples_trained_per_s', 0.0))}/s "
            f"replay {row['replay_size']:,} "
            f"spi {row['samples_per_insert']} weights v{row['weights_version']} "
            f"lag {row['max_version_lag']} eval {eval_text(row)} "
            f"roles alive {alive}/{len(planned)}"
            + (f", stalled: {', '.join(stalled)}" if stalled else ""),
            highlight=False,
        )

    def _render(self) -> Group:
        r = self.row
        figures = Table.grid(padding=(0, 2))
        for _ in range(4):
            figures.add_column()
        if r:
            figures.add_row(
                "env steps/s", _fmt(r["env_steps_per_s"], 0), "env steps", _fmt(r["env_steps"])
            )
            figures.add_row("updates/s", _rate(r["updates_per_s"]), "updates", _fmt(r["updates"]))
            figures.add_row(
                "samples trained/s",
                _rate(r.get("samples_trained_per_s", 0.0)),
                "samples trained",
                _fmt(r.get("samples_trained")),
            )
            figures.add_row(
                "replay size",
                _fmt(r["replay_size"]),
                "samples/insert",
                _fmt(r["samples_per_insert"], 2),
            )
            figures.add_row(
                "weights",
                f"v{r['weights_version']}",
                "actor version lag",
                _fmt(r["max_version_lag"]),
            )
            figures.add_row("eval return", eval_text(r), "run dir", str(self.sup.run_dir))
        roles = Table(box=None, header_style="bold")
        for col in ("id", "host", "pid", "state", "heartbeat", *ROLE_COUNTS, "note"):
            roles.add_column(col)
        for row in self.sup.monitor.status_rows:
            info = row.get("info", {})
            roles.add_row(
                row["id"],
                row.get("address") or row["host"],
                str(row["pid"]),
                colored_state(row),
                f"{row['age']:.1f}s",
                *role_counts(row, _fmt),
                (stall_text(row) or role_note(info))[:100],
            )
        return Group(self.progress, figures, roles)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        elif self.enabled and self.row and self.row is not self._printed:
            # The last figures, not those of up to 5 s before: a short run's log would
            # otherwise end on "steps 0 updates 0".
            self._print_plain(self.row)

    def final(self, summary: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if summary["reached_target"]:
            targets = " and ".join(
                t
                for t in (
                    f"eval return {summary['target_return']}"
                    if summary.get("target_return") is not None
                    else "",
                    f"exploitability {summary['target_exploitability']:g}"
                    if summary.get("target_exploitability") is not None
                    else "",
                    bounds_text(summary.get("target_bounds") or {}),
                )
                if t
            )
            self.console.print(
                f"[green]reached {targets} in "
                f"{summary['seconds_to_target']:.1f} s and "
                f"{summary['env_steps_to_target']:,} env steps[/]"
            )
        else:
            self.console.print(f"[yellow]stopped: {summary['stop_reason']}[/]")
        if summary.get("error"):
            self.console.print(summary["error"], style="red", markup=False, highlight=False)
            for line in summary.get("error_log_tail") or []:
                self.message(f"  | {line}")
        if summary.get("confirming_eval_return") is not None:
            self.message(
                f"stop rule met with {summary['confirming_eval_return']}: {summary['stop_rule']}"
            )
        first = summary.get("seconds_to_first_env_step")
        self.console.print(
            f"best eval return {_fmt(summary['best_eval_return'])}, last "
            f"{_fmt(summary.get('last_eval_return'))}, env steps {summary['env_steps']:,}, "
            f"wall time {summary['wall_time']:.1f} s, first env step after "
            f"{_fmt(first) + ' s' if first is not None else '-'}",
            highlight=False,
        )
        if summary.get("segment", 1) > 1:  # a --resume: summary.json keeps the earlier ones
            self.message(
                f"segment {summary['segment']} of this run: {summary['total_wall_time']:.1f} s "
                f"of wall time in all, resumed at {summary['resumed_at_env_steps']:,} env steps"
            )
        for line in result_lines(summary):  # a league's, a turn-based game's evaluation
            self.message(line)
        for cut in summary.get("evaluations_cut_short") or []:
            self.message(
                f"{cut['evaluator']} was evaluating weights v{cut['weights_version']} at the "
                f"stop ({_fmt(cut['running_for_s'])} s in): not recorded"
            )
        if summary.get("model_note"):  # which weights model.pt holds, and why
            self.message(summary["model_note"])
        self.console.print(f"run directory: {summary['run_dir']}")
