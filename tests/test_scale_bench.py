"""``benchmarks/scale.py`` section (a) on a tiny budget: its figures come from a registry that
really answered every role.

The floor test runs the registry in this process over inproc (well under a second); the
live test starts a broker process and a simulated-role worker (``Workers`` kills both by PID,
also on failure) and is marked slow."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.benchmarks import load_benchmark


def load_scale() -> ModuleType:
    return load_benchmark("scale")


scale = load_scale()


def test_registry_floor_answers_every_role_and_status_grows_with_them() -> None:
    small = scale.registry_floor(10, beats_per_role=2, statuses=2)
    big = scale.registry_floor(50, beats_per_role=2, statuses=2)
    for row in (small, big):
        assert 0 < row["heartbeat"] < 0.01  # CPU seconds per heartbeat
        assert 0 < row["status"] < 1.0
    # STATUS carries one row per role: five times the roles, about five times the bytes.
    assert 4 * small["status_bytes"] < big["status_bytes"] < 6 * small["status_bytes"]


@pytest.mark.waits
@pytest.mark.slow
def test_registry_section_with_ten_roles_gives_sane_rows() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="zrl-scale-test-"))
    workers = scale.Workers(tmp)
    try:
        row = scale.registry_scale(workers, 10, seconds=2.0, hz=2.0, probe_hz=15.0)
    finally:
        workers.close()
        shutil.rmtree(tmp, ignore_errors=True)
    assert row["welcomed"] == 10 and row["refused"] == []
    assert row["hb_window"] > 0 and row["hb_unacked"] == 0
    assert row["unknown"] == 0
    assert len(row["hb_quiet"]) > 0 and len(row["hb_probed"]) > 0
    assert 0.0 <= row["cpu_hb"] < 1.0 and 0.0 <= row["cpu_probe"] < 1.0
    assert row["rss"] > 10 * 2**20
    assert row["status_rows"] == 11  # the ten roles and the probe
    assert row["status_bytes"] > 10 * 300
    for kind in scale.Probe.KINDS:
        assert row["lat"][kind], kind
        assert 0 < max(row["lat"][kind]) < scale.PROBE_TIMEOUT_S
    assert not any(row["timeouts"].values())


@pytest.mark.waits
@pytest.mark.slow
def test_registry_section_with_host_agents_reports_every_role_through_them() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="zrl-scale-test-"))
    workers = scale.Workers(tmp)
    try:
        row = scale.registry_scale(workers, 10, seconds=2.0, hz=2.0, probe_hz=15.0, per_agent=5)
    finally:
        workers.close()
        shutil.rmtree(tmp, ignore_errors=True)
    # "registered without its agent" would be listed as refused.
    assert row["welcomed"] == 10 and row["refused"] == []
    assert row["hb_window"] > 0 and row["hb_unacked"] == 0
    assert row["unknown"] == 0  # the broker took every report of both agents
    assert row["status_all_rows"] == 13  # the ten roles, two agents and the probe
    assert row["per_agent"] == 5 and row["floor"] is not None
