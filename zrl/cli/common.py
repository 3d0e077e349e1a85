"""What the ``zrl`` commands share: their common options, user errors, and loading an
experiment (a YAML config or a script) and CurveZMQ keys.

Like every module of the CLI it imports the heavy parts (zrl.config.experiment, torch) inside
functions, so ``zrl --help`` stays fast.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated, Any

import typer

BrokerOpt = Annotated[
    str, typer.Option("--broker", "-b", help="Broker address, e.g. tcp://10.0.0.1:5555.")
]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="Override a config key: a.b.c=value.")
]
LogOpt = Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING.")]
KeysOpt = Annotated[
    Path | None,
    typer.Option("--keys", help="Key directory from `zrl keys init`: CURVE on every socket."),
]
KeyNameOpt = Annotated[
    str, typer.Option("--key-name", help="Which client keypair in --keys DIR to use.")
]
FactoriesFileOpt = Annotated[
    Path | None, typer.Option("--factories", help="Pickled factories written by `zrl run`.")
]
ExperimentEnvFactoryOpt = Annotated[
    str | None, typer.Option("--env-factory", help="Env factory as package.module:name.")
]
ExperimentModelFactoryOpt = Annotated[
    str | None, typer.Option("--model-factory", help="Model factory as package.module:name.")
]


class UserError(Exception):
    """Bad input; printed as one line."""


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def load_experiment(config: Path | None, overrides: list[str] | None) -> tuple[Any, Any]:
    """A YAML config, or an experiment script with its factories."""
    from zrl.config.experiment import load_config
    from zrl.config.factories import Factories

    if config is None:
        return None, Factories()
    if config.suffix == ".py":
        from zrl.run.experiment import load_experiment as load_script

        experiment = load_script(config)
        return experiment.resolved_config(overrides), experiment.factories
    return load_config(config, overrides), Factories()


def load_keys(directory: Path | None, name: str = "client") -> Any:
    """The keypair ``name`` of a key directory from ``zrl keys init``; None without one."""
    if directory is None:
        return None
    from zrl.transport.security import load_keys as load

    return load(directory, name)


def run_head(
    config: Path | None,
    overrides: list[str] | None,
    run_dir: Path | None,
    resume: Path | None,
    keys: Path | None,
    missing_config: str,
    **supervisor: Any,
) -> None:
    """Run a head (``zrl run``, ``zrl start broker --run-dir``) to its end: its experiment
    from CONFIG, or from RUN_DIR with ``--resume`` (its keys too, if it has some);
    ``missing_config``: the error when neither is given; ``supervisor``: the rest of the
    ``Supervisor``'s arguments. Exit code 1 when the run failed (summary.json says why)."""
    from zrl.run.supervisor import Supervisor

    if resume is None:
        if config is None:
            raise UserError(missing_config)
        cfg, factories = load_experiment(config, overrides)
    else:
        if config is not None or run_dir is not None:
            raise UserError("--resume RUN_DIR takes the config and run directory from RUN_DIR")
        cfg, factories = load_resumable(resume, overrides)
        run_dir = resume
        if keys is None and (resume / "keys").is_dir():
            keys = resume / "keys"
    summary = Supervisor(
        cfg,
        run_dir=run_dir,
        keys_dir=keys,
        factories=factories,
        resume=resume is not None,
        **supervisor,
    ).run()
    raise typer.Exit(exit_code(summary))


def exit_code(summary: dict[str, Any]) -> int:
    """A head's exit code: 1 when the run failed, 128 + the signal's number when a signal
    stopped it (130 for Ctrl-C, 143 for SIGTERM, as shells count), else 0."""
    if summary.get("failed"):
        return 1
    name = summary.get("signal")
    if summary.get("stop_reason") == "interrupted":
        return 128 + int(getattr(signal.Signals, str(name), signal.SIGINT))
    return 0


def load_resumable(run_dir: Path, overrides: list[str] | None) -> tuple[Any, Any]:
    """The config and factories of a run directory, to go on with it (``--resume``)."""
    from zrl.config.experiment import load_config
    from zrl.config.factories import FACTORIES_FILE, Factories

    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir} is not a zrl run directory (no config.yaml)")
    cfg = load_config(run_dir / "config.yaml", overrides)
    pickled = run_dir / FACTORIES_FILE
    factories = Factories.from_wire({}, pickled.read_bytes()) if pickled.is_file() else Factories()
    return cfg, factories
