"""What the ``zrl`` commands share: their common options, user errors, and loading an
experiment (a YAML config or a script) and CurveZMQ keys.

Like every module of the CLI it imports the heavy parts (zrl.config.experiment, torch) inside
functions, so ``zrl --help`` stays fast.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

import typer

if TYPE_CHECKING:
    from zrl.roles.evaluation import RunDirTrust

HELP_MARKUP: Literal["markdown"] = "markdown"
"""Every command group's ``rich_markup_mode``: a help text's lines are one paragraph wrapped to
the terminal (Rich's default mode keeps the docstrings' line breaks, mid-sentence)."""

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
ScriptOpt = Annotated[
    Path | None,
    typer.Option(
        "--script",
        help="The experiment script the run was made from: its env and model factories, "
        "instead of the run directory's factories.pkl (which is not read).",
    ),
]
TrustRunDirOpt = Annotated[
    bool,
    typer.Option(
        "--trust-run-dir",
        help="Run code from the run directory: unpickle its factories.pkl and import the "
        "modules its model.pt and config.yaml name (factory references, an env.id "
        "package.module:Env-v0). Only for a run directory you made or trust.",
    ),
]


class UserError(Exception):
    """Bad input; printed as one line."""


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def load_experiment(config: Path | None, overrides: list[str] | None) -> tuple[Any, Any]:
    """A YAML config, or an experiment script with its factories."""
    import zrl.algos.registry  # noqa: F401 - installs the algorithms the config validates against
    from zrl.config.experiment import load_config
    from zrl.config.factories import Factories

    if config is None:
        return None, Factories()
    if config.suffix == ".py":
        from zrl.run.experiment import load_experiment as load_script

        experiment = load_script(config)
        return experiment.resolved_config(overrides), experiment.factories
    return load_config(config, overrides), Factories()


def run_dir_trust(
    script: Path | None, trust_run_dir: bool, overrides: list[str] | None = None
) -> RunDirTrust:
    """What code of a run directory the user allows (``zrl.roles.evaluation.RunDirTrust``):
    the factories and ``env.id`` of the experiment script ``--script`` names (imported here:
    the user named it), everything with ``--trust-run-dir``, and an ``env.id`` the user set
    with ``--set``; otherwise nothing."""
    from zrl.roles.evaluation import RunDirTrust

    named = any(o.partition("=")[0].strip() == "env.id" for o in overrides or [])
    if script is None:
        return RunDirTrust(trusted=trust_run_dir, named_env_id=named)
    if script.suffix != ".py":
        raise UserError(
            f"--script {script}: give the Python experiment script the run was made from"
        )
    from zrl.run.experiment import load_experiment as load_script

    experiment = load_script(script)
    return RunDirTrust(
        script=experiment.factories,
        script_env_id=experiment.resolved_config().env.id,
        trusted=trust_run_dir,
        named_env_id=named,
    )


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
    script: Path | None = None,
    trust_run_dir: bool = False,
    **supervisor: Any,
) -> None:
    """Run a head (``zrl run``, ``zrl start broker --run-dir``) to its end: its experiment
    from CONFIG, or from RUN_DIR with ``--resume`` (its keys too, if it has some; its code
    only from ``script`` or with ``trust_run_dir``, ``load_resumable``);
    ``missing_config``: the error when neither is given; ``supervisor``: the rest of the
    ``Supervisor``'s arguments. Exit code 1 when the run failed (summary.json says why)."""
    from zrl.run.supervisor import Supervisor

    if resume is None:
        if config is None:
            raise UserError(missing_config)
        if script is not None or trust_run_dir:
            raise UserError(
                "--script and --trust-run-dir are for --resume RUN_DIR: a new run takes its "
                "experiment script as CONFIG"
            )
        cfg, factories = load_experiment(config, overrides)
    else:
        if config is not None or run_dir is not None:
            raise UserError("--resume RUN_DIR takes the config and run directory from RUN_DIR")
        trust = run_dir_trust(script, trust_run_dir, overrides)
        cfg, factories = load_resumable(resume, overrides, trust)
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
    exit_now(exit_code(summary))


def exit_now(code: int) -> NoReturn:
    """End a head's process with ``code`` once its run is over (every child stopped,
    summary.json written, the output flushed), skipping the interpreter's teardown: its last
    collections over all that torch and matplotlib made, and libtorch's static destructors,
    took 3 to 5 s of a loaded machine after the run had ended, Ctrl-C's included."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader is gone
            pass
    os._exit(code)


def exit_code(summary: dict[str, Any]) -> int:
    """A head's exit code: 1 when the run failed, 128 + the signal's number when a signal
    stopped it (130 for Ctrl-C, 143 for SIGTERM, as shells count), else 0."""
    if summary.get("failed"):
        return 1
    name = summary.get("signal")
    if summary.get("stop_reason") == "interrupted":
        return 128 + int(getattr(signal.Signals, str(name), signal.SIGINT))
    return 0


def load_resumable(
    run_dir: Path, overrides: list[str] | None, trust: RunDirTrust | None = None
) -> tuple[Any, Any]:
    """The config and factories of a run directory, to go on with it (``--resume``). The
    directory is data: its factories.pkl is unpickled, and a module its config.yaml names as
    ``env.id`` imported, only as ``trust`` (``run_dir_trust``) allows; otherwise
    ``UntrustedRunDir`` (exit code 2) names the file and the fixes."""
    from zrl.config.experiment import load_config
    from zrl.roles.evaluation import RunDirTrust

    trust = trust or RunDirTrust()
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise UserError(f"{run_dir} is not a zrl run directory (no config.yaml)")
    cfg = load_config(config, overrides)
    factories = trust.factories(run_dir, {}, config)
    trust.check_env_id(cfg.env.id, config)
    return cfg, factories
