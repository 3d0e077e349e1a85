"""``zrl start ROLE``: one role of an experiment in this process (the broker, or a role that
joins one), as on a host that ``zrl run`` does not start roles on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from zrl.cli.common import (
    HELP_MARKUP,
    BrokerOpt,
    ExperimentEnvFactoryOpt,
    ExperimentModelFactoryOpt,
    FactoriesFileOpt,
    KeyNameOpt,
    KeysOpt,
    LogOpt,
    ScriptOpt,
    SetOpt,
    TrustRunDirOpt,
    UserError,
    fail,
    load_experiment,
    load_keys,
    run_head,
)

start_app = typer.Typer(
    help="Start one role of an experiment in this process.",
    rich_markup_mode=HELP_MARKUP,
    no_args_is_help=True,
)

IndexOpt = Annotated[
    int | None, typer.Option("--index", "-i", help="Role index (ids, seeds, exploration).")
]
TimeoutOpt = Annotated[
    float, typer.Option("--connect-timeout", help="Seconds to keep trying to reach the broker.")
]
AdvertiseOpt = Annotated[
    str | None,
    typer.Option("--advertise", help="Address peers reach this host at (default: auto)."),
]
CheckpointRootOpt = Annotated[
    Path | None,
    typer.Option(
        "--checkpoint-root",
        envvar="ZRL_CHECKPOINT_ROOT",
        help="Every file of this role lies under this directory (default: the working "
        "directory): the broker's checkpoint.dir if it lies under it, else DIR/<run>.",
    ),
]
EnvFactoryOpt = Annotated[
    str | None,
    typer.Option(
        "--env-factory",
        help="Env factory package.module:name this role may import when the broker names it "
        "without keys.",
    ),
]
EnvIdOpt = Annotated[
    str | None,
    typer.Option(
        "--env-id",
        help="An env.id naming a module (package.module:Env-v0) this role may import when "
        "the broker names it without keys.",
    ),
]
ModelFactoryOpt = Annotated[
    str | None,
    typer.Option(
        "--model-factory",
        help="Model factory package.module:name this role may import when the broker names "
        "it without keys.",
    ),
]


@start_app.command("broker")
def start_broker(
    bind: Annotated[str, typer.Option("--bind", help="Base address: tcp://HOST:PORT.")] = (
        "tcp://127.0.0.1:5555"
    ),
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="Experiment config (YAML or script) every role receives."
        ),
    ] = None,
    overrides: SetOpt = None,
    factories_file: FactoriesFileOpt = None,
    env_factory: ExperimentEnvFactoryOpt = None,
    model_factory: ExperimentModelFactoryOpt = None,
    keys: KeysOpt = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow binding a non-loopback address without keys.")
    ] = False,
    no_preflight: Annotated[
        bool,
        typer.Option(
            "--no-preflight",
            help="Skip making one env and the model before starting (for a broker host "
            "without the env's packages).",
        ),
    ] = False,
    run_dir: Annotated[
        Path | None,
        typer.Option(
            "--run-dir",
            help="Be the experiment's head: write this run directory (status, metrics, "
            "summary, model), enforce `stop` by stopping every role wherever it runs, and "
            "wait for every role of the config to register from other hosts.",
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume", help="Be the head of a run directory again, from its last checkpoints."
        ),
    ] = None,
    script: ScriptOpt = None,
    trust_run_dir: TrustRunDirOpt = False,
    log_level: LogOpt = "INFO",
) -> None:
    """Run the broker: registry, topic bus and stream devices; with --run-dir, also the
    experiment's head (what `zrl run` does, with every role started elsewhere)."""
    from zrl.broker.broker import Broker
    from zrl.config.factories import Factories
    from zrl.transport.endpoints import is_loopback
    from zrl.utils.runtime import install_stop_signals, setup_logging

    if run_dir is not None or resume is not None:
        # The head: zrl run's supervisor, with every role of the config started elsewhere.
        # Like zrl run, it takes factories from an experiment script only.
        if factories_file is not None or env_factory or model_factory:
            raise UserError(
                "--run-dir takes the env and model factories from the config: give an "
                "experiment script as --config, not --factories/--env-factory/--model-factory"
            )
        run_head(
            config,
            overrides,
            run_dir,
            resume,
            keys,
            "--run-dir needs --config: the experiment this head runs",
            script=script,
            trust_run_dir=trust_run_dir,
            log_level=log_level,
            insecure=insecure,
            bind=bind,
            elsewhere=True,
            preflight=not no_preflight,
        )
        return
    setup_logging(log_level)
    if not is_loopback(bind) and keys is None and not insecure:
        fail(
            f"{bind} is reachable from other hosts and no keys are configured: anyone on the "
            "network could join this experiment. Pass --keys DIR (see `zrl keys init`), or "
            "--insecure to accept that."
        )
    if keys is None and "ZRL_STOP_TOKEN" not in os.environ:  # zrl run's broker says nothing
        warn_insecure("this broker")
    cfg, factories = load_experiment(config, overrides)
    if cfg is not None:  # the spec the roles get carries numbers, never auto
        from zrl.run.sizing import resolve_auto_roles

        cfg, sizing = resolve_auto_roles(cfg)
        if sizing is not None:
            typer.echo(sizing.describe())
    if factories_file is not None:
        factories = Factories.from_wire(factories.references, factories_file.read_bytes())
    if env_factory:
        factories.env = env_factory
    if model_factory:
        factories.model = model_factory
    if cfg is not None and not no_preflight:
        from zrl.run.preflight import preflight

        preflight(cfg, factories)  # a bad env id or model fails here, not in every role
    from zrl.transport.security import env_run_secret

    broker = Broker(
        bind,
        cfg,
        keys=load_keys(keys),
        factories=factories,
        stop_token=os.environ.get("ZRL_STOP_TOKEN") or None,
        run_secret=env_run_secret(),
    )
    install_stop_signals(broker.stop)
    broker.run()


INSECURE_WARNING = (
    "warning: {who} runs without keys (no --keys): its traffic is unencrypted, and any process "
    "that reaches the broker can read it, send it anything, and take a role's id where the "
    "broker holds no run secret. Use the key directory of `zrl keys init` on any network or "
    "machine you share."
)


def warn_insecure(who: str) -> None:
    """Say once, loudly, what running without keys allows: on the command line of the
    process a user started, not in every child that ``zrl run`` or ``zrl host`` started."""
    from zrl.roles.base import AGENT_ID_ENV
    from zrl.transport.security import ROLE_CREDENTIAL_ENV

    if os.environ.get(ROLE_CREDENTIAL_ENV) or os.environ.get(AGENT_ID_ENV):
        return
    typer.echo(INSECURE_WARNING.format(who=who), err=True)


def role_options(
    timeout: float,
    keys: Path | None,
    key_name: str,
    checkpoint_root: Path | None,
    env_factory: str | None,
    model_factory: str | None,
    env_id: str | None = None,
) -> dict[str, Any]:
    """The ``Role`` arguments a role process takes from its own command line."""
    if keys is None:
        warn_insecure("this role")
    return {
        "connect_timeout": timeout,
        "keys": load_keys(keys, key_name),
        "checkpoint_root": checkpoint_root,
        "local_factories": {
            kind: ref for kind, ref in (("env", env_factory), ("model", model_factory)) if ref
        },
        "local_env_id": env_id,
    }


def run_role(role: Any) -> None:
    """Run ``role`` (a ``Role``) until it stops: SIGINT/SIGTERM stop it cleanly."""
    from zrl.roles.errors import ExperimentStopped
    from zrl.utils.runtime import install_stop_signals

    install_stop_signals(role.request_stop)
    try:
        role.run()
    except ExperimentStopped as exc:
        # The head ended the experiment before or while this role ran: a clean end, so a
        # host agent does not restart it.
        role.log.info("%s", exc)


def _start_role(
    name: str,
    broker: str,
    index: int | None,
    log_level: str,
    timeout: float,
    advertise: str | None,
    keys: Path | None = None,
    key_name: str = "client",
    checkpoint_root: Path | None = None,
    env_factory: str | None = None,
    model_factory: str | None = None,
    env_id: str | None = None,
) -> None:
    from zrl.roles import role_class
    from zrl.utils.runtime import setup_logging

    setup_logging(log_level)
    options = role_options(
        timeout, keys, key_name, checkpoint_root, env_factory, model_factory, env_id
    )
    run_role(role_class(name)(broker, index=index, advertise=advertise, **options))


def _add_role_command(name: str, help_text: str) -> None:
    def command(
        broker: BrokerOpt = "tcp://127.0.0.1:5555",
        index: IndexOpt = None,
        connect_timeout: TimeoutOpt = 60.0,
        advertise: AdvertiseOpt = None,
        keys: KeysOpt = None,
        key_name: KeyNameOpt = "client",
        checkpoint_root: CheckpointRootOpt = None,
        env_factory: EnvFactoryOpt = None,
        model_factory: ModelFactoryOpt = None,
        env_id: EnvIdOpt = None,
        log_level: LogOpt = "INFO",
    ) -> None:
        _start_role(
            name,
            broker,
            index,
            log_level,
            connect_timeout,
            advertise,
            keys,
            key_name,
            checkpoint_root,
            env_factory,
            model_factory,
            env_id,
        )

    command.__doc__ = help_text
    start_app.command(name)(command)


for _name, _help in (
    (
        "actor",
        "Run an actor (an A3C worker for algo a3c): vector envs, batched inference, "
        "experience out.",
    ),
    ("replay", "Run a replay shard: tables, rate limiter, batches to `batches`."),
    (
        "params",
        "Run the parameter server: versioned weights (A3C: applies the workers' gradients).",
    ),
    ("learner", "Run a learner (DQN, DDPG, SAC, IMPALA or PPO, as the config's algo says)."),
    ("evaluator", "Run the evaluator: greedy episodes with the latest weights."),
    ("league", "Run the self-play league: opponents for actors, snapshots, payoffs, Elo."),
    ("inference", "Run an inference role: batched policy forwards for the actors of its host."),
    ("pbt", "Run population-based training: rank the members, exploit and explore (PPO)."),
):
    _add_role_command(_name, _help)
