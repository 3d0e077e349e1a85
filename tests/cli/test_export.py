"""``zrl export RUN``: writes the file and says its signature; ``--check`` and ``--check-file``
print the differences and exit 1 on a corrupted file; bad options and a missing extra are
one-line errors (exit code 2); and the onnxruntime program of docs/export.md plays the same
CartPole episode as zrl's own greedy policy."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from tests.helpers.export_runs import RUNS, write_run
from zrl.cli.main import app
from zrl.nets.discrete import greedy_actions
from zrl.nets.export import EXPORT_INSTALL

DOCS = Path(__file__).resolve().parents[2] / "docs" / "export.md"


def zrl(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def test_export_writes_checks_and_fails_on_a_corrupted_file(tmp_path):
    write_run(tmp_path, RUNS["apex_dqn"])
    code, out = zrl("export", tmp_path, "--check")
    assert code == 0, out
    lines = out.strip().splitlines()
    assert lines[0] == f"wrote {tmp_path / 'policy.onnx'}: inputs obs -> outputs action, q_values"
    assert lines[1].startswith("compared 100 observations: action 0.00e+00, q_values ")
    assert re.fullmatch(r"max difference \S+: ok", lines[2])

    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(tmp_path / "policy.onnx"))
    bias = proto.graph.initializer[-1]
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + 0.01, bias.name))
    onnx.save(proto, str(tmp_path / "corrupted.onnx"))
    code, out = zrl("export", tmp_path, "--check-file", tmp_path / "corrupted.onnx")
    assert code == 1, out
    assert "wrote" not in out and "FAILED: more than 1e-05" in out


def test_torchscript_and_the_model_option(tmp_path):
    write_run(tmp_path, RUNS["ppo_lstm"], name="model_best.pt")
    code, out = zrl("export", tmp_path, "-f", "torchscript", "--model", "model_best.pt", "--check")
    assert code == 0, out
    assert out.startswith(
        f"wrote {tmp_path / 'policy_best.torchscript.pt'}: inputs obs, state -> outputs "
        "action, logits, value, next_state"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--format", "tflite"], "'tflite' is not one of onnx, torchscript"),
        (["--model", "../x.pt"], "'../x.pt' is not one of model.pt"),
        (["--check-file", "policy.bin"], "ends in .onnx (ONNX) or .pt (TorchScript)"),
    ],
)
def test_bad_options_are_one_line_errors(args, message, tmp_path):
    write_run(tmp_path, RUNS["apex_dqn"])
    code, out = zrl("export", tmp_path, *args)
    assert code == 2 and message in " ".join(out.split()), out


def test_another_runs_policy_is_named_not_compared(tmp_path):
    write_run(tmp_path / "dqn", RUNS["apex_dqn"])
    write_run(tmp_path / "lstm", RUNS["ppo_lstm"])
    assert zrl("export", tmp_path / "lstm")[0] == 0
    code, out = zrl("export", tmp_path / "dqn", "--check-file", tmp_path / "lstm" / "policy.onnx")
    assert code == 2 and "is not a policy of this run's model" in " ".join(out.split()), out


def test_a_missing_extra_names_the_install_line(tmp_path, monkeypatch):
    write_run(tmp_path, RUNS["apex_dqn"])
    monkeypatch.setitem(sys.modules, "onnx", None)
    code, out = zrl("export", tmp_path)
    assert code == 2 and EXPORT_INSTALL in out, out


def docs_program() -> str:
    """The Python program of docs/export.md's "Playing an episode" section."""
    section = DOCS.read_text().split("## Playing an episode with onnxruntime", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("run", ["apex_dqn", "ppo_lstm"])
def test_the_docs_program_plays_zrls_greedy_episode(run, tmp_path):
    assert len(docs_program().splitlines()) <= 25  # "a 20-line program"
    model = write_run(tmp_path, RUNS[run])
    code, out = zrl("export", tmp_path)
    assert code == 0, out
    play = tmp_path / "play.py"
    play.write_text(docs_program())
    done = subprocess.run(
        [sys.executable, str(play), str(tmp_path / "policy.onnx")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # The same episode played by zrl's forward.
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    state = model.initial_state(1) if run == "ppo_lstm" else None
    total, finished = 0.0, False
    with torch.no_grad():
        while not finished:
            x = torch.from_numpy(obs[None].astype(np.float32))
            if state is None:
                action = int(greedy_actions(model, x)[0])
            else:
                logits, _, state = model.step(x, state)
                action = int(logits.argmax(dim=1)[0])
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            finished = terminated or truncated
    assert done.stdout.strip() == f"return {total}"
