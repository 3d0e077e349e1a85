"""``model.pt``, ``model_best.pt`` and ``model_last.pt`` written by a child forked from the
zygote, so that the head never imports torch.

Importing torch costs the head 3 to 4 s of CPU, which on two cores the roles feel in every
short run; the zygote has torch imported already. At the stop the head fetches the final
weights from params (numpy, over ZeroMQ), writes them with the stop rule's outcome as one
request file (``.models-request.npz``: the arrays, and a JSON string ``__meta__``), and forks
``zrl config save-models RUN_DIR`` (hidden). That child runs ``RunDir.write_models`` (reads
the evaluators' kept weights, chooses, writes the three files) and answers with
``.models-saved.json`` (``SavedModels``'s fields); both files are removed after. Without a
zygote (``--inproc``, not Linux, or it died) the head writes them itself, importing torch.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import Factories
from zrl.roles.evaluated_weights import Evaluated
from zrl.run.rundir import RunDir, SavedModels
from zrl.run.stop_rule import StopRule
from zrl.run.zygote import Zygote

REQUEST = ".models-request.npz"
ANSWER = ".models-saved.json"
META = "__meta__"
WEIGHT_PREFIX = "w:"


def write_request(rundir: RunDir, last: Evaluated, target: StopRule) -> Path:
    """The request file for the child: ``last``'s arrays and what ``write_models`` reads of
    the run (its config, factory references) and of the stop rule."""
    meta = {
        "version": last.version,
        "eval_return": last.eval_return,
        "target_time": target.target_time,
        "confirmed_version": target.confirmed_version,
        "confirmed_by": target.confirmed_by,
        "config": rundir.cfg.model_dump(mode="json"),
        "factory_refs": rundir.factories.references,
    }
    path = rundir.path / REQUEST
    payload: dict[str, Any] = {META: np.array(json.dumps(meta))}
    payload.update({f"{WEIGHT_PREFIX}{name}": array for name, array in last.weights.items()})
    with open(path, "wb") as f:
        np.savez(f, **payload)
    return path


def answer_request(run_dir: Path) -> SavedModels:
    """The child's side: read the request in ``run_dir``, write the model files, and the
    answer; what it saved."""
    with np.load(run_dir / REQUEST, allow_pickle=False) as request:
        meta: dict[str, Any] = json.loads(str(request[META]))
        weights = {
            key.removeprefix(WEIGHT_PREFIX): request[key]
            for key in request.files
            if key.startswith(WEIGHT_PREFIX)
        }
    cfg = ExperimentConfig.model_validate(meta["config"])
    target = StopRule(cfg)
    target.target_time = meta["target_time"]
    target.confirmed_version = meta["confirmed_version"]
    target.confirmed_by = meta["confirmed_by"]
    rundir = RunDir(run_dir, cfg, Factories.from_wire(meta["factory_refs"], None))
    last = Evaluated(int(meta["version"]), weights, meta["eval_return"])
    saved = rundir.write_models(last, target)
    (run_dir / ANSWER).write_text(json.dumps(asdict(saved)))
    return saved


def write_models_forked(
    rundir: RunDir, last: Evaluated, target: StopRule, zygote: Zygote, timeout: float
) -> SavedModels | None:
    """The model files written by a child of ``zygote`` within ``timeout`` seconds; None
    where no child could be forked (the caller writes them itself). A child that fails or
    runs out of time raises RuntimeError naming its log."""
    if zygote.proc is None:  # nothing to fork from: no request to write
        return None
    run_dir = rundir.path
    request = write_request(rundir, last, target)
    answer, log_path = run_dir / ANSWER, rundir.log_path("models")
    try:
        forked = zygote.fork(["config", "save-models", str(run_dir)], log_path)
        if forked is None:
            return None
        try:
            code = forked.wait(timeout)
        except subprocess.TimeoutExpired:
            forked.kill()
            raise RuntimeError(
                f"writing the model files took over {timeout:.0f} s: see {log_path}"
            ) from None
        if code != 0 or not answer.is_file():
            raise RuntimeError(f"writing the model files failed (exit {code}): see {log_path}")
        return SavedModels(**json.loads(answer.read_text()))
    finally:
        request.unlink(missing_ok=True)
        answer.unlink(missing_ok=True)
