"""``zrl config``: inspect an experiment config, as ``zrl run`` would resolve and check it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zrl.cli.common import (
    HELP_MARKUP,
    ExperimentEnvFactoryOpt,
    ExperimentModelFactoryOpt,
    FactoriesFileOpt,
    SetOpt,
    load_experiment,
)

config_app = typer.Typer(
    help="Inspect experiment configs.", rich_markup_mode=HELP_MARKUP, no_args_is_help=True
)


@config_app.command("show")
def config_show(
    config: Annotated[Path, typer.Argument(help="YAML config file.")],
    overrides: SetOpt = None,
    all_sections: Annotated[
        bool, typer.Option("--all", help="Also the sections the config's algo does not use.")
    ] = False,
) -> None:
    """Print the resolved config (defaults filled in, overrides applied): the sections its
    algo uses."""
    from zrl.config.experiment import config_to_yaml, load_config

    cfg = load_config(config, overrides)
    typer.echo(config_to_yaml(cfg, all_sections=all_sections), nl=False)


@config_app.command("check")
def config_check(
    config: Annotated[Path, typer.Argument(help="YAML config or experiment script.")],
    overrides: SetOpt = None,
    factories_file: FactoriesFileOpt = None,
    env_factory: ExperimentEnvFactoryOpt = None,
    model_factory: ExperimentModelFactoryOpt = None,
) -> None:
    """Make one env of the config and its model, as `zrl run` does before anything starts."""
    from zrl.config.factories import Factories
    from zrl.run.preflight import check_env, check_model, describe_space

    cfg, factories = load_experiment(config, overrides)
    if factories_file is not None:
        factories = Factories.from_wire(factories.references, factories_file.read_bytes())
    factories.env = env_factory or factories.env
    factories.model = model_factory or factories.model
    observation_space, action_space = check_env(cfg, factories)
    check_model(cfg, observation_space, action_space, factories)
    spaces = (
        f"observations {describe_space(observation_space)}, actions {describe_space(action_space)}"
    )
    typer.echo(f"ok: the {cfg.algo} model builds for {cfg.env.id} ({spaces})")


@config_app.command("save-models", hidden=True)
def config_save_models(
    run_dir: Annotated[Path, typer.Argument(help="The run directory holding the request.")],
) -> None:
    """Write a stopping run's model files from its request (``zrl.run.model_files``): what
    ``zrl run`` forks from its zygote so that it never imports torch itself."""
    from zrl.run.model_files import answer_request

    saved = answer_request(run_dir)
    typer.echo(saved.note)
