"""The run directory's CSV files and TensorBoard scalars (written without importing torch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from zrl.run.metrics import MetricsWriter, read_csv


def test_metrics_writer_csv_and_tensorboard_scalars(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path)
    writer.write_progress({"time": 1.0, "env_steps": 100, "env_steps_per_s": 50.0, "updates": 3})
    writer.write_eval({"time": 1.5, "env_steps": 100, "mean": 21.5, "std": 2.0})
    writer.close()
    assert read_csv(tmp_path / "progress.csv")[0]["env_steps"] == 100
    assert read_csv(tmp_path / "eval.csv")[0]["mean"] == 21.5
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert "eval/return_mean" in events.Tags()["scalars"]
    (point,) = events.Scalars("eval/return_mean")
    assert (point.step, point.value) == (100, 21.5)
    assert [p.value for p in events.Scalars("progress/env_steps_per_s")] == [50.0]


def test_the_supervisor_does_not_import_torch() -> None:
    # zrl run starts its roles from a zygote that imports torch; the supervisor importing it
    # too would take about 2 s of CPU from them at start-up.
    code = (
        "import sys, tempfile, pathlib; import zrl.run; from zrl.run.metrics import "
        "MetricsWriter; MetricsWriter(pathlib.Path(tempfile.mkdtemp())).close(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
