"""``Evaluator`` in-process with a broker and a parameter server: each evaluation goes out
on the ``eval`` topic, and the weights it evaluated are in its checkpoint directory (best,
and those that met the stop rule) by the time the result is heard."""

from __future__ import annotations

import threading
import time

import torch

from tests.helpers.params import assert_same_arrays, config, weights
from zrl.roles import evaluator as evaluator_module
from zrl.roles.evaluated_weights import BEST_SUFFIX, met_suffix, read_evaluated
from zrl.roles.evaluator import Evaluator
from zrl.roles.params import ParameterServer
from zrl.testing.fakes import Rpc
from zrl.testing.inproc import collect
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P

torch.set_num_threads(1)


def test_the_evaluated_weights_are_kept_before_the_result_goes_out(inproc, zmq_ctx, tmp_path):
    cfg = config()
    cfg.checkpoint.dir = str(tmp_path / "ckpt")
    cfg.evaluator.interval = 0.01
    cfg.evaluator.episodes = 2
    # Any evaluation meets this rule: every evaluated version gets its ``met`` file.
    cfg.stop.eval_return = -1.0
    cfg.stop.eval_window = 1
    inproc.start_broker(cfg)
    params = inproc.start(ParameterServer, index=0)
    assert isinstance(params, ParameterServer)
    sub = inproc.sub(P.EVAL_TOPIC)
    inproc.wait_subscribed(sub)
    rpc = Rpc(zmq_ctx, params.rpc_endpoint, broker=params.broker)
    try:
        sent = {1: weights(1)}
        assert rpc.request(P.Message(P.WEIGHTS, arrays=sent[1])).meta["version"] == 1
        evaluator = inproc.start(Evaluator, index=0)
        (first,) = collect(sub, until=1, timeout=30)
        assert first.sender == "evaluator-0" and first.meta["weights_version"] == 1
        # The files were written before the result was published; v1, the initial weights,
        # is never the best.
        folder = tmp_path / "ckpt"
        assert not (folder / f"evaluator-0{BEST_SUFFIX}").exists()
        met = read_evaluated(folder / f"evaluator-0{met_suffix(1)}", 1 << 20)
        assert met.version == 1 and met.eval_return == first.meta["mean"]
        assert met.episodes == 2
        assert_same_arrays(met.weights, sent[1])

        sent[2] = weights(2)
        assert rpc.request(P.Message(P.WEIGHTS, arrays=sent[2])).meta["version"] == 2
        (second,) = collect(sub, until=1, timeout=30)
        assert second.meta["weights_version"] == 2
        met = read_evaluated(folder / f"evaluator-0{met_suffix(2)}", 1 << 20)
        assert_same_arrays(met.weights, sent[2])
        best = read_evaluated(folder / f"evaluator-0{BEST_SUFFIX}", 1 << 20)
        assert best.version == 2 and best.eval_return == second.meta["mean"]
        assert inproc.error_of(evaluator) is None
    finally:
        rpc.close()


def evaluator_of_weights_v1(inproc, zmq_ctx, cfg) -> tuple[Evaluator, Rpc]:
    """A broker, a parameter server holding weights v1, and an evaluator of them; the rpc to
    params, for the caller to close."""
    inproc.start_broker(cfg)
    params = inproc.start(ParameterServer, index=0)
    assert isinstance(params, ParameterServer)
    rpc = Rpc(zmq_ctx, params.rpc_endpoint, broker=params.broker)
    assert rpc.request(P.Message(P.WEIGHTS, arrays=weights(1))).meta["version"] == 1
    evaluator = inproc.start(Evaluator, index=0)
    assert isinstance(evaluator, Evaluator)
    return evaluator, rpc


def test_the_heartbeat_shows_the_evaluation_running_now(inproc, zmq_ctx, monkeypatch):
    cfg = config()
    cfg.evaluator.interval = 0.01
    release = threading.Event()
    real = evaluator_module.greedy_returns

    def held(*args, **kwargs):  # the episodes, once the test has seen them running
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluator_module, "greedy_returns", held)
    evaluator, rpc = evaluator_of_weights_v1(inproc, zmq_ctx, cfg)
    try:
        running = wait_for(lambda: evaluator.heartbeat_info().get("evaluating"), timeout=30)
        assert running["weights_version"] == 1 and running["for_s"] >= 0
        release.set()
        wait_for(lambda: evaluator.evaluations == 1, timeout=30)
        assert "evaluating" not in evaluator.heartbeat_info()
        assert inproc.error_of(evaluator) is None
    finally:
        release.set()
        rpc.close()


def test_a_stop_ends_an_evaluation_in_progress(inproc, zmq_ctx, monkeypatch):
    """An evaluation (connect four with search: minutes) ends at its next step once the
    role is asked to stop, and records nothing of itself."""
    cfg = config()
    cfg.evaluator.interval = 0.01
    steps = []

    def endless(model, make_envs, episodes, seed, on_step):  # episodes that never finish
        while True:
            steps.append(1)
            on_step()
            time.sleep(0.01)

    monkeypatch.setattr(evaluator_module, "greedy_returns", endless)
    evaluator, rpc = evaluator_of_weights_v1(inproc, zmq_ctx, cfg)
    try:
        wait_for(lambda: len(steps) > 5, timeout=30, message="the evaluation never stepped")
        inproc.stop_role(evaluator)  # it stops (joined) although its episodes never end
        assert evaluator.evaluations == 0 and evaluator.last == {}
        assert inproc.error_of(evaluator) is None
    finally:
        rpc.close()


def test_a_tictactoe_evaluation_reports_the_greedy_policys_exploitability(
    inproc, zmq_ctx, tmp_path
):
    """Each evaluation of a tic-tac-toe policy carries the exploitability of its greedy policy
    (the search over the model it evaluated), its heartbeat the same, and the weights that
    met ``stop.exploitability`` are kept."""
    from zrl.config.experiment import ExperimentConfig
    from zrl.envs.multiagent.games import GAMES
    from zrl.nets.wire import load_arrays
    from zrl.roles.evaluation import exploitability_fields, greedy_exploitability
    from zrl.testing.fakes import config_model, model_weights

    cfg = ExperimentConfig.model_validate(
        {
            "name": "evaluator-exploitability",
            "algo": "ppo",
            "env": {"id": "pettingzoo/tictactoe_v3", "num_envs": 2},
            "roles": {"replay": 0},
            "model": {"hidden": [8]},
            "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0},
            "evaluator": {"interval": 0.01, "episodes": 2},
            "checkpoint": {"dir": str(tmp_path / "ckpt")},
            # Any evaluation is at most 1: each one meets the rule.
            "stop": {"eval_return": None, "exploitability": 1.0, "eval_window": 1},
        }
    )
    inproc.start_broker(cfg)
    params = inproc.start(ParameterServer, index=0)
    assert isinstance(params, ParameterServer)
    sub = inproc.sub(P.EVAL_TOPIC)
    inproc.wait_subscribed(sub)
    rpc = Rpc(zmq_ctx, params.rpc_endpoint, broker=params.broker)
    try:
        sent = model_weights(cfg, 3)
        assert rpc.request(P.Message(P.WEIGHTS, arrays=sent)).meta["version"] == 1
        evaluator = inproc.start(Evaluator, index=0)
        (result,) = collect(sub, until=1, timeout=60)
        assert inproc.error_of(evaluator) is None
    finally:
        rpc.close()
    model = config_model(cfg)
    load_arrays(model, sent)
    model.eval()
    want = exploitability_fields(greedy_exploitability(model, GAMES["tictactoe"]))
    assert {k: result.meta[k] for k in want} == want
    assert result.meta["random_win_rate"] + result.meta["random_loss_rate"] <= 1.0
    info = evaluator.heartbeat_info()
    assert info["recent_exploitability"] == [want["exploitability"]]
    assert info["exploitability"] == want["exploitability"]
    met = read_evaluated(tmp_path / "ckpt" / f"evaluator-0{met_suffix(1)}", 1 << 20)
    assert met.version == 1
