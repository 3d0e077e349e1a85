"""``benchmarks/pipeline_capacity.py``: its figures from records (the steady window, the cores
per process, what limits), its pieces run briefly on this machine (the bare loop, the
learner's stages on a Pong batch through the no-op APPO update, the report's ratios from the
measured numbers), and the whole benchmark through real processes for a few seconds
(slow)."""

from __future__ import annotations

import json
import math
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.benchmarks import load_benchmark

bench = load_benchmark("pipeline_capacity")


def stats_rows(rate: float, cpu_per_s: float, start: float = 100.0) -> list[dict[str, float]]:
    """The learner's stats lines: nothing for 2 s, then ``rate`` samples/s for 20 s, then the
    stop (the counters stand still)."""
    rows = []
    for i in range(0, 60):
        t = start + 0.5 * i
        moving = min(max(t - start - 2.0, 0.0), 20.0)
        rows.append(
            {
                "time": t,
                "samples": int(rate * moving),
                "batches": int(rate * moving / 1024),
                "cpu_s": 3.0 + cpu_per_s * moving,
                "device_cpu_s": 0.25 * cpu_per_s * moving,
                "machine_busy_s": 1000.0 + 1.5 * (t - start),
                "weights_sent": int(moving),
            }
        )
    return rows


def test_the_steady_window_starts_after_the_warmup_and_ends_at_the_last_batch() -> None:
    rows = stats_rows(rate=2048.0, cpu_per_s=0.1)
    env = [(100.0 + t, 3000.0 * max(t - 1.0, 0.0)) for t in range(0, 40)]
    w = bench.steady_window(rows, env, warmup=5.0)
    assert w is not None
    assert w.t0 >= 102.0 + 5.0 and w.t1 <= 122.0 + 0.5
    assert w.samples_per_s == pytest.approx(2048.0, rel=0.05)
    assert w.env_steps_per_s == pytest.approx(3000.0)
    assert w.machine_cores == pytest.approx(1.5)
    # 0.1 CPU-s per second, a quarter of it device work: 0.075 s per 2048 samples.
    assert w.learner_ms_per_1024 == pytest.approx(1e3 * 0.075 / 2, rel=0.05)
    assert w.device_ms_per_1024 == pytest.approx(1e3 * 0.025 / 2, rel=0.05)
    assert bench.steady_window(stats_rows(0.0, 0.1), env, warmup=5.0) is None


def test_window_cores_counts_each_process_inside_the_window(tmp_path: Path) -> None:
    log = tmp_path / "cpu.csv"
    lines = ["time,pid,label,cpu_s"]
    for t in range(0, 21):
        lines.append(f"{t},1,zrl actor,{0.5 * t}")
        lines.append(f"{t},2,zrl actor,{0.25 * t}")
        lines.append(f"{t},3,python,{0.1 * t}")
        if t >= 12:  # started inside the window: counted from 0
            lines.append(f"{t},4,zrl replay,{0.2 * (t - 12)}")
    log.write_text("\n".join(lines) + "\n")
    cores = bench.window_cores(log, 10.0, 20.0, {3: "learner (no-op update)"})
    assert cores["zrl actor"] == pytest.approx(0.75)
    assert cores["learner (no-op update)"] == pytest.approx(0.1)
    assert cores["zrl replay"] == pytest.approx(0.16)
    assert list(cores)[0] == "zrl actor"  # most first


def test_pipeline_limit_names_the_stages_by_their_cost_per_env_step() -> None:
    # The emulator: 1 core for 2000 steps/s (500 us a step); end to end 1000 steps/s.
    cores = {"zrl actor": 0.8, "zrl broker": 0.35, "zrl replay": 0.1, "this script": 0.05}
    lines = bench.pipeline_limit(1000.0, 2000.0, 1.0, cores, 2, busy=1.95)
    text = "\n".join(lines)
    # actors 800 us less the emulator's 500; broker 350; replay 100: 750 us of stages
    assert "the emulator 500 CPU-us" in text and "the stages 750 CPU-us" in text
    assert "allows 125 (6.0x)" in text
    assert "CPU-bound: 1.95 of 2 cores busy: this run 1.30, other processes 0.65" in text
    assert "zrl broker" in lines[2] and "zrl actor, less the emulator" in lines[3]
    assert "zrl replay" in lines[4] and len(lines) == 5  # this script is no stage
    assert "without it 0.56" in lines[2]  # without the broker: 500 / (500 + 400)
    idle = bench.pipeline_limit(1000.0, 2000.0, 1.0, cores, 2, busy=1.3)
    assert "not CPU-bound" in idle[1]


@pytest.fixture(scope="module")
def measured() -> tuple:
    """The benchmark's pieces on this machine, briefly: the bare loop for 0.3 s and
    the learner's stages on one synthetic Pong batch (``learner_cpu.frame_batch``: the wire
    format of a FIFO shard's batch) through the no-op APPO update for 0.3 s."""
    gpu_host = load_benchmark("gpu_host")
    learner_cpu = load_benchmark("learner_cpu")
    s = bench.atari.settings_from_config(bench.CONFIG, 1)
    bare = bench.atari.bare_atari_rate(4, 0.3, s.atari, 1)
    update = bench.no_model(gpu_host.make_learner_update(bench.CONFIG, "cpu"))
    frames = gpu_host.wire_frames([learner_cpu.frame_batch(np.random.default_rng(0))])
    hs = bench.host_side(update, frames, seconds=0.3, warmup=1)
    return bare, hs


def test_the_pieces_measure_something(measured: tuple) -> None:
    from zrl.algos.kernel import unrolls

    (rate, cores), hs = measured
    assert rate > 0 and 0 < cores <= bench.atari.cores() + 0.5
    assert hs.samples >= 1024 and hs.seconds > 0
    assert set(hs.stages) == {"decode", "check", "stage", "rest of train", "loop"}
    assert all(hs.stages[k] > 0 for k in ("decode", "check", "stage"))
    assert hs.total == pytest.approx(sum(hs.stages.values()))
    assert set(hs.device) == {"frame stacks", "input statistics"}
    assert all(v > 0 for v in hs.device.values()) and hs.gpu_stage > 0
    # the device work's timers are gone after the stages were measured
    assert not isinstance(unrolls.stacks_from_frames, bench.Timed)
    assert not isinstance(unrolls.observe_inputs, bench.Timed)


def test_the_report_takes_its_ratios_from_the_measured_numbers(measured: tuple, capsys) -> None:
    bare, hs = measured
    w = bench.Window(0.0, 10.0, int(0.5 * bare[0] * 10), 0.4, 0.0, 15.0, 0.6 * bare[0])
    run = bench.PipelineRun(w, {"zrl actor": 1.0, "zrl broker": 0.2}, "zrl run x", "", 10)
    args = Namespace(warmup=5.0, device_work=False)
    out = bench.report(args, bare, run, hs, ("1.00 1.00 1.00", "2.00 1.50 1.00"))
    shown = capsys.readouterr().out
    assert out["ratio"] == pytest.approx(w.samples_per_s / bare[0])
    assert out["ratio"] == pytest.approx(0.5, rel=0.01)
    assert out["actors_env_steps_per_s"] == pytest.approx(0.6 * bare[0])
    assert "end to end / bare loop: 0.50  target >= 0.8: NOT MET" in shown
    assert out["learner_host_ms_per_1024"] == pytest.approx(1e3 * 1024 * 0.4 / w.samples)
    assert "learner host side, its stages" in shown and "load average at start 1.00" in shown
    assert out["limits"][0] == "end to end:" and "What limits:" in shown
    assert json.loads(json.dumps(out, default=str))["host_side"]["total"] == hs.total


@pytest.mark.slow
@pytest.mark.waits  # fixed-length steps: the rates it checks are only > 0 (as the lease's)
def test_the_benchmark_runs_through_real_processes(tmp_path: Path) -> None:
    """The whole benchmark for a few seconds: a zrl run with random actors, our learner
    process with the no-op update, the bare loop and the stages (on a synthetic batch: the
    recording run is the lease dry run's (g3), tested in tests/test_gpu_lease.py)."""
    out = tmp_path / "figures.json"
    argv = ["--seconds", "6", "--bare-seconds", "1", "--host-seconds", "1"]
    argv += ["--host-batches", "0", "--warmup", "2", "--envs", "4", "--json", str(out)]
    assert bench.main(argv) == 0
    got = json.loads(out.read_text())
    assert got["e2e_samples_per_s"] > 0 and got["bare"]["env_steps_per_s"] > 0
    assert got["ratio"] == pytest.approx(got["e2e_samples_per_s"] / got["bare"]["env_steps_per_s"])
    assert got["learner_host_ms_per_1024"] > 0 and got["host_side"]["total"] > 0
    assert any(k.startswith("learner") for k in got["cores"])
    assert math.isfinite(got["window"]["machine_busy_s"])
