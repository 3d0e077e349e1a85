"""``benchmarks/pbt_vs_fixed.py``: the two arms differ only in whether PBT rounds come, and
the summary reads the best member and the first time at the threshold off the curve."""

from __future__ import annotations

from types import ModuleType

from tests.helpers.benchmarks import load_benchmark
from zrl.config.experiment import load_config


def load_bench() -> ModuleType:
    return load_benchmark("pbt_vs_fixed")


def test_both_arms_are_valid_configs_that_differ_only_in_the_ready_interval() -> None:
    bench = load_bench()
    arms = {}
    for pbt in (True, False):
        items = bench.overrides(4, 1e-4, 15.0, pbt)
        arms[pbt] = load_config(bench.CONFIG, items + ["stop.wall_time=150"])
    fixed, pbt_cfg = arms[False], arms[True]
    assert pbt_cfg.pbt.ready_interval_s == 15.0
    assert fixed.pbt.ready_interval_s == bench.NEVER_S > 150  # no round within the run
    for cfg in (fixed, pbt_cfg):
        assert cfg.pbt.members == cfg.roles.learners == cfg.roles.actors == 4
        assert cfg.learner.lr == 1e-4
    fixed.pbt.ready_interval_s = pbt_cfg.pbt.ready_interval_s
    assert fixed.model_dump() == pbt_cfg.model_dump()  # equal compute: the same roles


def test_summary_takes_the_best_member_and_the_first_time_at_the_threshold() -> None:
    bench = load_bench()
    arm = {
        "curve": [
            (4.0, {"member_0": 20.0, "member_1": 30.0}),
            (6.0, {"member_0": 410.0, "member_1": 90.0}),
            (8.0, {"member_0": 380.0, "member_1": 395.0}),
        ],
        "exploits": 3,
        "hyperparameters": {},
    }
    summary = bench.summarize(arm, 400.0)
    assert summary["best_final_fitness"] == 395.0
    assert summary["time_to_threshold_s"] == 6.0 and summary["exploits"] == 3
    assert bench.summarize({**arm, "curve": arm["curve"][:1]}, 400.0)["time_to_threshold_s"] is None
