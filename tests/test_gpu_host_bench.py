"""``benchmarks/gpu_host.py``: its figures from records (the time to a return, the learner's
CPU per 1000 samples) against reference loops, (g1)-(g3) declining without a GPU, and (g3)'s
feeder training a real APPO update on recorded Pong batches (slow)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from tests.helpers.benchmarks import load_benchmark

REPO = Path(__file__).resolve().parents[1]


def load_gpu_host() -> ModuleType:
    return load_benchmark("gpu_host")


gpu_host = load_gpu_host()


def rolling_first(returns: np.ndarray, times: np.ndarray, target: float, window: int) -> float:
    """Reference: the first time the plain mean of the last ``window`` episodes >= target."""
    for i in range(window - 1, len(returns)):
        if returns[i - window + 1 : i + 1].mean() >= target:
            return float(times[i])
    return -1.0


def test_time_to_return_is_the_rolling_mean_of_single_episodes() -> None:
    rng = np.random.default_rng(0)
    returns = np.clip(np.linspace(-21, 35, 600) + rng.normal(0, 3, 600), -21, 21)
    times = np.arange(600) * 0.5 + 10
    episodes = [(float(t), float(r), 1.0) for t, r in zip(times, returns, strict=True)]
    want = rolling_first(returns, times, 18.0, 100)
    assert want > 0  # the series does reach it
    assert gpu_host.time_to_return(episodes, 18.0, 100) == want
    assert gpu_host.time_to_return(episodes, 21.5, 100) is None


def test_time_to_return_weighs_zrl_reports_by_their_episodes() -> None:
    """Reports of 10 episodes each: at each report, the last 10 reports are exactly the last
    100 episodes, so the answer is the per-episode answer at report ends."""
    rng = np.random.default_rng(1)
    returns = np.clip(np.linspace(-21, 35, 1000) + rng.normal(0, 3, 1000), -21, 21)
    times = np.arange(1000, dtype=float)
    reports = [
        (float(times[i + 9]), float(returns[i : i + 10].mean()), 10.0) for i in range(0, 1000, 10)
    ]
    want = next(times[i] for i in range(99, 1000, 10) if returns[i - 99 : i + 1].mean() >= 18.0)
    assert gpu_host.time_to_return(reports, 18.0, 100) == want
    # Fewer than 100 episodes in all: never reached, however high.
    assert gpu_host.time_to_return([(1.0, 21.0, 10.0)] * 9, 18.0, 100) is None


def test_learner_cpu_per_1000_takes_the_steady_window() -> None:
    S = gpu_host.atari.Sample
    samples = [
        S(0.0, 0, 0, 5.0, 9.0),
        S(10.0, 900, 1024, 8.0, 20.0),  # first trained: the warm-up counts from here
        S(15.0, 1500, 2048, 9.0, 25.0),  # inside the warm-up
        S(40.0, 4000, 5120, 12.0, 50.0),
        S(60.0, 6000, 9216, 16.0, 80.0),
        S(61.0, 6000, 9216, 16.5, 81.0),  # the stop: trained nothing more
    ]
    got = gpu_host.learner_cpu_per_1000(samples, warmup=20.0)
    assert got == pytest.approx(1000 * (16.0 - 12.0) / (9216 - 5120))
    assert gpu_host.learner_cpu_per_1000(samples[:1], warmup=0.0) is None
    assert gpu_host.learner_cpu_per_1000(samples, warmup=100.0) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_gpu_sections_say_they_were_not_run_without_a_gpu(capsys) -> None:
    report = gpu_host.main(["--sections", "g1,g2,g3"])
    out = capsys.readouterr().out
    for section in ("g1", "g2", "g3"):
        assert f"({section}) needs a GPU" in out
        assert report[section] == "not run: no GPU"


@pytest.mark.slow
def test_g3_feeds_recorded_pong_batches_to_a_real_appo_update() -> None:
    """One batch recorded from a real actor and FIFO shard, decoded from its wire frames and
    trained on by the update a learner builds: every valid step is counted."""
    msgs = gpu_host.record_batches(gpu_host.PONG_APPO, 1)
    frames = msgs[0].arrays["frames"]
    assert frames.dtype == np.uint8 and frames.shape == (32, 32 + 4, 84, 84)
    update = gpu_host.make_learner_update(gpu_host.PONG_APPO, "cpu")
    got = gpu_host.feed(update, gpu_host.wire_frames(msgs), seconds=0.0, warmup=0)
    assert got.batches == 1 and got.updates == 1
    assert got.samples == int(msgs[0].arrays["valid"].sum()) > 0
    assert got.train_s > 0 and got.input_s > 0 and got.cpu_s > 0


def test_shown_command_is_what_a_user_types() -> None:
    cmd = [
        sys.executable,
        "-m",
        "zrl",
        "run",
        str(REPO / "configs" / "pong_appo.yaml"),
        "--run-dir",
        "/tmp/zrl-gpu-host-x/zrl",
        "--set",
        "seed=0",
    ]
    got = gpu_host.shown_command(cmd)
    assert got == "zrl run configs/pong_appo.yaml --set seed=0"
