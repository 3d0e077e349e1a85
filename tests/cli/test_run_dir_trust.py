"""A run directory is data (issue 39, item 5): ``zrl eval``, ``zrl export`` and ``zrl run
--resume`` unpickle its factories.pkl and import the modules it names (factory references in
model.pt, an ``env.id`` package.module:Env-v0) only with ``--trust-run-dir``; a run made from
a script is re-created from ``--script PATH``. Each planted payload writes a marker file when
it runs: the marker is the record of whether it did."""

from __future__ import annotations

import json
import pathlib
import uuid
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch
import yaml
from typer.testing import CliRunner

from tests.helpers.export_runs import write_run
from zrl.cli.main import app
from zrl.config.factories import FACTORIES_FILE
from zrl.testing.processes import output_of

YAML_RUN = {"model": {"hidden": [8]}}


class Touch:
    """Unpickled, it creates ``path`` (and leaves None in its place)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        return pathlib.Path.touch, (self.path,)


def plant_pickle(run_dir: Path, marker: Path) -> Path:
    """A factories.pkl whose unpickling creates ``marker`` and gives no factory (so a trusted
    run goes on with zrl's built-in env and model)."""
    path = run_dir / FACTORIES_FILE
    path.write_bytes(cloudpickle.dumps({"probe": Touch(marker)}))
    return path


def plant_module(directory: Path, marker: Path) -> str:
    """A module in ``directory`` (a fresh name) whose import creates ``marker``; its ``make``
    is a CartPole env factory. The module's name."""
    name = f"zrl_planted_{uuid.uuid4().hex[:12]}"
    directory.mkdir(exist_ok=True)
    (directory / f"{name}.py").write_text(
        "import pathlib\n\nimport gymnasium as gym\n\n"
        f"pathlib.Path({str(marker)!r}).touch()\n\n\n"
        'def make():\n    return gym.make("CartPole-v1")\n'
    )
    return name


def rewrite_model(run_dir: Path, env_id: str | None = None, refs: dict[str, str] | None = None):
    """model.pt with its config's env.id and its factory_refs replaced, as a sender could."""
    path = run_dir / "model.pt"
    saved = torch.load(path, weights_only=True)
    if env_id is not None:
        cfg = json.loads(saved["config"])
        cfg["env"]["id"] = env_id
        saved["config"] = json.dumps(cfg)
    if refs is not None:
        saved["factory_refs"] = refs
    torch.save(saved, path)


def zrl(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run of a YAML config with a plain gymnasium id (CartPole-v1), as zrl run leaves it."""
    write_run(tmp_path / "run", YAML_RUN)
    return tmp_path / "run"


def test_a_yaml_run_evaluates_and_exports_with_no_flag(run_dir: Path):
    result = zrl("eval", str(run_dir), "-n", "2")
    assert result.exit_code == 0, result.output
    out = run_dir / "policy.pt"
    result = zrl("export", str(run_dir), "-f", "torchscript", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.is_file()


def test_a_planted_factories_pkl_is_unpickled_only_with_trust_run_dir(run_dir: Path):
    marker = run_dir.parent / "unpickled"
    pickled = plant_pickle(run_dir, marker)
    out = run_dir / "policy.pt"
    for command in (
        ["eval", str(run_dir), "-n", "2"],
        ["export", str(run_dir), "-f", "torchscript", "-o", str(out)],
    ):
        result = zrl(*command)
        assert result.exit_code == 2, result.output
        assert not marker.exists()
        # The error names the file and both ways on.
        assert str(pickled) in result.output
        assert "--script" in result.output and "--trust-run-dir" in result.output
    assert not out.exists()
    result = zrl("eval", str(run_dir), "-n", "2", "--trust-run-dir")
    assert result.exit_code == 0, result.output
    assert marker.exists()


@pytest.mark.parametrize("where", ["factory_refs", "env.id"])
def test_a_module_model_pt_names_is_imported_only_with_trust_run_dir(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, where: str
):
    marker = run_dir.parent / "imported"
    mods = run_dir.parent / "mods"
    module = plant_module(mods, marker)
    monkeypatch.syspath_prepend(str(mods))
    if where == "factory_refs":
        rewrite_model(run_dir, refs={"env": f"{module}:make"})
    else:
        rewrite_model(run_dir, env_id=f"{module}:CartPole-v1")
    for command in (
        ["eval", str(run_dir), "-n", "2"],
        ["export", str(run_dir), "-f", "torchscript"],
    ):
        result = zrl(*command)
        assert result.exit_code == 2, result.output
        assert not marker.exists()
        assert str(run_dir / "model.pt") in result.output and module in result.output
    result = zrl("eval", str(run_dir), "-n", "2", "--trust-run-dir")
    assert result.exit_code == 0, result.output
    assert marker.exists()


def test_this_module_is_not_imported_from_model_pt(run_dir: Path):
    """The report's case: ``{"env": "this:s"}`` printed the Zen of Python in zrl eval."""
    rewrite_model(run_dir, refs={"env": "this:s"})
    result = zrl("eval", str(run_dir), "-n", "2")
    assert result.exit_code == 2, result.output
    assert "'this:s'" in result.output
    assert "Beautiful is better than ugly" not in result.output


SCRIPT = """
import gymnasium as gym
from torch import nn

import zrl


def make_env():
    return gym.make("CartPole-v1")


class TinyQ(nn.Module):
    def __init__(self, observation_space, action_space):
        super().__init__()
        self.q = nn.Linear(observation_space.shape[0], action_space.n)

    def forward(self, obs):
        return self.q(obs.float())


experiment = zrl.Experiment({"name": "script-run"}, env=make_env, model=TinyQ)
"""


def script_run(tmp_path: Path) -> tuple[Path, Path]:
    """A run made from an experiment script of callables, as zrl run leaves it (model.pt in
    the script's model's layout, a factories.pkl, here planted); the script and the run."""
    from zrl.algos.models import experiment_model
    from zrl.nets.wire import model_to_arrays
    from zrl.roles.evaluated_weights import Evaluated
    from zrl.run.experiment import load_experiment
    from zrl.run.rundir import RunDir

    script = tmp_path / "experiment_script.py"
    script.write_text(SCRIPT)
    experiment = load_experiment(script)
    cfg = experiment.resolved_config()
    env = experiment.factories.env_fn()()  # type: ignore[misc]
    model = experiment_model(
        cfg, env.observation_space, env.action_space, experiment.factories.model_fn()
    )
    env.close()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunDir(run_dir, cfg, experiment.factories).write_model(
        "model.pt", Evaluated(3, model_to_arrays(model), 10.0), "confirmed"
    )
    return script, run_dir


def test_a_script_run_is_made_from_the_script_given(tmp_path: Path):
    script, run_dir = script_run(tmp_path)
    marker = tmp_path / "unpickled"
    plant_pickle(run_dir, marker)
    result = zrl("eval", str(run_dir), "-n", "2", "--script", str(script))
    assert result.exit_code == 0, result.output
    assert not marker.exists()  # the script's factories, not the run directory's
    out = tmp_path / "policy.pt"
    result = zrl(
        "export", str(run_dir), "-f", "torchscript", "-o", str(out), "--script", str(script)
    )
    assert result.exit_code == 0, result.output
    assert out.is_file() and not marker.exists()
    # A reference model.pt names beyond the script's own is still refused.
    rewrite_model(run_dir, refs={"env": "this:s"})
    result = zrl("eval", str(run_dir), "-n", "2", "--script", str(script))
    assert result.exit_code == 2, result.output
    assert "'this:s'" in result.output


def write_config(run_dir: Path, **env: Any) -> None:
    """config.yaml of a YAML run (``env`` merged into its env section), as --resume reads it."""
    from zrl.config.experiment import ExperimentConfig

    cfg = ExperimentConfig.model_validate({"name": "resume-test", **YAML_RUN})
    data = cfg.model_dump(mode="json")
    data["env"].update(env)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(data))


def test_resume_unpickles_and_imports_only_with_trust_run_dir(tmp_path: Path, spawn):
    """``zrl run --resume`` as a real command: refused before anything is written (exit code
    2, the marker absent, the run directory as it was); with --trust-run-dir the pickle is
    loaded (here the run then stops at its mistyped env id, also exit code 2)."""
    pickled_run, module_run, trusted_run = (tmp_path / n for n in ("pkl", "mod", "trusted"))
    for d in (pickled_run, module_run, trusted_run):
        d.mkdir()
    pickle_marker, module_marker, trusted_marker = (
        tmp_path / n for n in ("unpickled", "imported", "trusted-unpickled")
    )
    write_config(pickled_run)
    pickled = plant_pickle(pickled_run, pickle_marker)
    module = plant_module(tmp_path / "mods", module_marker)
    write_config(module_run, id=f"{module}:CartPole-v1")
    write_config(trusted_run, id="CartPol-v1")
    plant_pickle(trusted_run, trusted_marker)
    before = {d: sorted(p.name for p in d.iterdir()) for d in (pickled_run, module_run)}
    env = {"PYTHONPATH": str(tmp_path / "mods")}
    procs = {
        "pkl": spawn("run", "--resume", str(pickled_run), "--inproc", env=env),
        "mod": spawn("run", "--resume", str(module_run), "--inproc", env=env),
        "trusted": spawn(
            "run", "--resume", str(trusted_run), "--inproc", "--trust-run-dir", env=env
        ),
    }
    codes = {name: proc.wait(timeout=120) for name, proc in procs.items()}
    assert codes == {"pkl": 2, "mod": 2, "trusted": 2}
    assert not pickle_marker.exists() and not module_marker.exists()
    assert trusted_marker.exists()
    assert {d: sorted(p.name for p in d.iterdir()) for d in before} == before
    assert str(pickled) in output_of(procs["pkl"])
    assert str(module_run / "config.yaml") in output_of(procs["mod"])
