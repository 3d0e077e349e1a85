"""``zrl export`` on a run directory (``zrl.run.export``): the exported file of a run's saved
weights matches zrl's forward on a few real steps of the run's env, for a Q-network, a
recurrent actor-critic and a continuous policy, in both formats; a corrupted file fails the
check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.export_runs import RUNS, write_run
from zrl.nets.export import FORMATS, Format
from zrl.run.export import TOLERANCE, CheckReport, check_run, default_path, export_run


@pytest.fixture(scope="module", params=sorted(RUNS))
def run_dir(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp(request.param)
    write_run(path, RUNS[request.param])
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_exported_runs_match_zrls_forward_on_the_runs_env(run_dir, fmt: Format):
    path, signature = export_run(run_dir, fmt)
    assert path == default_path(run_dir, fmt) and path.is_file()
    report = check_run(run_dir, path, steps=12, num_envs=2)
    assert report.observations == 24
    assert set(report.differences) == set(signature.outputs)
    assert report.passed and report.max_difference <= TOLERANCE, report.lines()
    assert report.lines()[-1].endswith(": ok")


def test_a_corrupted_onnx_file_fails_the_check(tmp_path):
    import onnx
    from onnx import numpy_helper

    write_run(tmp_path, RUNS["apex_dqn"])
    path, _ = export_run(tmp_path, "onnx", tmp_path / "policy.onnx")
    proto = onnx.load(str(path))
    weights = proto.graph.initializer[0]
    changed = numpy_helper.to_array(weights) + np.float32(1e-3)
    weights.CopyFrom(numpy_helper.from_array(changed, weights.name))
    onnx.save(proto, str(path))
    report = check_run(tmp_path, path, steps=4)
    assert not report.passed and report.max_difference > TOLERANCE
    assert "FAILED" in report.lines()[-1]


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_a_corrupted_torchscript_file_fails_the_check(tmp_path):
    write_run(tmp_path, RUNS["ppo_lstm"])
    path, _ = export_run(tmp_path, "torchscript")
    extra = {"zrl.json": ""}
    module = torch.jit.load(str(path), _extra_files=extra)
    with torch.no_grad():
        next(iter(module.parameters())).mul_(1.01)
    torch.jit.save(module, str(path), _extra_files=extra)
    report = check_run(tmp_path, path, steps=4)
    assert not report.passed and report.max_difference > TOLERANCE


def test_model_picks_the_weights_file_and_names_the_default_path(tmp_path):
    write_run(tmp_path, RUNS["apex_dqn"], name="model_last.pt")
    path, _ = export_run(tmp_path, "torchscript", model_file="model_last.pt")
    assert path == tmp_path / "policy_last.torchscript.pt"
    assert check_run(tmp_path, path, "model_last.pt", steps=3).passed
    with pytest.raises(FileNotFoundError, match="model.pt does not exist"):
        export_run(tmp_path, "onnx")


def test_a_report_without_observations_does_not_pass():
    assert not CheckReport().passed
    assert CheckReport({"action": 0.0, "q_values": 2e-6}, 4).passed
    assert not CheckReport({"action": 1.0, "q_values": 0.0}, 4).passed
