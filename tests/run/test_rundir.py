"""``RunDir``: the run directory, and the summary a resumed run keeps of its earlier segments.

A segment is one `zrl run` or one `zrl run --resume` of it. Each is played here as the
supervisor plays it, without any role: ``prepare``, progress rows, then ``summary`` written to
summary.json, with the wall time faked through ``started``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import Factories
from zrl.run.aggregator import Aggregator
from zrl.run.metrics import MetricsWriter
from zrl.run.roster import Roster
from zrl.run.rundir import ACROSS_SEGMENTS, UNFINISHED_SEGMENT, RunDir, earlier_segments
from zrl.run.stop_rule import StopRule
from zrl.testing.fakes import welcome_message
from zrl.utils.durable import atomic_write_text


def config() -> ExperimentConfig:
    return ExperimentConfig.model_validate({"name": "rundir-test", "stop": {"wall_time": 60}})


def segment(
    path: Path,
    *,
    resume: bool,
    wall_time: float,
    steps: list[int],
    stop_reason: str = "wall_time",
    write_summary: bool = True,
) -> dict[str, Any]:
    """One segment: its progress rows reach ``steps`` (counted from where it resumed, as
    the aggregator counts), then its summary; the summary (written unless it was killed)."""
    cfg = config()
    rundir, agg = RunDir(path, cfg, Factories()), Aggregator()
    rundir.prepare(agg, resume=resume)
    writer = MetricsWriter(path, tensorboard=False)
    try:
        for i, n in enumerate(steps):
            writer.write_progress(
                {
                    "time": float(i + 1),
                    "env_steps": agg.env_steps_offset + n,
                    "updates": 10 * (i + 1),
                }
            )
    finally:
        writer.close()
    row = {"env_steps": agg.env_steps_offset + steps[-1], "updates": 10 * len(steps)}
    summary = rundir.summary(
        row,
        None,
        stop_reason=stop_reason,
        fatal="",
        fatal_tail=[],
        target=StopRule(cfg),
        agg=agg,
        started=time.monotonic() - wall_time,
        first_env_step=1.0,
        evals_dropped=0,
        roster=Roster.of([], {}, wait_s=None),
        restarts_here={},
    )
    if write_summary:
        atomic_write_text(path / "summary.json", json.dumps(summary, indent=2))
    return summary


def test_a_first_segment_is_the_whole_run(tmp_path: Path):
    run = tmp_path / "run"
    first = segment(run, resume=False, wall_time=12.0, steps=[100, 200])
    assert first["segment"] == 1 and first["segments"] == []
    assert first["total_wall_time"] == first["wall_time"] == pytest.approx(12.0, abs=0.5)
    assert first["resumed_at_env_steps"] == 0 and first["env_steps"] == 200
    assert json.loads((run / "summary.json").read_text()) == first


def test_a_resumed_run_keeps_the_summaries_of_its_earlier_segments(tmp_path: Path):
    run = tmp_path / "run"
    first = segment(run, resume=False, wall_time=12.0, steps=[100, 200], stop_reason="interrupted")
    second = segment(run, resume=True, wall_time=30.0, steps=[50, 150])
    assert second["segment"] == 2 and second["stop_reason"] == "wall_time"
    assert second["resumed_at_env_steps"] == 200 and second["env_steps"] == 350
    # The first segment's summary, as it was, less what describes the whole run.
    assert second["segments"] == [{k: v for k, v in first.items() if k not in ACROSS_SEGMENTS}]
    assert second["segments"][0]["stop_reason"] == "interrupted"
    assert second["total_wall_time"] == pytest.approx(first["wall_time"] + second["wall_time"])
    # A third: the list grows flat, earliest first.
    third = segment(run, resume=True, wall_time=5.0, steps=[10])
    saved = json.loads((run / "summary.json").read_text())
    assert saved == third and third["segment"] == 3
    assert [s["env_steps"] for s in third["segments"]] == [200, 350]
    assert [s["stop_reason"] for s in third["segments"]] == ["interrupted", "wall_time"]
    assert third["total_wall_time"] == pytest.approx(
        first["wall_time"] + second["wall_time"] + third["wall_time"]
    )
    assert third["resumed_at_env_steps"] == 350 and third["env_steps"] == 360


def test_a_segment_killed_before_its_summary_is_kept_from_its_progress_rows(tmp_path: Path):
    run = tmp_path / "run"
    first = segment(run, resume=False, wall_time=12.0, steps=[100, 200])
    # The second one is killed: progress rows, no summary.json of its own.
    segment(run, resume=True, wall_time=40.0, steps=[100, 300, 400], write_summary=False)
    assert json.loads((run / "summary.json").read_text()) == first
    third = segment(run, resume=True, wall_time=8.0, steps=[20])
    assert third["segment"] == 3 and third["resumed_at_env_steps"] == 600
    killed = third["segments"][1]
    assert killed["error"] == UNFINISHED_SEGMENT and killed["stop_reason"] == "unknown"
    # From its last progress row: 3 rows, one a second.
    assert (killed["env_steps"], killed["updates"], killed["wall_time"]) == (600, 30, 3.0)
    assert third["total_wall_time"] == pytest.approx(first["wall_time"] + 3.0 + third["wall_time"])


def test_an_unreadable_summary_leaves_what_progress_csv_says(tmp_path: Path):
    run = tmp_path / "run"
    segment(run, resume=False, wall_time=12.0, steps=[100, 200])
    (run / "summary.json").write_text('{"cut off')
    second = segment(run, resume=True, wall_time=3.0, steps=[5])
    # The segment known from progress.csv alone, marked unfinished.
    assert [s["env_steps"] for s in second["segments"]] == [200]
    assert second["segments"][0]["error"] == UNFINISHED_SEGMENT


def test_earlier_segments_tolerates_what_a_hand_edited_summary_holds():
    assert earlier_segments(None, []) == []
    assert earlier_segments([1, 2], []) == []  # not a summary at all
    odd = {"env_steps": "many", "segments": [3, {"env_steps": 5}, "x"]}
    got = earlier_segments(odd, [{"time": 2.0, "env_steps": 9.0, "updates": 1.0}])
    assert got[:2] == [{"env_steps": 5}, {"env_steps": "many"}]
    assert got[2]["env_steps"] == 9 and got[2]["error"] == UNFINISHED_SEGMENT


def test_a_copied_run_directory_resumes_into_itself(tmp_path: Path, monkeypatch):
    """Issue 27, observation 12: config.yaml kept the absolute checkpoint.dir, so resuming a
    copy of a run directory wrote into the original. Played as `zrl run --resume COPY` plays
    it: the config read back from the copy (``load_resumable``), the run directory prepared,
    the broker's command line (its config is COPY/config.yaml) and the roles' checkpoint root,
    down to the learner's checkpoint file."""
    import shutil

    import zmq

    from zrl.cli.common import load_resumable
    from zrl.config.experiment import load_config
    from zrl.roles.learner import Learner
    from zrl.run import pool as pool_module
    from zrl.run.children import Child
    from zrl.run.placement import BrokerAccess, role_trust_args
    from zrl.run.pool import ChildPool

    original, copy = tmp_path / "original", tmp_path / "copy"
    segment(original, resume=False, wall_time=5.0, steps=[100])
    assert "dir: checkpoints\n" in (original / "config.yaml").read_text()
    (original / "checkpoints").mkdir()
    (original / "checkpoints" / "learner-0.pt").write_bytes(b"the original's")
    shutil.copytree(original, copy)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in original.rglob("*"))

    cfg, factories = load_resumable(copy, None)
    RunDir(copy, cfg, factories).prepare(Aggregator(), resume=True)
    own = (copy / "checkpoints").resolve()
    assert cfg.checkpoint.dir == str(own)
    assert "dir: checkpoints\n" in (copy / "config.yaml").read_text()  # still relative
    trust = role_trust_args(cfg, factories)
    assert trust[trust.index("--checkpoint-root") + 1] == str(own)

    launched: list[list[str]] = []
    monkeypatch.setattr(pool_module, "launch", lambda argv, *a, **k: launched.append(argv))
    ctx = zmq.Context.instance()
    access = BrokerAccess.of(
        cfg, inproc=False, port=None, keys_dir=None, insecure=False, inproc_name="copy"
    )
    pool = ChildPool(
        cfg, factories, RunDir(copy, cfg, factories), access, ctx, inproc=False, log_level="INFO"
    )
    pool.spawn(Child("broker", None, copy / "logs" / "broker.log"))
    (argv,) = launched
    config_path = argv[argv.index("--config") + 1]
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    broker_cfg = load_config(config_path, overrides)  # what `zrl start broker` reads
    assert config_path == str(copy / "config.yaml") and broker_cfg.checkpoint.dir == str(own)

    learner = Learner("tcp://127.0.0.1:1", ctx=ctx, checkpoint_root=own)
    welcome = welcome_message(broker_cfg.model_dump(mode="json"), "learner-0")
    learner._on_welcome(welcome)
    assert learner.checkpoint_path() == own / "learner-0.pt"
    assert sorted((p.name, p.stat().st_mtime_ns) for p in original.rglob("*")) == before


def test_a_checkpoint_dir_of_the_users_stays_where_it_was(tmp_path: Path, monkeypatch):
    """Only a run's own checkpoints move with it: a directory the config names outside the
    run directory (relative to where `zrl run` started) is kept, resolved."""
    monkeypatch.chdir(tmp_path)
    cfg = ExperimentConfig.model_validate({"name": "x", "checkpoint": {"dir": "shared/ckpt"}})
    RunDir(tmp_path / "run", cfg, Factories()).prepare(Aggregator(), resume=False)
    shared = str((tmp_path / "shared" / "ckpt").resolve())
    assert cfg.checkpoint.dir == shared
    assert f"dir: {shared}\n" in (tmp_path / "run" / "config.yaml").read_text()
    inside = ExperimentConfig.model_validate({"name": "x", "checkpoint": {"dir": "run/ck"}})
    RunDir(tmp_path / "run", inside, Factories()).prepare(Aggregator(), resume=False)
    assert "dir: ck\n" in (tmp_path / "run" / "config.yaml").read_text()
    resumed = ExperimentConfig.model_validate({"name": "x", "checkpoint": {"dir": "ck"}})
    RunDir(tmp_path / "run", resumed, Factories()).prepare(Aggregator(), resume=True)
    assert resumed.checkpoint.dir == str((tmp_path / "run" / "ck").resolve())


@pytest.mark.parametrize("head", ["run", "start broker"])
def test_a_new_run_in_a_directory_that_holds_one_is_refused_at_once(tmp_path: Path, head: str):
    """`--run-dir` of an earlier run: refused before anything starts (exit code 2, the message
    naming the directory), that run's files left byte for byte; `--resume` goes on with it."""
    import subprocess
    import sys

    from zrl.testing.processes import REPO

    run = tmp_path / "exp1"
    segment(run, resume=False, wall_time=5.0, steps=[100])
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    config = REPO / "configs" / "cartpole_apex_dqn.yaml"
    args = {
        "run": ["run", str(config)],
        "start broker": ["start", "broker", "--config", str(config)],
    }
    done = subprocess.run(
        [sys.executable, "-m", "zrl", *args[head], "--run-dir", str(run)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-2000:])
    assert str(run) in done.stderr and "--resume" in done.stderr, done.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_only_a_directory_with_a_runs_files_is_taken(tmp_path: Path):
    from zrl.run.rundir import RUN_MARKS, RunDirTaken, refuse_taken

    refuse_taken(tmp_path / "new")  # none yet
    (tmp_path / "empty" / "logs").mkdir(parents=True)
    refuse_taken(tmp_path / "empty")  # a directory made ahead, or an empty logs/: not a run
    for name in RUN_MARKS:
        (tmp_path / name).mkdir()
        (tmp_path / name / name).write_text("")
        with pytest.raises(RunDirTaken, match="zrl start broker --resume"):
            refuse_taken(tmp_path / name, "zrl start broker --resume")
