"""The supervisor: metrics aggregation, free ports, and restarting a crashed role.

The crash test runs real ``zrl start`` child processes (a tiny CartPole Ape-X set, no
evaluator), kills actor-0 with SIGKILL and waits for the supervisor to restart it. Only
processes of this run are ever signalled (found by PID, or by the run's broker address in
their command line), and the test checks that none is left afterwards.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
import zmq

import zrl
import zrl.run.children
from tests.helpers.run_dir import check_run_dir, eval_supervisor, stop_supervisor
from zrl.config.experiment import ExperimentConfig
from zrl.roles.errors import RoleError
from zrl.roles.registry_client import registry_request
from zrl.run.aggregator import MAX_TRAIN_KEYS, Aggregator
from zrl.run.supervisor import Supervisor
from zrl.testing.probes import wait_for
from zrl.testing.processes import (
    REPO,
    kill_pids,
    note_run,
    output_of,
    run_keys,
    start_zrl,
    zrl_status_json,
)
from zrl.transport import protocol as P
from zrl.transport.endpoints import ephemeral_ports, free_port_range

torch.set_num_threads(1)


# --- Aggregator -----------------------------------------------------------------------------


def actor(i: int, env_steps: int, version: int = 0) -> dict[str, Any]:
    return {"id": f"actor-{i}", "role": "actor", "env_steps": env_steps, "weights_version": version}


def test_aggregator_sums_env_steps_across_actors_and_restarts():
    agg = Aggregator()
    assert agg.row(0.0)["env_steps"] == 0
    agg.on_metrics(actor(0, 100))
    agg.on_metrics(actor(1, 40))
    assert agg.row(1.0)["env_steps"] == 140
    agg.on_metrics(actor(0, 150))
    assert agg.row(2.0)["env_steps"] == 190
    # actor-0 restarted: its counter starts from 0 again; the total never goes down.
    agg.on_metrics(actor(0, 20))
    assert agg.row(3.0)["env_steps"] == 150 + 20 + 40
    agg.on_metrics(actor(0, 70))
    agg.on_metrics(actor(1, 60))
    assert agg.row(4.0)["env_steps"] == 150 + 70 + 60
    # The same report seen again changes nothing; a second restart carries again.
    assert agg.row(4.5)["env_steps"] == 280
    agg.on_metrics(actor(0, 5))
    assert agg.row(5.0)["env_steps"] == 150 + 70 + 5 + 60
    # Learner updates are carried the same way.
    agg.on_metrics({"id": "learner-0", "role": "learner", "updates": 30})
    agg.on_metrics({"id": "learner-0", "role": "learner", "updates": 30})
    assert agg.row(6.0)["updates"] == 30
    agg.on_metrics({"id": "learner-0", "role": "learner", "updates": 3})
    assert agg.row(7.0)["updates"] == 33
    # Metrics without an id or with a non-integer counter are ignored.
    agg.on_metrics({"role": "actor", "env_steps": 10**6})
    agg.on_metrics({"id": "actor-9", "role": "actor", "env_steps": "many"})
    assert agg.row(8.0)["env_steps"] == 285
    # actor-1 marked dead and registered again: its first report has no counters yet; its
    # env steps stay counted until its next heartbeat, which goes on from where it was.
    agg.on_metrics({"id": "actor-1", "role": "actor"})
    assert agg.row(9.0)["env_steps"] == 285
    agg.on_metrics(actor(1, 64))
    assert agg.row(10.0)["env_steps"] == 289


def test_aggregator_monotonic_over_a_random_history():
    import random

    rnd = random.Random(0)
    agg = Aggregator()
    counts = {i: 0 for i in range(3)}
    done = {i: 0 for i in range(3)}  # steps of earlier lives of each actor
    last_total = 0
    for step in range(300):
        i = rnd.randrange(3)
        if rnd.random() < 0.05:  # restart
            done[i] += counts[i]
            counts[i] = 0
        else:
            counts[i] += rnd.randrange(0, 50)
        agg.on_metrics(actor(i, counts[i]))
        total = agg.row(float(step))["env_steps"]
        assert total >= last_total
        assert total == sum(counts.values()) + sum(done.values())
        last_total = total


def test_aggregator_rates():
    agg = Aggregator()
    agg.on_metrics(actor(0, 0))
    agg.on_metrics({"id": "learner-0", "role": "learner", "updates": 0})
    first = agg.row(0.0)
    assert first["env_steps_per_s"] == 0.0 and first["updates_per_s"] == 0.0
    for t in range(1, 4):
        agg.on_metrics(actor(0, 500 * t))
        agg.on_metrics({"id": "learner-0", "role": "learner", "updates": 20 * t})
        row = agg.row(float(t))
    assert row["env_steps_per_s"] == pytest.approx(500.0)
    assert row["updates_per_s"] == pytest.approx(20.0)
    # The rate looks back about 5 s only: a burst long ago does not count.
    for t in range(4, 20):
        agg.on_metrics(actor(0, 1500 + 100 * (t - 3)))
        row = agg.row(float(t))
    assert row["env_steps_per_s"] == pytest.approx(100.0)
    # Idle: rate goes to zero.
    for t in range(20, 30):
        row = agg.row(float(t))
    assert row["env_steps_per_s"] == 0.0


def test_aggregator_versions_replay_and_eval():
    agg = Aggregator()
    row = agg.row(0.0)
    assert row["weights_version"] == 0 and row["max_version_lag"] == 0
    assert row["eval_return"] is None and row["samples_per_insert"] == 0.0
    agg.on_metrics({"id": "params-0", "role": "params", "weights_version": 10})
    agg.on_metrics(actor(0, 1, version=7))
    agg.on_metrics(actor(1, 1, version=10))
    row = agg.row(1.0)
    assert row["weights_version"] == 10 and row["max_version_lag"] == 3
    # An actor ahead of the params' last report (metrics arrive at different moments).
    agg.on_metrics(actor(0, 2, version=12))
    agg.on_metrics(actor(1, 2, version=11))
    assert agg.row(2.0)["max_version_lag"] == 0
    agg.on_metrics(
        {"id": "replay-0", "role": "replay", "size": 300, "inserts": 400, "samples": 800}
    )
    agg.on_metrics(
        {"id": "replay-1", "role": "replay", "size": 200, "inserts": 100, "samples": 400}
    )
    row = agg.row(3.0)
    assert row["replay_size"] == 500 and row["samples_per_insert"] == 2.4
    agg.evals.append({"mean": 50.0, "weights_version": 10})
    agg.evals.append({"mean": 80.5, "weights_version": 12})
    assert agg.row(4.0)["eval_return"] == 80.5


def test_the_aggregator_keeps_figures_of_its_roster_only_and_a_bounded_set_of_tags():
    from zrl.run.aggregator import MAX_TRAIN_TAGS

    agg = Aggregator(roles=["actor-0", "learner-0"])
    for k in range(1000):
        agg.on_metrics(actor(100 + k, 3_000_000_000))  # ids the roster does not plan
        agg.on_train(f"learner-{k + 1}", "learner", {"loss": 9.0})
    assert set(agg.latest) == set() and agg.dropped == 2000 and agg.train_row() == {}
    agg.on_metrics(actor(0, 500))
    for k in range(10):  # new names every report: at most MAX_TRAIN_TAGS kept for learners
        agg.on_train("learner-0", "learner", {f"tag_{k}_{j}": 1.0 for j in range(20)})
        agg.train_row()
    agg.on_train("learner-0", "learner", {"tag_0_0": 2.0, "new_name": 3.0})
    assert agg.train_row() == {"learner/tag_0_0": 2.0}
    assert (
        len(agg._tags["learner"]) == MAX_TRAIN_TAGS
        and agg.train_dropped == 200 - MAX_TRAIN_TAGS + 1
    )
    assert set(agg.latest) == {"actor-0"} and agg.row(1.0)["env_steps"] == 500


def test_the_last_heartbeats_keep_each_roles_numeric_counters_only():
    agg = Aggregator(roles=["learner-0", "params-0"])
    agg.on_metrics({"id": "learner-0", "role": "learner", "updates": 3, "mixed_rounds": 0})
    agg.on_metrics(
        {
            "id": "learner-0",
            "role": "learner",
            "updates": 7,
            "mixed_rounds": 1,
            "weight_drift": 0.5,
            "loss": float("nan"),
            "train": {"loss": 1.0},
            "mode": "sync",
            "Bad-Name": 1,
        }
    )
    agg.on_metrics({"id": "learner-9", "role": "learner", "updates": 99})  # not planned
    agg.on_metrics({"id": "params-0", "role": "params", **{f"k{i}": i for i in range(200)}})
    beats = agg.last_heartbeats()
    assert beats["learner-0"] == {"updates": 7, "mixed_rounds": 1, "weight_drift": 0.5}
    assert set(beats) == {"learner-0", "params-0"}
    assert len(beats["params-0"]) == MAX_TRAIN_KEYS - 2  # past the id and role


# --- the stop rule on evaluations -----------------------------------------------------------


class EvalFeed:
    """Stands in for the monitor socket: the evals an evaluator publishes on the topic bus."""

    def __init__(self, sender: str, metas: list[dict[str, Any]]) -> None:
        self.msgs = [P.Message(P.METRICS, meta={"kind": "eval", **m}, sender=sender) for m in metas]

    def recv(self, block: bool = True) -> tuple[None, P.Message] | None:
        return (None, self.msgs.pop(0)) if self.msgs else None

    def drop(self, sender: str, reason: str) -> None:
        raise AssertionError(f"dropped an eval from {sender}: {reason}")


def feed(
    sup: Supervisor,
    writer: Any,
    means: list[float],
    *,
    confirming: bool = False,
    versions: list[int] | None = None,
) -> None:
    """Evals as the evaluator sends them: on the topic bus, then in its own heartbeat (of
    weights ``versions``, one per mean, when given)."""
    info = sup.monitor.status_rows[0]["info"]
    for i, mean in enumerate(means):
        t = len(sup.agg.evals) + 1.0
        meta = {"mean": mean, "confirming": confirming}
        if versions is not None:
            meta["weights_version"] = versions[i]
        sup.monitor.drain(EvalFeed("evaluator-0", [meta]), writer, t)
        info["recent_returns"] = [*info.get("recent_returns", []), round(mean, 2)][-32:]
        info["eval_return"] = round(mean, 2)
        if confirming:
            info["confirming_return"] = round(mean, 2)
        sup._confirm_target()


def test_the_stop_rule_ignores_a_single_lucky_evaluation(tmp_path: Path):
    from zrl.run.metrics import MetricsWriter

    sup = eval_supervisor(tmp_path)  # default: the mean of the last 3 evals
    writer = MetricsWriter(tmp_path / "run", tensorboard=False)
    try:
        feed(sup, writer, [200.0, 500.0, 190.0])  # one lucky eval: mean 296.7
        assert not sup._stop.is_set() and sup.target_time is None
        feed(sup, writer, [480.0, 490.0])  # the window still holds 190
        assert not sup._stop.is_set()
        feed(sup, writer, [500.0])
        assert sup._stop.is_set() and sup.stop_reason == "eval_return"
        assert sup.target_time == 6.0 and sup.confirming_return == 490.0
        summary = sup._summary({}, None, interrupted=False)
    finally:
        writer.close()
    assert summary["reached_target"] and summary["confirming_eval_return"] == 490.0
    assert summary["best_eval_return"] == 500.0 and summary["last_eval_return"] == 500.0
    assert summary["final_eval_return"] == summary["last_eval_return"]
    assert summary["stop_rule"] == "the mean of the last 3 evaluations reaches 475"


def test_the_stop_rule_needs_the_evaluators_heartbeat_for_every_eval_in_the_window(
    tmp_path: Path,
):
    from zrl.run.metrics import MetricsWriter

    sup = eval_supervisor(tmp_path)
    writer = MetricsWriter(tmp_path / "run", tensorboard=False)
    try:
        feed(sup, writer, [480.0, 490.0])
        # A forged third eval under the evaluator's name completes the window on the topic
        # bus, but the evaluator's heartbeat never reported it: no stop.
        sup.monitor.drain(EvalFeed("evaluator-0", [{"mean": 600.0}]), writer, 3.0)
        sup._confirm_target()
        assert not sup._stop.is_set()
        # The real evals go on; the forged one leaves the window and the rule is met.
        feed(sup, writer, [470.0, 480.0, 490.0])
        assert sup._stop.is_set() and sup.confirming_return == 480.0
    finally:
        writer.close()


def test_the_fresh_stop_rule_waits_for_the_confirming_evaluation(tmp_path: Path):
    from zrl.run.metrics import MetricsWriter

    sup = eval_supervisor(tmp_path, confirm="fresh", eval_episodes=50)
    writer = MetricsWriter(tmp_path / "run", tensorboard=False)
    try:
        feed(sup, writer, [500.0, 500.0])  # hits, but no confirming evaluation yet
        feed(sup, writer, [210.0], confirming=True)  # its fresh episodes say otherwise
        assert not sup._stop.is_set()
        feed(sup, writer, [490.0])
        feed(sup, writer, [481.5], confirming=True)
        assert sup._stop.is_set() and sup.confirming_return == 481.5
        assert sup.target_time == 5.0
    finally:
        writer.close()
    assert "50 fresh episodes" in sup._summary({}, None, interrupted=False)["stop_rule"]


def test_an_eval_window_of_one_stops_on_any_evaluation(tmp_path: Path):
    from zrl.run.metrics import MetricsWriter

    sup = eval_supervisor(tmp_path, eval_window=1)
    writer = MetricsWriter(tmp_path / "run", tensorboard=False)
    try:
        feed(sup, writer, [200.0, 476.0])
        assert sup._stop.is_set() and sup.target_time == 2.0
    finally:
        writer.close()


# --- exploitability and the league in the run record (issue 30) -----------------------------


def test_a_league_run_records_exploitability_and_the_league_and_stops_at_exploitability_0(
    tmp_path: Path,
):
    """A tic-tac-toe league head with ``stop.exploitability: 0``, fed the evals and
    heartbeats its evaluator and league role send: it stops on the first evaluation at 0 that
    the evaluator's heartbeat reports, league.csv gets a record per LEAGUE_CSV_INTERVAL_S
    (and one at the end), and summary.json and the final lines carry the league's figures,
    the reference opponents' rates and the exploitability."""
    from zrl.config.experiment import load_config
    from zrl.run.display import result_lines
    from zrl.run.metrics import MetricsWriter
    from zrl.run.supervisor import LEAGUE_CSV_INTERVAL_S

    cfg = load_config(
        REPO / "configs" / "tictactoe_league.yaml",
        ["stop.exploitability=0", "stop.eval_window=1", "logging.backends=[csv]"],
    )
    sup = Supervisor(cfg, run_dir=tmp_path / "run", show_status=False)
    (tmp_path / "run").mkdir()
    evaluator_info: dict[str, Any] = {}
    league_info: dict[str, Any] = {
        "elo_top": {"main": 1210.0, "main@3": 1190.0},
        "elo_main": 1210.0,
        "main_win_rate": 0.6,
        "snapshots": 2,
        "main_vs": {"random": 0.97, "scripted": 0.7, "main@3": 0.55},
    }
    rows = [
        {"id": "evaluator-0", "role": "evaluator", "state": "alive", "info": evaluator_info},
        {"id": "league-0", "role": "league", "state": "alive", "info": league_info},
    ]
    sup.monitor.status_rows = rows
    sup.monitor.role_row = lambda rid: next((r for r in rows if r["id"] == rid), None)  # type: ignore[method-assign]
    writer = MetricsWriter(tmp_path / "run", tensorboard=False)

    def league_at(t: float, games: int) -> None:
        league_info["games"] = games
        sup._record_league({"time": t, "env_steps": 100 * games}, writer)

    def evaluate(t: float, version: int, found: float) -> None:
        meta = {
            "mean": 0.9,
            "confirming": False,
            "weights_version": version,
            "random_win_rate": 0.95,
            "random_draw_rate": 0.03,
            "random_loss_rate": 0.02,
            "exploitability": found,
            "exploitability_first": 0,
            "exploitability_second": -1 if found else 0,
            "losing_lines": 4 if found else 0,
        }
        sup.monitor.drain(EvalFeed("evaluator-0", [meta]), writer, t)
        evaluator_info["recent_returns"] = [*evaluator_info.get("recent_returns", []), 0.9]
        evaluator_info["recent_exploitability"] = [
            *evaluator_info.get("recent_exploitability", []),
            found,
        ]
        sup._confirm_target()

    try:
        league_at(1.0, 100)
        evaluate(2.0, 5, 0.5)
        assert not sup._stop.is_set()
        league_at(1.0 + LEAGUE_CSV_INTERVAL_S / 2, 200)  # too soon for another record
        league_at(1.0 + LEAGUE_CSV_INTERVAL_S, 300)
        evaluate(12.0, 6, 0.0)
        assert sup._stop.is_set() and sup.stop_reason == "exploitability"
        assert sup.target.confirmed_version == 6
        league_at(12.0, 300)  # no games since: no record
        league_info["games"] = 350
        sup._record_league({"time": 13.0, "env_steps": 35_000}, writer, final=True)
        summary = sup._summary({}, None, interrupted=False)
    finally:
        writer.close()
    assert summary["reached_target"] and summary["target_exploitability"] == 0.0
    assert summary["exploitability"]["best"] == 0.0
    assert summary["exploitability"]["best_weights_version"] == 6
    assert summary["exploitability"]["last"]["losing_lines"] == 0
    assert summary["reference_opponents"] == {"random": {"win": 0.95, "draw": 0.03, "loss": 0.02}}
    league = summary["league"]
    assert league["games"] == 350 and league["snapshots"] == 2 and league["elo_main"] == 1210.0
    assert league["main_vs"] == {"random": 0.97, "scripted": 0.7, "main@3": 0.55}
    with open(tmp_path / "run" / "league.csv", newline="") as f:
        records = list(csv.DictReader(f))
    games = {float(r["time"]): float(r["value"]) for r in records if r["name"] == "games"}
    assert games == {1.0: 100, 1.0 + LEAGUE_CSV_INTERVAL_S: 300, 13.0: 350}
    final = {r["name"]: float(r["value"]) for r in records if float(r["time"]) == 13.0}
    assert final["eval/exploitability"] == 0.0 and final["main_vs/random"] == 0.97
    lines = "\n".join(result_lines(summary))
    assert "random 0.95/0.03/0.02" in lines
    assert "exploitability 0 (v6: draws moving first, draws moving second, 0 losing lines)" in lines
    assert "main's Elo 1210" in lines and "against random 0.97, scripted 0.70" in lines


# --- the saved model: the weights that met the stop rule (issue 30) -------------------------


def evaluated_run(tmp_path: Path, means: list[float], **stop: Any) -> tuple[Supervisor, Any]:
    """A head whose evaluator evaluated weights v1, v2, ... at ``means``: the evals reach
    the head as they do (``feed``), and the evaluator kept its files as it does
    (``EvaluatedKeeper``, in the run's checkpoint directory); the keeper."""
    from zrl.roles.evaluated_weights import EvaluatedKeeper
    from zrl.run.metrics import MetricsWriter
    from zrl.testing.fakes import model_weights

    sup = eval_supervisor(tmp_path, **stop)
    folder = tmp_path / "run" / "checkpoints"
    sup.cfg.checkpoint.dir = str(folder)  # as RunDir.prepare resolves it
    keeper = EvaluatedKeeper(lambda suffix: folder / f"evaluator-0{suffix}", sup.cfg.stop, 1 << 24)
    writer = MetricsWriter(tmp_path / "run", tensorboard=False)
    try:
        for version, mean in enumerate(means, start=1):
            keeper.on_eval(version, mean, 10, False, lambda v=version: model_weights(sup.cfg, v))
            feed(sup, writer, [mean], versions=[version])
    finally:
        writer.close()
    return sup, keeper


def saved_arrays(path: Path) -> tuple[int, dict[str, Any]]:
    saved = torch.load(path, weights_only=True)
    return saved["version"], {k: v.numpy() for k, v in saved["weights"].items()}


def same_weights(path: Path, cfg: ExperimentConfig, version: int) -> bool:
    from zrl.testing.fakes import model_weights

    got_version, got = saved_arrays(path)
    want = model_weights(cfg, version)
    return got_version == version and all(np.array_equal(got[k], want[k]) for k in want)


def test_model_pt_is_the_confirmed_weights_not_the_last_nor_the_best(tmp_path: Path):
    from zrl.roles.evaluated_weights import Evaluated
    from zrl.roles.evaluation import describe_saved
    from zrl.testing.fakes import model_weights

    # v2 is the best single evaluation; v4 completes the window that meets 475 (520, 440,
    # 480: 480); the run stops at v6, which is worse (never evaluated).
    sup, _ = evaluated_run(tmp_path, [200.0, 520.0, 440.0, 480.0])
    assert sup._stop.is_set() and sup.target.confirmed_version == 4
    assert sup.target.confirmed_by == "evaluator-0"
    saved = sup.rundir.write_models(Evaluated(6, model_weights(sup.cfg, 6)), sup.target)
    run = tmp_path / "run"
    assert same_weights(run / "model.pt", sup.cfg, 4)
    assert same_weights(run / "model_best.pt", sup.cfg, 2)
    assert same_weights(run / "model_last.pt", sup.cfg, 6)
    summary = sup._summary({}, saved, interrupted=False)
    assert summary["model_source"] == "confirmed" and summary["reached_target"]
    assert summary["models"] == {
        "model.pt": {"source": "confirmed", "weights_version": 4, "eval_return": 480.0},
        "model_best.pt": {"weights_version": 2, "eval_return": 520.0},
        "model_last.pt": {"weights_version": 6, "eval_return": None},
    }
    assert summary["model_note"] == (
        "model.pt: the weights that met the stop rule (v4, eval return 480.00)"
    )
    assert summary["weights_version"] == 6  # the final weights', as before
    assert summary["model"] == str(run / "model.pt")
    assert describe_saved(run) == (
        "model.pt: the weights that met the stop rule, weights v4, eval return 480.00"
    )


class InProcessZygote:
    """A zygote whose "fork" runs the child's command here: ``zrl config save-models``."""

    def __init__(self, fork: bool = True) -> None:
        self.can_fork = fork
        self.proc = object() if fork else None  # a zygote process, or none
        self.argv: list[str] = []

    def fork(self, argv: list[str], log_path: Path) -> Any:
        from zrl.run.model_files import answer_request

        self.argv = argv
        if not self.can_fork:
            return None
        assert argv[:2] == ["config", "save-models"]
        answer_request(Path(argv[2]))
        return types.SimpleNamespace(wait=lambda timeout: 0)


def test_a_zygote_child_writes_the_same_model_files_from_the_request(tmp_path: Path):
    """What ``zrl run`` forks so that the head never imports torch: the request carries the
    final weights and the stop rule's outcome, the child chooses and writes as the head
    would, and both files are gone after."""
    from zrl.roles.evaluated_weights import Evaluated
    from zrl.run.model_files import ANSWER, REQUEST, write_models_forked
    from zrl.testing.fakes import model_weights

    sup, _ = evaluated_run(tmp_path, [200.0, 520.0, 440.0, 480.0])
    run = tmp_path / "run"
    last = Evaluated(6, model_weights(sup.cfg, 6))
    here = sup.rundir.write_models(last, sup.target)
    for name in ("model.pt", "model_best.pt", "model_last.pt"):
        (run / name).unlink()
    zygote = InProcessZygote()
    saved = write_models_forked(sup.rundir, last, sup.target, zygote, timeout=60)  # type: ignore[arg-type]
    assert zygote.argv == ["config", "save-models", str(run)]
    assert saved == here and saved.source == "confirmed"
    assert same_weights(run / "model.pt", sup.cfg, 4)
    assert same_weights(run / "model_best.pt", sup.cfg, 2)
    assert same_weights(run / "model_last.pt", sup.cfg, 6)
    assert not (run / REQUEST).exists() and not (run / ANSWER).exists()
    # No zygote to fork from (--inproc, or it died): the caller writes them itself.
    unforked = write_models_forked(sup.rundir, last, sup.target, InProcessZygote(fork=False), 60)  # type: ignore[arg-type]
    assert unforked is None and not (run / REQUEST).exists()


def test_a_run_that_never_met_its_rule_saves_its_best_evaluated_weights(tmp_path: Path):
    from zrl.roles.evaluated_weights import Evaluated
    from zrl.testing.fakes import model_weights

    sup, _ = evaluated_run(tmp_path, [200.0, 320.0, 100.0])
    assert not sup._stop.is_set()
    last = Evaluated(3, model_weights(sup.cfg, 3), 100.0)
    summary = sup._summary({}, sup.rundir.write_models(last, sup.target), interrupted=False)
    assert same_weights(tmp_path / "run" / "model.pt", sup.cfg, 2)
    assert summary["model_source"] == "best" and not summary["reached_target"]
    assert summary["model_note"] == (
        "model.pt: the best evaluated weights (v2, eval return 320.00); the run never met "
        "its stop rule"
    )
    assert summary["models"]["model_last.pt"] == {"weights_version": 3, "eval_return": 100.0}


def test_weights_that_cannot_be_had_fall_back_to_the_best_then_the_last(tmp_path: Path):
    """An evaluator on another host keeps its files there: the head says what it saved."""
    from zrl.roles.evaluated_weights import BEST_SUFFIX, Evaluated, met_suffix, write_evaluated
    from zrl.testing.fakes import model_weights

    sup, _ = evaluated_run(tmp_path, [200.0, 520.0, 440.0, 480.0])
    folder = tmp_path / "run" / "checkpoints"
    (folder / f"evaluator-0{met_suffix(4)}").unlink()
    last = Evaluated(6, model_weights(sup.cfg, 6))
    saved = sup.rundir.write_models(last, sup.target)
    assert saved.source == "best" and saved.model["weights_version"] == 2
    assert saved.note.startswith(
        "model.pt: the best evaluated weights (v2, eval return 520.00); not those that met the "
        "stop rule (v4), which could not be had ("
    )
    assert "evaluator-0.met-4.pt cannot be read" in saved.note

    (folder / f"evaluator-0{BEST_SUFFIX}").unlink()
    saved = sup.rundir.write_models(last, sup.target)
    assert saved.source == "last" and saved.best is None
    assert saved.note.startswith(
        "model.pt: the final weights (v6, never evaluated); not those that met the stop rule"
    )
    assert same_weights(tmp_path / "run" / "model.pt", sup.cfg, 6)

    # Weights of another model (a checkpoint.dir shared with another run) are not taken.
    other = {"w": np.zeros(3, np.float32)}
    write_evaluated(folder / f"evaluator-0{BEST_SUFFIX}", Evaluated(9, other, 600.0))
    saved = sup.rundir.write_models(last, sup.target)
    assert saved.source == "last" and "does not fit the run's weights" in saved.note


# --- every way a run stops leaves its run directory complete --------------------------------
#
# An --inproc supervisor with its broker and no role (start_roles is a no-op): what is under
# test is what the stop writes, not the roles. Each stop is brought about as the monitor
# loop would see it.


def test_an_interrupted_run_leaves_a_complete_run_dir(tmp_path, monkeypatch):
    sup = stop_supervisor(tmp_path, monkeypatch)
    sup._on_signal(signal.SIGINT, None)  # Ctrl-C before the first row
    summary = sup.run()
    assert summary["stop_reason"] == "interrupted" and not summary["failed"]
    check_run_dir(sup, summary)


def test_a_second_ctrl_c_while_finishing_still_completes_the_run_dir(tmp_path, monkeypatch):
    sup = stop_supervisor(tmp_path, monkeypatch)
    sup._on_signal(signal.SIGINT, None)
    seen: list[str] = []

    def impatient() -> None:
        seen.append("asked")
        sup._on_signal(signal.SIGINT, None)  # raises KeyboardInterrupt, as the handler does

    monkeypatch.setattr(sup, "_save_model", impatient)
    summary = sup.run()
    assert seen == ["asked"] and summary["stop_reason"] == "interrupted"
    assert summary["model"] is None and summary["weights_version"] is None
    check_run_dir(sup, summary)
    sup._on_signal(signal.SIGINT, None)  # a third one, once stopping: ignored, not raised


def test_a_run_whose_roles_keep_crashing_leaves_a_complete_run_dir(tmp_path, monkeypatch):
    sup = stop_supervisor(tmp_path, monkeypatch)

    def budget_spent(registered: Any, show: Any) -> bool:
        sup.pool.fatal = "actor-0 crashed 6 times (exit code 1); see logs/actor-0.log"
        return True

    monkeypatch.setattr(sup.pool, "check", budget_spent)
    summary = sup.run()
    assert summary["stop_reason"] == "error" and summary["failed"]
    assert summary["error"].startswith("actor-0 crashed 6 times")
    check_run_dir(sup, summary)


def test_a_run_at_its_time_limit_leaves_a_complete_run_dir(tmp_path, monkeypatch):
    sup = stop_supervisor(tmp_path, monkeypatch, wall_time=0.001)
    summary = sup.run()
    assert summary["stop_reason"] == "wall_time" and not summary["failed"]
    check_run_dir(sup, summary)


def test_a_run_at_its_target_leaves_a_complete_run_dir(tmp_path, monkeypatch):
    sup = stop_supervisor(tmp_path, monkeypatch, eval_return=475)
    eval_row = {"time": 0.5, "env_steps": 0, "mean": 480.0, "episodes": 10}

    def met(row: dict[str, Any]) -> None:  # as _confirm_target does once the rule is met
        if not sup.agg.evals:
            sup.agg.on_eval(eval_row, 0.5)
            sup.target.target_time, sup.target.confirming_return = 0.5, 480.0
            sup.stop_reason = "eval_return"
            sup._stop.set()

    monkeypatch.setattr(sup, "_check_limits", met)
    summary = sup.run()
    assert summary["stop_reason"] == "eval_return" and summary["reached_target"]
    assert summary["confirming_eval_return"] == 480.0
    check_run_dir(sup, summary)


def test_a_run_that_fails_in_the_supervisor_says_why_in_its_summary(tmp_path, monkeypatch):
    sup = stop_supervisor(tmp_path, monkeypatch)

    def broken(plan: Any) -> None:
        raise RuntimeError("cannot fork: out of memory")

    monkeypatch.setattr(sup.pool, "start_roles", broken)
    with pytest.raises(RuntimeError, match="cannot fork"):
        sup.run()
    summary = json.loads((sup.run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "error" and summary["failed"]
    assert summary["error"] == "zrl run failed: RuntimeError: cannot fork: out of memory"
    check_run_dir(sup, summary)


# --- free_port_range ------------------------------------------------------------------------


def bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.mark.parametrize("count", [1, 11])
def test_free_port_range_ports_are_bindable(count):
    base = free_port_range(count)
    assert 20000 <= base and base + count <= 60000
    assert all(bindable(p) for p in range(base, base + count))


def test_free_port_range_keeps_out_of_the_ephemeral_range():
    # A port of the ephemeral range that is free now may be the local end of the next
    # outgoing connection before the broker binds it.
    low, high = ephemeral_ports()
    for _ in range(20):
        base = free_port_range(11)
        assert base + 11 <= low or base > high


def test_free_port_range_skips_a_busy_port():
    count = 5
    base = free_port_range(count + 2)
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        busy.bind(("127.0.0.1", base))
        busy.listen(1)
        # Only base and base + 1 are possible starts here; base is taken.
        assert free_port_range(count, start=base, end=base + count + 2) == base + 1
        with pytest.raises(OSError, match=f"no range of {count + 2} free ports"):
            free_port_range(count + 2, start=base, end=base + count + 3)
    finally:
        busy.close()


# --- crash restart with real processes -------------------------------------------------------


def crash_config() -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "supervisor-crash-test",
            "seed": 1,
            "env": {"id": "CartPole-v1", "num_envs": 2},
            "model": {"hidden": [16]},
            "broker": {"heartbeat_interval": 0.25, "heartbeat_timeout": 2.0},
            "roles": {"actors": 1, "replay": 1, "params": 1, "learners": 1, "evaluator": 0},
            "actor": {"trajectory_length": 8},
            "replay": {
                "capacity": 5000,
                "min_size": 64,
                "batch_size": 16,
                "samples_per_insert": 2,
                "samples_per_insert_tolerance": 512,
            },
            "learner": {"publish_interval": 10},
            # A safety net only: the test ends the run itself once the restart is seen.
            "stop": {"eval_return": None, "wall_time": 120},
        }
    )


def rows(ctx: zmq.Context, addr: str) -> dict[str, dict[str, Any]]:
    try:
        reply = registry_request(ctx, addr, P.Message(P.STATUS), 1.0, run_keys(addr))
    except RoleError:
        return {}
    return {r["id"]: r for r in reply.meta.get("roles", [])}


def processes_of(addr: str) -> list[psutil.Process]:
    """Processes whose command line names this run's broker address (ours only)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and addr in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.mark.waits
@pytest.mark.slow
def test_supervisor_restarts_a_killed_actor(tmp_path: Path):
    cfg = crash_config()
    run_dir = tmp_path / "run"
    sup = Supervisor(cfg, run_dir=run_dir, show_status=False, log_level="INFO")
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["summary"] = sup.run()
        except BaseException as exc:  # reported below
            result["error"] = exc

    thread = threading.Thread(target=target, name="supervisor", daemon=True)
    ctx = zmq.Context()
    addr = ""
    thread.start()
    try:
        addr_file = run_dir / "broker_address"
        wait_for(lambda: addr_file.exists() or "error" in result, timeout=30)
        assert "error" not in result, result.get("error")
        addr = note_run(addr_file.read_text().strip(), run_dir)
        assert addr == sup.broker_addr

        def all_alive() -> bool:
            r = rows(ctx, addr)
            ids = {"params-0", "replay-0", "learner-0", "actor-0"}
            return ids <= set(r) and all(r[i]["state"] == "alive" for i in ids)

        wait_for(lambda: all_alive() or not thread.is_alive(), timeout=60, interval=0.25)
        assert thread.is_alive(), result
        status = zrl_status_json(addr)
        row = {r["id"]: r for r in status["roles"]}["actor-0"]
        old_pid = row["pid"]
        assert row["state"] == "alive" and row["restarts"] == 0
        # Only ever signal our own child.
        assert psutil.Process(old_pid).ppid() == os.getpid()
        os.kill(old_pid, signal.SIGKILL)

        def restarted() -> bool:
            r = rows(ctx, addr).get("actor-0")
            return r is not None and r["state"] == "alive" and r["pid"] != old_pid

        wait_for(lambda: restarted() or not thread.is_alive(), timeout=40, interval=0.25)
        assert thread.is_alive(), f"the run ended before actor-0 came back: {result}"
        new = rows(ctx, addr)["actor-0"]
        assert new["restarts"] >= 1
        assert psutil.Process(new["pid"]).ppid() == os.getpid()
        assert old_pid not in {p.pid for p in processes_of(addr)}
        # The others were not disturbed.
        assert all(r["restarts"] == 0 for i, r in rows(ctx, addr).items() if i != "actor-0")
        # End the run now instead of waiting for the rest of the wall time.
        cfg.stop.wall_time = 0.5
        thread.join(40)
        assert not thread.is_alive(), "the supervisor did not stop"
        assert "error" not in result, result.get("error")
        summary = result["summary"]
        assert summary["restarts"].get("actor-0", 0) >= 1
        assert set(summary["restarts"]) == {"actor-0"}
        assert summary["stop_reason"] == "wall_time" and summary["error"] is None
        saved = json.loads((run_dir / "summary.json").read_text())
        assert saved["restarts"] == summary["restarts"]
        assert (run_dir / "logs" / "actor-0.log").exists()
    finally:
        if thread.is_alive():
            sup._stop.set()  # last resort: the test never leaves a run behind
            thread.join(40)
        leftovers = processes_of(addr) if addr else []
        for p in leftovers:
            p.kill()
        psutil.wait_procs(leftovers, timeout=5)
        ctx.destroy(linger=0)
    assert not thread.is_alive()
    assert leftovers == [], f"processes left running: {[p.pid for p in leftovers]}"


# --- roles that keep crashing -----------------------------------------------------------------


def make_env_crashing_in_actors() -> Any:
    """An env factory (referenced as tests.run.test_supervisor:make_env_crashing_in_actors) that
    fails in actor processes only, at their setup: any check run before the roles, and the
    other roles, get a working CartPole."""
    import gymnasium as gym

    if sys.argv[1:3] == ["start", "actor"]:
        raise RuntimeError("no such simulator: crash-test-sim")
    return gym.make("CartPole-v1")


CRASHING_ENV = "tests.run.test_supervisor:make_env_crashing_in_actors"


@pytest.mark.waits
@pytest.mark.slow
def test_a_run_whose_actor_keeps_crashing_exits_1_and_shows_its_log(tmp_path: Path):
    """A time limit comes before the restart budget is spent: the run still fails, and the
    first crash put the role's last log lines in the terminal."""
    cfg = crash_config().model_dump(mode="json")
    # Long enough for the first crash on a slow start (the zygote imports torch first: 14 s
    # was missed at a load of 10), short of the restart budget, which the script (run in the
    # head) makes 6 restarts after 1+2+4+8+15+120 s, so the time limit always comes first.
    cfg["stop"] = {"eval_return": None, "wall_time": 45}
    script = tmp_path / "crash.py"
    script.write_text(
        f"import json\nimport zrl\nimport zrl.run.children\n\n"
        f"zrl.run.children.RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 120.0)\n"
        f"zrl.run.children.RESTART_BUDGET = 6\n"
        f"experiment = zrl.Experiment(\n"
        f"    json.loads({json.dumps(cfg)!r}), env={CRASHING_ENV!r}\n)\n"
    )
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "zrl", "run", str(script), "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        kill_pids([proc.pid] if proc.poll() is None else [])
    assert proc.returncode == 1, out
    # Exit code 2: the role turned the factory's error into one line, now in the terminal.
    assert "actor-0 exited with code 2; the last lines of" in out, out
    assert "  | error: the env factory failed: RuntimeError: no such simulator: crash-test" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed"] and summary["stop_reason"] == "wall_time"
    assert summary["error"].startswith("actor-0 crashed "), summary["error"]
    assert "while starting" in summary["error"]
    assert any("crash-test-sim" in line for line in summary["error_log_tail"])


@pytest.mark.waits
@pytest.mark.slow
def test_experiment_run_raises_when_the_restart_budget_is_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(REPO)  # the roles import the factory from the tests package
    monkeypatch.setattr(zrl.run.children, "RESTART_BACKOFF_S", (0.1,))  # no 30 s of back-off
    cfg = crash_config()
    cfg.stop.wall_time = 90  # a safety net: the sixth crash ends the run long before
    experiment = zrl.Experiment(cfg, env=CRASHING_ENV)
    with pytest.raises(zrl.RunFailed) as failed:
        experiment.run(run_dir=tmp_path / "run", show_status=False)
    summary = failed.value.summary
    assert summary["stop_reason"] == "error" and summary["failed"]
    assert summary["error"].startswith(
        f"actor-0 crashed {zrl.run.children.RESTART_BUDGET + 1} times"
    )
    assert "crash-test-sim" in "\n".join(summary["error_log_tail"])
    assert "actor-0 crashed" in str(failed.value) and "summary.json" in str(failed.value)
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["failed"] and saved["restarts"] == {"actor-0": zrl.run.children.RESTART_BUDGET}


def test_a_scripts_relative_config_path_is_relative_to_the_script(tmp_path, monkeypatch):
    """`python path/to/script.py` from anywhere finds the config the script names, as
    `zrl run path/to/script.py` does."""
    scripts = tmp_path / "examples"
    (tmp_path / "configs").mkdir()
    scripts.mkdir()
    (tmp_path / "configs" / "mine.yaml").write_text("name: mine\nseed: 7\n")
    script = scripts / "exp.py"
    script.write_text('import zrl\nexperiment = zrl.Experiment("../configs/mine.yaml")\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    namespace: dict[str, Any] = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    cfg = namespace["experiment"].resolved_config()
    assert (cfg.name, cfg.seed) == ("mine", 7)
    # A path that exists from where the script is run keeps its meaning.
    (elsewhere / "local.yaml").write_text("name: local\n")
    assert zrl.Experiment("local.yaml").resolved_config().name == "local"


# --- forged metrics (issue 27, observation 4) ---------------------------------------------------


class ReportingActor(zrl.roles.base.Role):
    """actor-0 of the run as the head hears it: its heartbeats (and metrics) say 500 steps."""

    role = "actor"

    def heartbeat_info(self) -> dict[str, Any]:
        return {"env_steps": 500, "weights_version": 0}


class StartedHere:
    """The process the head started for params-0 (pid 4242): running until signalled."""

    pid = 4242

    def __init__(self) -> None:
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code

    def wait(self, timeout: float | None = None) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.code = 0

    def kill(self) -> None:
        self.code = -9


def forge_registrations(ctx: zmq.Context, addr: str, ids: list[str], pid: int) -> list[zmq.Socket]:
    """Registry entries under ``ids`` (one connection each), heartbeating a huge counter."""
    from zrl.transport.sockets import make_socket

    socks = []
    for k, rid in enumerate(ids):
        sock = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=5000, sndtimeo_ms=1000)
        sock.connect(addr)
        hello = {
            "role": rid.rsplit("-", 1)[0],
            "id": rid,
            "index": None,
            "host": "forger",
            "pid": pid,
            "address": "127.0.0.1",
            "rpc": "",
            "instance": f"forged-{k}",
            "zrl_version": zrl.__version__,
        }
        sock.send_multipart(P.encode(P.Message(P.HELLO, meta=hello)))
        assert P.decode(sock.recv_multipart()).kind == P.WELCOME
        socks.append(sock)
    return socks


def heartbeat(socks: list[zmq.Socket], ids: list[str]) -> None:
    info = {"env_steps": 3_000_000_000, "weights_version": 10**9, "updates": 10**9}
    for sock, rid in zip(socks, ids, strict=True):
        meta = {"id": rid, "state": "running", "stats": {}, "info": info}
        sock.send_multipart(P.encode(P.Message(P.HEARTBEAT, meta=meta)), flags=zmq.NOBLOCK)


def test_forged_metrics_neither_stop_the_run_nor_grow_the_head(tmp_path, monkeypatch):
    """Issue 27, observation 4: a forged METRICS ``env_steps: 3e9`` stopped a run at its
    ``stop.env_steps``, and new ids and tags grew the head (204 -> 794 MB), train_metrics.csv
    and summary.json (52,919 roles). Replayed on a real head (its broker, its monitor loop on
    the topic bus) with a real actor-0 heartbeating 500 env steps: thousands of forged METRICS
    under new ids, under actor-0's id (3e9 env steps) and learner-0's (thousands of tags), and
    forged registry entries (unplanned ids, and params-0 from a pid the head did not start).
    The run counts the real 500 steps, does not stop on env_steps, and keeps state for its
    roster's 6 roles only."""
    from zrl.run.aggregator import MAX_TRAIN_TAGS, TRAIN_ROLES
    from zrl.run.children import Child
    from zrl.run.roster import MAX_UNPLANNED

    cfg = ExperimentConfig.model_validate(
        {
            "name": "forged-metrics",
            "env": {"id": "CartPole-v1", "num_envs": 1},
            "model": {"hidden": [8]},
            "logging": {"backends": ["csv"]},
            "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 1.0},
            "stop": {"eval_return": None, "env_steps": 1000, "wall_time": 400},
        }
    )
    sup = Supervisor(cfg, run_dir=tmp_path / "run", inproc=True, show_status=False)
    planned = set(sup.roster.planned)
    assert planned == {"actor-0", "actor-1", "replay-0", "params-0", "learner-0", "evaluator-0"}
    params = Child("params", 0, tmp_path / "params-0.log", proc=StartedHere())  # type: ignore[arg-type]
    monkeypatch.setattr(sup.pool, "start_roles", lambda plan: sup.pool.children.append(params))
    monkeypatch.setattr(sup.pool, "check", lambda registered, show: False)
    ctx = zmq.Context.instance()
    done: dict[str, Any] = {}
    head = threading.Thread(target=lambda: done.update(summary=sup.run()), daemon=True)
    head.start()
    socks: list[zmq.Socket] = []
    actor0 = None
    try:
        wait_for(lambda: (sup.run_dir / "broker_address").is_file(), timeout=60)
        broker = sup.pool.inproc_broker
        assert broker is not None
        actor0 = ReportingActor(sup.broker_addr, index=0, ctx=ctx, connect_timeout=10)
        threading.Thread(target=actor0.run, daemon=True).start()
        unplanned = [f"actor-{100 + k}" for k in range(MAX_UNPLANNED + 8)]
        socks = forge_registrations(ctx, sup.broker_addr, ["params-0", *unplanned], pid=999)
        pub = make_socket_pub(ctx, broker.endpoints["topics_in"])
        socks.append(pub)
        seen_at: list[float] = []
        k = 0

        def flood() -> bool:
            nonlocal k
            heartbeat(socks[:-1], ["params-0", *unplanned])
            for _ in range(200):
                k += 1
                for meta in (
                    {
                        "id": f"actor-{1000 + k}",
                        "role": "actor",
                        "env_steps": 3_000_000_000,
                        "train": {f"t{k}_{j}": 1.0 for j in range(8)},
                    },
                    {"id": "actor-0", "role": "actor", "env_steps": 3_000_000_000},
                    {
                        "id": "learner-0",
                        "role": "learner",
                        "train": {f"tag_{k}_{j}": 1.0 for j in range(60)},
                    },
                    {"id": "evaluator-0", "role": "learner", "train": {"loss": 1.0}},
                ):
                    msg = P.Message(P.METRICS, meta=meta, sender=str(meta["id"]))
                    pub.send_multipart([P.METRICS_TOPIC.encode(), *P.encode(msg)])
            if not seen_at and sup.monitor.metrics_dropped > 2000 and sup.agg.train_dropped:
                seen_at.append(time.monotonic())
            # Past a progress row (the env_steps limit is checked on each, once a second)
            # after the flood reached the head, with actor-0's real heartbeat counted.
            counted = sup.agg.latest.get("actor-0", {}).get("env_steps")
            return bool(seen_at) and time.monotonic() > seen_at[0] + 1.5 and counted == 500

        wait_for(flood, timeout=150, interval=0.05)  # sized for a 2-core machine at load 10
        assert not sup._stop.is_set(), sup.stop_reason  # the forged 3e9 steps stopped nothing
        for sock in socks:  # the forgers leave (the head waits for roles elsewhere to end)
            sock.close(linger=0)
        sup._on_signal(signal.SIGINT, None)
        head.join(60)
        assert not head.is_alive()
    finally:
        if actor0 is not None:
            actor0.request_stop()
        for sock in socks:
            sock.close(linger=0)
        if head.is_alive():
            sup._on_signal(signal.SIGINT, None)
            head.join(60)
    summary = done["summary"]
    assert summary["stop_reason"] == "interrupted" and summary["env_steps"] == 500
    # params-0's row was the forger's (pid 999, not the process the head started): not counted.
    assert "params-0" not in sup.agg.latest and summary["weights_version"] is None
    # The head keeps state for its roster only: 6 roles, not thousands.
    assert set(sup.agg.latest) <= planned and sup.agg.dropped == 0
    assert summary["metrics_dropped"] == sup.monitor.metrics_dropped > 2000
    assert summary["train_figures_dropped"] == sup.agg.train_dropped > 0
    tags = sum(len(t) for t in sup.agg._tags.values())
    assert tags <= MAX_TRAIN_TAGS * len(TRAIN_ROLES) and sup.agg._tags.keys() == {"learner"}
    took_part = summary["roles"]["took_part"]
    assert len(took_part) <= len(planned) + MAX_UNPLANNED
    assert summary["roles"]["unplanned_not_listed"] >= 8
    assert (tmp_path / "run" / "summary.json").stat().st_size < 64 * 1024
    with open(tmp_path / "run" / "train_metrics.csv", newline="") as f:
        tags_written = {row["tag"] for row in csv.DictReader(f)}
    assert 0 < len(tags_written) <= MAX_TRAIN_TAGS
    assert all(tag.startswith("learner/") for tag in tags_written)


def make_socket_pub(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    from zrl.transport.sockets import make_socket

    sock = make_socket(ctx, zmq.PUB, sndhwm=100_000)
    sock.connect(endpoint)
    return sock


def test_a_role_the_broker_marks_dead_is_named_on_the_console_once(tmp_path: Path):
    sup = eval_supervisor(tmp_path)
    shown: list[str] = []

    class Display:
        def message(self, text: str) -> None:
            shown.append(text)

    learner = {"id": "learner-0", "role": "learner", "state": "alive", "host": "h1", "pid": 7}
    stranger = {"id": "learner-9", "role": "learner", "state": "alive", "host": "h1", "pid": 8}
    sup.monitor.status_rows = [learner, stranger]
    sup._report_deaths(Display())
    assert shown == []
    for row in (learner, stranger):
        row["state"] = "dead"
    sup._report_deaths(Display())
    sup._report_deaths(Display())  # still dead: said once
    assert shown == [
        "learner-0 (host h1, pid 7) missed its heartbeats for broker.heartbeat_timeout=10s: "
        "the broker marked it dead"
    ]  # learner-9 is no role of this run
    learner["state"] = "alive"  # restarted, and dead again: said again
    sup._report_deaths(Display())
    learner["state"] = "dead"
    sup._report_deaths(Display())
    assert len(shown) == 2
    # Alive (heartbeating) with its loop held past broker.stall_after: stalled, said once
    # with since when; said again for a later stall.
    learner.update(state="alive", stalled_s=42.0)
    stranger.update(state="alive", stalled_s=42.0)
    for _ in range(2):
        sup._report_deaths(Display())
    assert len(shown) == 3 and shown[2].startswith(
        "learner-0 (host h1, pid 7) is alive (it heartbeats) but stalled: loop stalled 42 s (since "
    )
    assert shown[2].endswith("); broker.stall_after=30s")
    learner["stalled_s"] = None
    sup._report_deaths(Display())
    learner["stalled_s"] = 31.0
    sup._report_deaths(Display())
    assert len(shown) == 4 and "stalled 31 s" in shown[3]


def test_an_evaluation_the_stop_cut_short_is_named_in_the_summary(tmp_path: Path):
    sup = eval_supervisor(tmp_path)
    assert sup._summary({}, None, interrupted=True)["evaluations_cut_short"] == []
    sup.monitor.status_rows[0]["info"] = {"evaluating": {"weights_version": 7, "for_s": 3.5}}
    cut = sup._summary({}, None, interrupted=True)["evaluations_cut_short"]
    assert cut == [{"evaluator": "evaluator-0", "weights_version": 7, "running_for_s": 3.5}]


# --- Ctrl-C: the run ends within seconds, writes its summary and says how to go on -----------

INTERRUPT_GUARD_S = 15.0
"""The head promises its exit within 10 s of Ctrl-C; the guard leaves room for a loaded CI."""


def stepped(run_dir: Path) -> bool:
    """Whether progress.csv shows an env step yet (a row being written reads as none)."""
    from zrl.run.metrics import read_csv

    try:
        rows = read_csv(run_dir / "progress.csv")
    except (OSError, ValueError):
        return False
    return bool(rows) and rows[-1].get("env_steps", 0) > 0


def ctrl_c(proc: subprocess.Popen[bytes]) -> tuple[float, list[psutil.Process]]:
    """SIGINT to the head alone, as Ctrl-C; the seconds until it exited (failing past
    INTERRUPT_GUARD_S), and the processes it had started, which must be gone with it."""
    children = psutil.Process(proc.pid).children(recursive=True)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=INTERRUPT_GUARD_S)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"zrl run still running {INTERRUPT_GUARD_S:g} s after Ctrl-C:\n{output_of(proc)}"
        )
    return time.monotonic() - sent, children


def interrupted_run(run_dir: Path, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The summary of a run Ctrl-C stopped, checked: exit code 130, why and how to go on."""
    assert proc.returncode == 130, output_of(proc)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["signal"] == "SIGINT", summary
    assert not summary["failed"] and summary["error"] is None, summary
    assert summary["resume_command"] == f"zrl run --resume {run_dir}", summary
    return summary


@pytest.mark.slow
def test_ctrl_c_after_the_first_env_step_ends_the_run_within_seconds(tmp_path: Path):
    run_dir = tmp_path / "run"
    proc = start_zrl(
        "run",
        str(REPO / "configs" / "cartpole_apex_dqn.yaml"),
        "--run-dir",
        str(run_dir),
        "--set",
        "stop.eval_return=null",
        "--set",
        "stop.wall_time=300",
        log=tmp_path / "run.log",
        cwd=tmp_path,
    )
    try:
        wait_for(
            lambda: stepped(run_dir) or proc.poll() is not None,
            timeout=120,
            message="no env step in progress.csv",
        )
        assert proc.poll() is None, output_of(proc)
        took, children = ctrl_c(proc)
    finally:
        kill_pids([proc.pid] if proc.poll() is None else [])
    print(f"Ctrl-C after the first env step: exited {took:.1f} s later")
    summary = interrupted_run(run_dir, proc)
    assert summary["env_steps"] > 0, summary
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, [p.pid for p in alive]


def test_ctrl_c_while_the_run_starts_still_writes_its_summary(tmp_path: Path):
    """Ctrl-C while the head checks the model and the zygote loads torch (what took a loaded
    machine 50 s and left a run directory of config.yaml and an empty logs/ behind)."""
    run_dir = tmp_path / "run"
    proc = start_zrl(
        "run",
        str(REPO / "configs" / "cartpole_apex_dqn.yaml"),
        "--run-dir",
        str(run_dir),
        log=tmp_path / "run.log",
        cwd=tmp_path,
    )
    try:
        wait_for(
            lambda: (run_dir / "config.yaml").is_file() or proc.poll() is not None,
            timeout=60,
            message="the run directory was never written",
        )
        assert proc.poll() is None, output_of(proc)
        took, children = ctrl_c(proc)
    finally:
        kill_pids([proc.pid] if proc.poll() is None else [])
    print(f"Ctrl-C while starting: exited {took:.1f} s later")
    summary = interrupted_run(run_dir, proc)
    assert summary["env_steps"] == 0 and summary["roles"]["took_part"] == {}, summary
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, [p.pid for p in alive]
