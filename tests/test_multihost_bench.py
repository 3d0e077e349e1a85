"""``benchmarks/multihost.py`` section (C)'s arithmetic: the learner's time shares over a
window, recovered from the cumulative shares its heartbeats carry, and the medians of rounds.

The runs themselves need root and network namespaces (the benchmark); these checks need
neither."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.helpers.benchmarks import load_benchmark


def load_multihost() -> ModuleType:
    return load_benchmark("multihost")


mh = load_multihost()


def cumulative(spent: dict[str, float], since_first_step: float) -> dict[str, float]:
    """A learner heartbeat's ``<part>_share`` fields, as ``Learner.time_shares`` makes them."""
    return {f"{part}_share": s / since_first_step for part, s in spent.items()}


def test_window_shares_recover_the_window_from_cumulative_shares() -> None:
    # Start-up: 10 s of waiting for the first batch, then 20 s of a steady 20/5/70/5 mix.
    t0 = 100.0
    at_h0 = {"wait": 10.0, "copy": 0.0, "update": 0.0, "publish": 0.0}
    window = {"wait": 4.0, "copy": 1.0, "update": 14.0, "publish": 1.0}
    at_h1 = {part: at_h0[part] + window[part] for part in at_h0}
    h0, h1 = t0 + 10.0, t0 + 30.0
    got = mh.window_shares(t0, h0, cumulative(at_h0, 10.0), h1, cumulative(at_h1, 30.0))
    assert got == pytest.approx({f"{p}_share": s / 20.0 for p, s in window.items()})
    # The cumulative share at h1 still carries the start-up's wait; the window's does not.
    assert cumulative(at_h1, 30.0)["wait_share"] == pytest.approx(14 / 30)
    assert got["wait_share"] == pytest.approx(0.2)


def test_window_shares_error_from_a_misplaced_first_step_is_as_documented() -> None:
    t0, h0, h1 = 0.0, 10.0, 30.0
    info0 = cumulative({"wait": 10.0}, 10.0)  # wait share 1.0
    info1 = cumulative({"wait": 14.0}, 30.0)  # wait share 0.4667
    exact = mh.window_shares(t0, h0, info0, h1, info1)["wait_share"]
    off = mh.window_shares(t0 + 0.5, h0, info0, h1, info1)["wait_share"]
    bound = (info0["wait_share"] - info1["wait_share"]) * 0.5 / (h1 - h0)
    assert exact == pytest.approx(0.2)
    assert abs(off - exact) == pytest.approx(abs(bound))


def test_window_shares_skip_parts_a_heartbeat_lacks() -> None:
    got = mh.window_shares(0.0, 1.0, {"wait_share": 1.0}, 2.0, {"wait_share": 0.5})
    assert set(got) == {"wait_share"}
    assert got["wait_share"] == pytest.approx(0.0)
    assert mh.window_shares(0.0, 2.0, {"wait_share": 1.0}, 2.0, {"wait_share": 1.0}) == {}


def test_first_step_time_is_the_midpoint_around_the_first_heartbeat_with_shares() -> None:
    def rec(t: float, age: float, info: dict[str, float]) -> dict[str, object]:
        return {"t": t, "roles": [{"id": "learner-0", "age": age, "info": info}]}

    records = [
        {"t": 0.5, "roles": []},
        rec(1.0, 0.1, {"updates": 0}),
        rec(1.5, 0.2, {"updates": 0, "wait_share": 1.0}),
        rec(2.0, 0.1, {"updates": 3, "wait_share": 0.5}),
    ]
    assert mh.first_step_time(records) == pytest.approx((0.9 + 1.3) / 2)
    assert mh.first_step_time(records[2:]) == pytest.approx(1.3)
    assert mh.first_step_time(records[:2]) is None


def test_median_run_takes_each_fields_median() -> None:
    def run(steps: float, wait: float) -> dict[str, object]:
        return {
            "steps_per_s": steps,
            "updates_per_s": steps / 100,
            "samples_per_s": steps,
            "fifo_fill": 0.5,
            "fifo_full": 0.0,
            "cores_learner": 0.2,
            "cores_actors": 0.6,
            "cores_other": 0.1,
            "shares": {"wait_share": wait},
        }

    got = mh.median_run([run(300.0, 0.1), run(100.0, 0.3), run(200.0, 0.2)])
    assert got["steps_per_s"] == 200.0
    assert got["updates_per_s"] == 2.0
    assert got["shares"] == {"wait_share": 0.2}
    two = mh.median_run([run(100.0, 0.1), run(200.0, 0.2)])
    assert two["steps_per_s"] == 150.0
    assert two["shares"]["wait_share"] == pytest.approx(0.15)
