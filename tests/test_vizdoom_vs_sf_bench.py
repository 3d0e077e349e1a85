"""``benchmarks/vizdoom_vs_sf.py``: the time to a training return read off a run's records,
and the settings both systems get from the shipped config."""

from __future__ import annotations

from types import ModuleType

from tests.helpers.benchmarks import load_benchmark


def load_bench() -> ModuleType:
    return load_benchmark("vizdoom_vs_sf")


def test_first_at_is_the_first_mean_of_20_episodes_at_the_threshold_from_the_launch() -> None:
    bench = load_bench()
    sf = bench.Run(bench.SF, launched=1000.0)
    # Single episodes (Sample Factory): one lucky +90 among misses is not the threshold.
    sf.episodes = [(1010.0 + i, 90.0 if i == 0 else -300.0, 1.0) for i in range(19)]
    sf.episodes += [(1100.0 + i, 90.0, 1.0) for i in range(40)]
    got = bench.first_at(sf, 50.0)
    # The first window of 20 whose mean reaches 50: k newest at +90, 20 - k older at -300.
    k = next(k for k in range(21) if (90.0 * k - 300.0 * (20 - k)) / 20 >= 50.0)
    assert got == 100.0 + (k - 1)
    zrl = bench.Run(bench.ZRL, launched=1000.0)
    # zrl's reports weigh by their episodes, in any order in the records.
    zrl.episodes = [(1030.0, 60.0, 10.0), (1010.0, -300.0, 5.0), (1020.0, 70.0, 10.0)]
    assert bench.first_at(zrl, 50.0) == 30.0
    assert bench.first_at(zrl, 70.0) is None


def test_the_settings_come_from_the_shipped_config() -> None:
    bench = load_bench()
    s = bench.settings_from_config(bench.CONFIG, 4)
    assert (s.rollout, s.batch, s.minibatch, s.epochs) == (32, 256, 256, 1)
    assert bench.SF_LAUNCHER.is_file()
