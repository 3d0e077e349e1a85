"""The head's training metrics: the Aggregator's ``<role>/<name>`` tags and the logger
backends (TensorBoard and CSV always here; W&B offline and an MLflow file store when their
extras are installed: ``pip install -e ".[wandb]"`` / ``".[mlflow]"``)."""

from __future__ import annotations

import glob
import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from zrl.config.experiment import ExperimentConfig
from zrl.config.sections import LoggingConfig
from zrl.run.aggregator import Aggregator
from zrl.run.metrics import MetricsWriter, MissingExtraError, read_csv

Scalars = dict[str, list[tuple[int, float]]]


def test_aggregator_tags_training_figures_by_role_kind():
    agg = Aggregator()
    agg.on_metrics({"id": "learner-0", "role": "learner", "train": {"loss": 1.0, "lr": 1e-3}})
    agg.on_metrics(
        {
            "id": "actor-0",
            "role": "actor",
            "train": {"episode_return": 10.0, "epsilon_min": 0.1, "epsilon_max": 0.4},
        }
    )
    agg.on_metrics(
        {
            "id": "actor-1",
            "role": "actor",
            "train": {"episode_return": 20.0, "epsilon_min": 0.01, "epsilon_max": 0.2},
        }
    )
    # From the open topic bus: odd names, non-numbers and unknown role kinds are left out.
    agg.on_metrics(
        {
            "id": "actor-2",
            "role": "actor",
            "train": {"Bad Tag": 1.0, "../x": 2.0, "nan": float("nan"), "s": "x"},
        }
    )
    agg.on_metrics({"id": "x-0", "role": "../../x", "train": {"loss": 5.0}})
    agg.on_metrics({"id": "learner-1", "role": "learner", "train": ["loss"]})
    assert agg.train_row() == {
        "actor/episode_return": 15.0,  # the mean over the actors
        "actor/epsilon_max": 0.4,
        "actor/epsilon_min": 0.01,
        "learner/loss": 1.0,
        "learner/lr": 1e-3,
    }
    assert agg.train_row() == {}  # each report is written once


def feed(writer: MetricsWriter) -> Scalars:
    """Progress, an evaluation and two reports of training figures; what every backend must
    then hold."""
    agg = Aggregator()
    expected: Scalars = {}
    for i, env_steps in enumerate((100, 200)):
        agg.on_metrics(
            {
                "id": "learner-0",
                "role": "learner",
                "train": {"loss": 1.0 + i, "grad_norm": 0.5, "policy_lag": 1.0},
            }
        )
        agg.on_metrics(
            {
                "id": "actor-0",
                "role": "actor",
                "train": {"episode_return": 20.0 + i, "episode_length": 20.0 + i},
            }
        )
        row = {"time": float(i), "env_steps": env_steps, "env_steps_per_s": 100.0, "updates": i}
        writer.write_progress(row)
        train = agg.train_row()
        writer.write_train(env_steps, train, float(i))
        progress = {"progress/env_steps_per_s": 100.0, "progress/updates": i}
        for tag, value in {**train, **progress}.items():
            expected.setdefault(tag, []).append((env_steps, value))
    writer.write_eval({"time": 1.5, "env_steps": 200, "mean": 21.5, "std": 2.0})
    expected["eval/return_mean"] = [(200, 21.5)]
    expected["eval/return_std"] = [(200, 2.0)]
    return expected


def tensorboard_scalars(logdir: Path) -> Scalars:
    events = EventAccumulator(str(logdir))
    events.Reload()
    return {
        tag: [(e.step, pytest.approx(e.value)) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def subset(got: Scalars, expected: Scalars) -> Scalars:
    return {tag: got.get(tag, []) for tag in expected}


def test_tensorboard_and_csv_show_the_training_tags(tmp_path: Path):
    writer = MetricsWriter(tmp_path)
    expected = feed(writer)
    writer.close()
    got = tensorboard_scalars(tmp_path / "tensorboard")
    assert {
        "learner/loss",
        "learner/grad_norm",
        "learner/policy_lag",
        "actor/episode_return",
        "actor/episode_length",
        "eval/return_mean",
        "progress/env_steps_per_s",
    } <= set(got)
    assert subset(got, expected) == expected
    # train_metrics.csv: long form, one row per tag and report.
    rows = read_csv_rows(tmp_path / "train_metrics.csv")
    assert rows[0] == {
        "time": "0.0",
        "env_steps": "100",
        "tag": "actor/episode_length",
        "value": "20",
    }
    assert {(r["tag"], int(r["env_steps"])) for r in rows} == {
        (tag, step)
        for tag, points in expected.items()
        for step, _ in points
        if tag.split("/")[0] in ("learner", "actor")
    }
    # progress.csv and eval.csv are as before (zrl plot and --resume read them).
    assert [r["env_steps"] for r in read_csv(tmp_path / "progress.csv")] == [100, 200]
    assert read_csv(tmp_path / "eval.csv")[0]["mean"] == 21.5


def read_csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_logger_whose_extra_is_missing_names_the_extra(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(MissingExtraError, match=r'pip install "zrl\[wandb\]"'):
        MetricsWriter(tmp_path, logging=LoggingConfig(backends=["tensorboard", "wandb"]))


def test_logging_backends_are_validated():
    cfg = ExperimentConfig.model_validate({"logging": {"backends": ["mlflow"], "project": "p"}})
    assert cfg.logging.backends == ["mlflow"]
    with pytest.raises(ValueError):
        ExperimentConfig.model_validate({"logging": {"backends": ["neptune"]}})


# ------------------------------------------------------------------------------------ W&B


def wandb_records(path: str) -> Iterator[bytes]:
    """The records of a W&B ``.wandb`` file: a 7-byte ``:W&B`` header, then LevelDB-log
    framing (32 KiB blocks; per chunk crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, pending, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and n == 0:
            break
        pending += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            yield pending
            pending = b""


def test_wandb_offline_run_holds_the_same_scalars(tmp_path: Path, monkeypatch):
    pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2 as pb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    opts = LoggingConfig(backends=["tensorboard", "wandb"], project="zrl-test", run_name="t")
    writer = MetricsWriter(tmp_path, logging=opts, config={"algo": "ppo", "seed": 1})
    expected = feed(writer)
    writer.close()
    (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    got: Scalars = {}
    for raw in wandb_records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        items = {
            i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item
        }
        for tag, value in items.items():
            if not tag.startswith("_") and tag != "env_steps":
                got.setdefault(tag, []).append((items["env_steps"], pytest.approx(value)))
    assert got == expected
    assert subset(tensorboard_scalars(tmp_path / "tensorboard"), expected) == expected


# --------------------------------------------------------------------------------- MLflow


def test_mlflow_file_store_run_holds_the_same_scalars(tmp_path: Path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    opts = LoggingConfig(backends=["tensorboard", "mlflow"], project="zrl-test", run_name="t")
    writer = MetricsWriter(tmp_path, logging=opts, config={"algo": "ppo", "ppo": {"clip": 0.2}})
    expected = feed(writer)
    writer.close()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("zrl-test")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "t" and run.info.status == "FINISHED"
    assert run.data.params == {"algo": "ppo", "ppo.clip": "0.2"}
    got = {
        tag: [
            (m.step, pytest.approx(m.value))
            for m in client.get_metric_history(run.info.run_id, tag)
        ]
        for tag in run.data.metrics
    }
    assert got == expected
    assert subset(tensorboard_scalars(tmp_path / "tensorboard"), expected) == expected


def test_zrl_run_stops_before_starting_anything_when_an_extra_is_missing(tmp_path, monkeypatch):
    from zrl.run.supervisor import Supervisor

    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    cfg = ExperimentConfig.model_validate({"logging": {"backends": ["mlflow"]}})
    sup = Supervisor(cfg, run_dir=tmp_path / "run", show_status=False, inproc=True)
    with pytest.raises(MissingExtraError, match=r'pip install "zrl\[mlflow\]"'):
        sup.run()
    assert sup.zygote is None and not sup.children
