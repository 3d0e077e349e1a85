"""``Evaluator`` in-process with a broker and a parameter server: each evaluation goes out
on the ``eval`` topic, and the weights it evaluated are in its checkpoint directory (best,
and those that met the stop rule) by the time the result is heard."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.helpers.params import assert_same_arrays, config, weights
from zrl.roles.evaluated_weights import BEST_SUFFIX, met_suffix, read_evaluated
from zrl.roles.evaluator import Evaluator
from zrl.roles.params import ParameterServer
from zrl.testing.fakes import Rpc
from zrl.testing.inproc import InProc, collect
from zrl.transport import protocol as P

torch.set_num_threads(1)


@pytest.fixture
def inproc(zmq_ctx) -> Iterator[InProc]:
    h = InProc(zmq_ctx, "evaluator")
    try:
        yield h
    finally:
        h.close()


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
        # The files were written before the result was published.
        folder = tmp_path / "ckpt"
        best = read_evaluated(folder / f"evaluator-0{BEST_SUFFIX}", 1 << 20)
        met = read_evaluated(folder / f"evaluator-0{met_suffix(1)}", 1 << 20)
        for kept in (best, met):
            assert kept.version == 1 and kept.eval_return == first.meta["mean"]
            assert kept.episodes == 2
            assert_same_arrays(kept.weights, sent[1])

        sent[2] = weights(2)
        assert rpc.request(P.Message(P.WEIGHTS, arrays=sent[2])).meta["version"] == 2
        (second,) = collect(sub, until=1, timeout=30)
        assert second.meta["weights_version"] == 2
        met = read_evaluated(folder / f"evaluator-0{met_suffix(2)}", 1 << 20)
        assert_same_arrays(met.weights, sent[2])
        best = read_evaluated(folder / f"evaluator-0{BEST_SUFFIX}", 1 << 20)
        better = max((first, second), key=lambda m: m.meta["mean"])  # ties: the first stays
        assert best.version == better.meta["weights_version"]
        assert inproc.error_of(evaluator) is None
    finally:
        rpc.close()
