"""Run-directory metrics: CSV files, TensorBoard event files, W&B and MLflow loggers, and the
learning-curve plot."""

from __future__ import annotations

import csv
import logging as _logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zrl.config.experiment import ConfigError
from zrl.config.multiagent import FIXED_PLAYERS, is_multiagent

if TYPE_CHECKING:
    from zrl.config.sections import LoggingConfig

log = _logging.getLogger("zrl.run.metrics")

PROGRESS_FIELDS = [
    "time",
    "env_steps",
    "env_steps_per_s",
    "updates",
    "updates_per_s",
    "replay_size",
    "samples_per_insert",
    "weights_version",
    "max_version_lag",
    "eval_return",
    "samples_trained",  # distinct env steps the learners trained on, each once
    "samples_trained_per_s",
    "eval_version",  # the weights version eval_return is of
    "eval_age_s",  # seconds since that evaluation ended
]
OUTCOME_FIELDS = [
    f"{opponent}_{outcome}_rate"
    for opponent in FIXED_PLAYERS
    for outcome in ("win", "draw", "loss")
]
"""Win/draw/loss shares of a turn-based game's evaluation against the fixed opponents (empty
in the CSV for other envs)."""
SEATS = ("first", "second")
SEAT_OUTCOME_FIELDS = [
    f"{opponent}_{seat}_{outcome}_rate"
    for opponent in FIXED_PLAYERS
    for seat in SEATS
    for outcome in ("win", "draw", "loss")
]
"""The same shares per seat: the games where the evaluated policy moved first, and second."""
SEARCH_PREFIX = "search_"
"""The evaluation figures of an algorithm's search player (``Algorithm.search_player``)."""
EXPLOITABILITY_FIELDS = [
    "exploitability",
    "exploitability_first",
    "exploitability_second",
    "losing_lines",
]
"""A small board game's exploitability of the greedy policy (``evaluator.exploitability``):
the best response's win rate over both seats, the policy's outcome under it moving first and
second (+1 win, 0 draw, -1 loss), and the opponent lines that beat it (empty for other envs)."""
EXPLOITABILITY_RANGES = (
    ("exploitability", 0.0, 1.0),
    ("exploitability_first", -1.0, 1.0),
    ("exploitability_second", -1.0, 1.0),
    ("losing_lines", 0.0, 1e6),  # tic-tac-toe has fewer than 9! move sequences
)
"""Each exploitability field and its range: the head keeps a value only within it."""
SEARCH_OUTCOME_FIELDS = [SEARCH_PREFIX + f for f in (*OUTCOME_FIELDS, *SEAT_OUTCOME_FIELDS)]
SEARCH_EXPLOITABILITY_FIELDS = [SEARCH_PREFIX + f for f in EXPLOITABILITY_FIELDS]
ALL_OUTCOME_FIELDS = [*OUTCOME_FIELDS, *SEAT_OUTCOME_FIELDS, *SEARCH_OUTCOME_FIELDS]
"""Every share an evaluation may report, each in [0, 1]."""
ALL_EXPLOITABILITY_RANGES = (
    *EXPLOITABILITY_RANGES,
    *((SEARCH_PREFIX + key, low, high) for key, low, high in EXPLOITABILITY_RANGES),
)
BASE_EVAL_FIELDS = [
    "time",
    "env_steps",
    "weights_version",
    "mean",
    "std",
    "min",
    "max",
    "episodes",
]
"""The columns of every run's eval.csv."""
EVAL_FIELDS = [
    *BASE_EVAL_FIELDS,
    *OUTCOME_FIELDS,
    *SEAT_OUTCOME_FIELDS,
    *SEARCH_OUTCOME_FIELDS,
    *EXPLOITABILITY_FIELDS,
    *SEARCH_EXPLOITABILITY_FIELDS,
]
"""Every column an eval.csv can have (``eval_fields`` picks a run's)."""


def eval_fields(config: Mapping[str, Any] | None) -> list[str]:
    """eval.csv's columns for a run of ``config`` (``ExperimentConfig.model_dump``), only
    those its evaluations can fill: ``BASE_EVAL_FIELDS``; for a turn-based game, the
    win/draw/loss rates against each of ``env.multiagent.eval_opponents``, overall and per
    seat; where ``evaluator.exploitability`` computes it (tic-tac-toe),
    ``EXPLOITABILITY_FIELDS``; for an algorithm with a search player (alphazero), the same
    of that player (``search_...``). Every column (``EVAL_FIELDS``) without a config."""
    if config is None:
        return list(EVAL_FIELDS)
    from zrl.envs.multiagent.search import enumerable_game

    env = config.get("env") or {}
    env_id = str(env.get("id", ""))
    fields = list(BASE_EVAL_FIELDS)
    multiagent = env.get("multiagent") or {}
    searches = _has_search_player(str(config.get("algo", "")))
    if is_multiagent(env_id) and _turn_based(env_id, str(multiagent.get("api", "auto"))):
        opponents = dict.fromkeys(multiagent.get("eval_opponents") or ["random"])
        rates = [f for f in OUTCOME_FIELDS if f.rsplit("_", 2)[0] in opponents]
        rates += [f for f in SEAT_OUTCOME_FIELDS if f.rsplit("_", 3)[0] in opponents]
        fields += rates
        if searches:
            fields += [SEARCH_PREFIX + f for f in rates]
    exploitability = (config.get("evaluator") or {}).get("exploitability", "auto")
    if exploitability is not False and enumerable_game(env_id) is not None:
        fields += EXPLOITABILITY_FIELDS
        if searches:
            fields += SEARCH_EXPLOITABILITY_FIELDS
    return fields


def _has_search_player(algo: str) -> bool:
    """Whether the evaluator also plays algorithm ``algo``'s search player."""
    from zrl.algos.registry import get_algorithm

    try:
        return get_algorithm(algo).searches
    except ValueError:  # an algorithm this process does not know: no such columns
        return False


def _turn_based(env_id: str, api: str) -> bool:
    """Whether the evaluator plays the PettingZoo env ``env_id`` as a turn-based game (its
    AEC API: ``env.multiagent.api``, for auto the env having no parallel API)."""
    from zrl.envs.multiagent.pettingzoo import MultiAgentEnvError, env_module

    if api != "auto":
        return api == "aec"
    try:
        return not hasattr(env_module(env_id), "parallel_env")
    except MultiAgentEnvError:  # not installed: the run fails before any evaluation
        return True


class ScalarWriter:
    """TensorBoard scalars through tensorboard's own event-file writer.

    Not torch's ``SummaryWriter``: importing torch costs the supervisor about 2 s of CPU,
    taken from the roles it has just started on a small machine."""

    def __init__(self, logdir: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer = EventFileWriter(str(logdir))

    @staticmethod
    def preload() -> None:
        """Import what writing events takes (0.3 s of CPU), while the caller waits anyway."""
        from tensorboard.compat.proto.event_pb2 import Event  # noqa: F401
        from tensorboard.compat.proto.summary_pb2 import Summary  # noqa: F401
        from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: F401

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])
        self.writer.add_event(Event(summary=summary, step=step, wall_time=time.time()))

    def close(self) -> None:
        self.writer.close()


TRAIN_FIELDS = ["time", "env_steps", "tag", "value"]
LEAGUE_FIELDS = ["time", "env_steps", "name", "value"]
"""league.csv, in long form: one row per figure and record (``league_figures``)."""
MAX_LEAGUE_MEMBERS = 32
"""Pool members (``main_vs``), learning players and Elo ratings the head keeps of a league."""
MEMBER_NAME = re.compile(r"[A-Za-z0-9_.:@+-]{1,64}")
LEAGUE_COUNTS = ("games", "snapshots", "elo_main", "main_win_rate")


def league_record(info: Any) -> dict[str, Any] | None:
    """Main's figures in a league role's heartbeat ``info`` (``zrl.roles.league``), checked
    and bounded as the head keeps them (summary.json's ``league``): game and snapshot counts,
    main's Elo and win rate over its snapshots, its win rate against each pool member
    (``main_vs``), each learning player's win rate, Elo and snapshots (``players``) and the
    top Elo ratings (``elo_top``); numbers only, at most ``MAX_LEAGUE_MEMBERS`` names of each
    kind, each a short plain name. None when ``info`` is no league's."""
    if not isinstance(info, dict) or not isinstance(info.get("elo_top"), dict):
        return None
    record: dict[str, Any] = {k: info[k] for k in LEAGUE_COUNTS if _is_number(info.get(k))}

    def named(value: Any, figures: Callable[[Any], Any]) -> dict[str, Any]:
        if not isinstance(value, dict):
            return {}
        out: dict[str, Any] = {}
        for name, v in list(value.items())[:MAX_LEAGUE_MEMBERS]:
            kept = figures(v)
            if isinstance(name, str) and MEMBER_NAME.fullmatch(name) and kept is not None:
                out[name] = kept
        return out

    def rate(v: Any) -> float | None:
        return v if _is_number(v) else None

    def player(v: Any) -> dict[str, float] | None:
        if not isinstance(v, dict):
            return None
        return {k: v[k] for k in ("win_rate", "elo", "snapshots", "resets") if _is_number(v.get(k))}

    record["main_vs"] = named(info.get("main_vs"), rate)
    record["players"] = named(info.get("players"), player)
    record["elo_top"] = named(info.get("elo_top"), rate)
    return record


def league_figures(
    record: dict[str, Any], evaluation: Mapping[str, Any] | None
) -> dict[str, float]:
    """One league.csv record as ``name -> value``: the league's counts, ``main_vs/<member>``,
    ``<player>/<figure>``, ``elo/<name>``, and from the latest ``evaluation`` (an eval.csv
    row) the win/draw/loss rates against the reference opponents and the exploitability as
    ``eval/<field>``."""
    out: dict[str, float] = {k: record[k] for k in LEAGUE_COUNTS if k in record}
    out.update({f"main_vs/{k}": v for k, v in record.get("main_vs", {}).items()})
    for name, figures in record.get("players", {}).items():
        out.update({f"{name}/{k}": v for k, v in figures.items()})
    out.update({f"elo/{k}": v for k, v in record.get("elo_top", {}).items()})
    if evaluation is not None:
        for key in (*OUTCOME_FIELDS, *EXPLOITABILITY_FIELDS):
            if _is_number(evaluation.get(key)):
                out[f"eval/{key}"] = evaluation[key]
    return out


def exploitability_summary(evals: list[dict[str, Any]]) -> dict[str, Any] | None:
    """summary.json's ``exploitability``: the last evaluation's figures
    (``EXPLOITABILITY_FIELDS``, with its weights version) and the best (lowest) value with
    its weights version; None when no evaluation computed it."""
    found = [e for e in evals if _is_number(e.get("exploitability"))]
    if not found:
        return None
    last = found[-1]
    best = min(found, key=lambda e: e["exploitability"])
    return {
        "last": {k: last[k] for k in ("weights_version", *EXPLOITABILITY_FIELDS) if k in last},
        "best": best["exploitability"],
        "best_weights_version": best.get("weights_version"),
        "evaluations": len(found),
    }


def reference_rates(evaluation: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """The win/draw/loss rates of an evaluation (an eval.csv row) against each reference
    opponent (``env.multiagent.eval_opponents``): ``{opponent: {win, draw, loss}}``."""
    out: dict[str, dict[str, float]] = {}
    for key in OUTCOME_FIELDS:
        if evaluation is not None and _is_number(evaluation.get(key)):
            opponent, outcome, _ = key.rsplit("_", 2)
            out.setdefault(opponent, {})[outcome] = evaluation[key]
    return out


class LeagueCSV:
    """``league.csv`` in the run directory (opened at the first record): a league's figures
    over time in long form (``LEAGUE_FIELDS``), one row per figure of ``league_figures``."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / "league.csv"
        self._file: Any = None
        self.writer: csv.DictWriter[str] | None = None

    def write(self, elapsed: float, env_steps: int, figures: Mapping[str, float]) -> None:
        if self.writer is None:
            self._file = open(self.path, "a", newline="")  # noqa: SIM115
            self.writer = csv.DictWriter(self._file, LEAGUE_FIELDS)
            if self._file.tell() == 0:
                self.writer.writeheader()
        for name, value in figures.items():
            self.writer.writerow(
                {
                    "time": round(elapsed, 2),
                    "env_steps": env_steps,
                    "name": name,
                    "value": f"{value:.6g}",
                }
            )
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            self.writer = None


LOGGER_EXTRAS = {"wandb": "wandb", "mlflow": "mlflow"}  # backend -> pip extra of zrl


class MissingExtraError(ConfigError):
    """A logger backend whose package is not installed; names the extra to install."""


def _import_extra(module: str, backend: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = LOGGER_EXTRAS[backend]
        raise MissingExtraError(
            f"logging.backends lists {backend!r}, but {module!r} is not installed ({exc}): "
            f'pip install "zrl[{extra}]", or drop {backend} from logging.backends'
        ) from None


def require_backends(opts: LoggingConfig) -> None:
    """MissingExtraError at once if a backend ``logging.backends`` names is not installed
    (before a run starts anything, not after its roles are up)."""
    import importlib.util

    for backend, extra in LOGGER_EXTRAS.items():
        if backend in opts.backends and importlib.util.find_spec(extra) is None:
            _import_extra(extra, backend)


class Logger(ABC):
    """Where the head's scalars go. Every backend gets the same tags: ``progress/*`` once a
    second, ``eval/*`` per evaluation and the roles' training figures as ``<role>/<name>``
    (``learner/loss``, ``actor/episode_return``, ...), each at the run's env-step count."""

    @abstractmethod
    def log_scalars(self, step: int, scalars: Mapping[str, float], elapsed: float) -> None:
        """Scalars at env step ``step``, ``elapsed`` seconds into the run."""

    def log_progress(self, row: Mapping[str, Any]) -> None:
        """The once-a-second progress row (``PROGRESS_FIELDS``)."""
        scalars = {f"progress/{k}": row[k] for k in PROGRESS_FIELDS[2:] if _is_number(row.get(k))}
        self.log_scalars(int(row.get("env_steps") or 0), scalars, float(row.get("time") or 0))

    def log_eval(self, row: Mapping[str, Any]) -> None:
        """One evaluation (``EVAL_FIELDS``)."""
        scalars = {"eval/return_mean": row["mean"], "eval/return_std": row.get("std") or 0.0}
        extra = (*OUTCOME_FIELDS, *EXPLOITABILITY_FIELDS)
        scalars.update({f"eval/{k}": row[k] for k in extra if _is_number(row.get(k))})
        self.log_scalars(int(row.get("env_steps") or 0), scalars, float(row.get("time") or 0))

    def close(self) -> None:  # noqa: B027 - most backends have nothing to release
        """Flush and release whatever the backend holds."""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class TensorBoardLogger(Logger):
    def __init__(self, logdir: Path) -> None:
        self.writer = ScalarWriter(logdir)

    def log_scalars(self, step: int, scalars: Mapping[str, float], elapsed: float) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()


class CSVLogger(Logger):
    """``progress.csv`` and ``eval.csv`` (one column per field, what ``zrl plot`` and
    ``--resume`` read), and ``train_metrics.csv``: the training figures in long form, one
    row per tag and report (``time, env_steps, tag, value``), a stable column set whatever
    the algorithm reports."""

    def __init__(self, run_dir: Path, eval_columns: list[str] | None = None) -> None:
        # A resumed run appends under the header its eval.csv has.
        eval_columns = _header(run_dir / "eval.csv") or eval_columns or EVAL_FIELDS
        self._progress = open(run_dir / "progress.csv", "a", newline="")  # noqa: SIM115
        self._eval = open(run_dir / "eval.csv", "a", newline="")  # noqa: SIM115
        self._train = open(run_dir / "train_metrics.csv", "a", newline="")  # noqa: SIM115
        self.progress = csv.DictWriter(self._progress, PROGRESS_FIELDS, extrasaction="ignore")
        self.eval = csv.DictWriter(self._eval, eval_columns, extrasaction="ignore")
        self.train = csv.DictWriter(self._train, TRAIN_FIELDS)
        for f, w in (
            (self._progress, self.progress),
            (self._eval, self.eval),
            (self._train, self.train),
        ):
            if f.tell() == 0:
                w.writeheader()

    def log_progress(self, row: Mapping[str, Any]) -> None:
        self.progress.writerow(dict(row))
        self._progress.flush()

    def log_eval(self, row: Mapping[str, Any]) -> None:
        self.eval.writerow(dict(row))
        self._eval.flush()

    def log_scalars(self, step: int, scalars: Mapping[str, float], elapsed: float) -> None:
        for tag, value in scalars.items():
            self.train.writerow(
                {"time": round(elapsed, 2), "env_steps": step, "tag": tag, "value": f"{value:.6g}"}
            )
        self._train.flush()

    def close(self) -> None:
        for f in (self._progress, self._eval, self._train):
            f.close()


def _header(path: Path) -> list[str] | None:
    """The header of the CSV file at ``path``; None when there is no file or it is empty."""
    try:
        with open(path, newline="") as f:
            return next(csv.reader(f), None) or None
    except FileNotFoundError:
        return None


class WandbLogger(Logger):
    """Weights & Biases (``pip install "zrl[wandb]"``). ``logging.wandb_mode: offline`` (the
    default) writes ``RUN_DIR/wandb/offline-run-*`` for a later ``wandb sync``; ``online``
    needs ``wandb login``. Every scalar is plotted against ``env_steps``."""

    def __init__(
        self, run_dir: Path, opts: LoggingConfig, run_name: str, config: dict[str, Any]
    ) -> None:
        wandb = _import_extra("wandb", "wandb")
        self.run = wandb.init(
            project=opts.project,
            entity=opts.wandb_entity,
            name=run_name,
            dir=str(run_dir),
            mode=opts.wandb_mode,
            config=config,
            settings=wandb.Settings(console="off", silent=True),
        )
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")

    def log_scalars(self, step: int, scalars: Mapping[str, float], elapsed: float) -> None:
        self.run.log({**scalars, "env_steps": step})

    def close(self) -> None:
        self.run.finish()


class MLflowLogger(Logger):
    """MLflow (``pip install "zrl[mlflow]"``, the client alone: mlflow-skinny). The tracking
    URI is ``logging.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else the file store
    ``file:RUN_DIR/mlruns`` (``mlflow ui --backend-store-uri RUN_DIR/mlruns``). The
    experiment is ``logging.project``; the config goes in as flattened params."""

    def __init__(
        self, run_dir: Path, opts: LoggingConfig, run_name: str, config: dict[str, Any]
    ) -> None:
        import os

        _import_extra("mlflow", "mlflow")
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri = opts.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (Path(run_dir).resolve() / "mlruns").as_uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps its file store only behind this switch; asked for, so allowed.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.tracking_uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(opts.project)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(opts.project)
        )
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in _flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log_scalars(self, step: int, scalars: Mapping[str, float], elapsed: float) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(tag, float(v), now, step) for tag, v in scalars.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class MetricsWriter:
    """The head's metrics, to every logger backend the config names: CSV files (always: the
    run directory's record), TensorBoard event files, W&B and MLflow. ``config`` (the run's,
    dumped) also picks eval.csv's columns (``eval_fields``)."""

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        *,
        logging: LoggingConfig | None = None,
        run_name: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        from zrl.config.sections import LoggingConfig

        self.run_dir = Path(run_dir)
        opts = logging or LoggingConfig()
        name = opts.run_name or run_name or self.run_dir.name
        self._failed: set[str] = set()
        self.league = LeagueCSV(self.run_dir)
        self.loggers: list[Logger] = [CSVLogger(self.run_dir, eval_fields(config))]
        try:
            if tensorboard and "tensorboard" in opts.backends:
                self.loggers.append(TensorBoardLogger(self.run_dir / "tensorboard"))
            if "wandb" in opts.backends:
                self.loggers.append(WandbLogger(self.run_dir, opts, name, config or {}))
            if "mlflow" in opts.backends:
                self.loggers.append(MLflowLogger(self.run_dir, opts, name, config or {}))
        except BaseException:
            self.close()
            raise

    def _each(self, call: Callable[[Logger], None]) -> None:
        for logger in self.loggers:
            try:
                call(logger)
            except MissingExtraError:
                raise
            except Exception as exc:  # noqa: BLE001 - a logger service must not end the run
                name = type(logger).__name__
                # Once a second for a whole run would bury the log: say it once a logger.
                level = _logging.DEBUG if name in self._failed else _logging.WARNING
                self._failed.add(name)
                log.log(level, "%s failed: %s", name, exc)

    def write_progress(self, row: dict[str, Any]) -> None:
        self._each(lambda lg: lg.log_progress(row))

    def write_eval(self, row: dict[str, Any]) -> None:
        self._each(lambda lg: lg.log_eval(row))

    def write_train(self, step: int, scalars: Mapping[str, float], elapsed: float) -> None:
        """The roles' training figures, tagged ``<role>/<name>`` (see ``Aggregator``)."""
        if scalars:
            self._each(lambda lg: lg.log_scalars(step, scalars, elapsed))

    def write_league(self, elapsed: float, env_steps: int, figures: Mapping[str, float]) -> None:
        """A league's figures (``league_figures``) to league.csv."""
        try:
            self.league.write(elapsed, env_steps, figures)
        except OSError as exc:  # a full disk must not end the run either
            log.warning("league.csv: %s", exc)

    def close(self) -> None:
        self.league.close()
        loggers, self.loggers = self.loggers, []
        for logger in loggers:
            try:
                logger.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("closing %s failed: %s", type(logger).__name__, exc)


def read_csv(path: Path) -> list[dict[str, float]]:
    """The rows of a CSV zrl wrote (``progress.csv``, ``eval.csv``), every value a float;
    ValueError naming the file and line of one that is not."""
    rows: list[dict[str, float]] = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        for raw in reader:
            try:
                rows.append({k: float(v) for k, v in raw.items() if v not in ("", None)})
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}, line {reader.line_num}: {exc}") from None
    return rows


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Learning curve (eval return against env steps and wall time) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    eval_path = run_dir / "eval.csv"
    if not eval_path.is_file():
        raise FileNotFoundError(f"{eval_path} does not exist: is {run_dir} a zrl run directory?")
    evals = read_csv(eval_path)
    if not evals:
        raise ValueError(f"{eval_path} has no evaluations yet: nothing to plot")
    steps = [r["env_steps"] for r in evals]
    times = [r["time"] for r in evals]
    mean = [r["mean"] for r in evals]
    std = [r.get("std", 0.0) for r in evals]
    lo = [m - s for m, s in zip(mean, std, strict=True)]
    hi = [m + s for m, s in zip(mean, std, strict=True)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, x, label in ((axes[0], steps, "env steps"), (axes[1], times, "wall time (s)")):
        ax.plot(x, mean, marker="o", ms=3, label="eval return (mean)")
        ax.fill_between(x, lo, hi, alpha=0.25, label="+- std")
        ax.set_xlabel(label)
        ax.set_ylabel("return")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    fig.suptitle(f"zrl run {run_dir.name}")
    fig.tight_layout()
    path = Path(out) if out is not None else run_dir / "learning_curve.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
