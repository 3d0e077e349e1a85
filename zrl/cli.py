"""The ``zrl`` command line: start roles, run experiments, inspect them.

Every command turns bad input into a one-line ``error: ...`` and exit code 2;
tracebacks are for bugs only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from zrl import __version__

app = typer.Typer(
    help="zrl: distributed reinforcement learning on ZeroMQ.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
start_app = typer.Typer(
    help="Start one role of an experiment in this process.", no_args_is_help=True
)
config_app = typer.Typer(help="Inspect experiment configs.", no_args_is_help=True)
keys_app = typer.Typer(
    help="CurveZMQ keys: authenticate and encrypt every socket.", no_args_is_help=True
)
app.add_typer(start_app, name="start")
app.add_typer(config_app, name="config")
app.add_typer(keys_app, name="keys")

BrokerOpt = Annotated[
    str, typer.Option("--broker", "-b", help="Broker address, e.g. tcp://10.0.0.1:5555.")
]
IndexOpt = Annotated[
    int | None, typer.Option("--index", "-i", help="Role index (ids, seeds, exploration).")
]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="Override a config key: a.b.c=value.")
]
LogOpt = Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING.")]
TimeoutOpt = Annotated[
    float, typer.Option("--connect-timeout", help="Seconds to keep trying to reach the broker.")
]
KeysOpt = Annotated[
    Path | None,
    typer.Option("--keys", help="Key directory from `zrl keys init`: CURVE on every socket."),
]
KeyNameOpt = Annotated[
    str, typer.Option("--key-name", help="Which client keypair in --keys DIR to use.")
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
        help="The broker's checkpoint.dir must lie under this directory (default: the "
        "working directory).",
    ),
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
EnvFactoryOpt = Annotated[
    str | None,
    typer.Option(
        "--env-factory",
        help="Env factory package.module:name this role may import when the broker names it "
        "without keys.",
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


class UserError(Exception):
    """Bad input; printed as one line."""


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command()
def version() -> None:
    """Print the zrl and protocol versions."""
    from zrl.transport.protocol import PROTOCOL_VERSION

    typer.echo(f"zrl {__version__} (protocol {PROTOCOL_VERSION})")


# --- start ------------------------------------------------------------------------------


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
    log_level: LogOpt = "INFO",
) -> None:
    """Run the broker: registry, topic bus and stream devices."""
    from zrl.broker import Broker
    from zrl.factories import Factories
    from zrl.runtime import install_stop_signals, setup_logging
    from zrl.transport.sockets import is_loopback

    setup_logging(log_level)
    if not is_loopback(bind) and keys is None and not insecure:
        fail(
            f"{bind} is reachable from other hosts and no keys are configured: anyone on the "
            "network could join this experiment. Pass --keys DIR (see `zrl keys init`), or "
            "--insecure to accept that."
        )
    cfg, factories = _load_experiment(config, overrides)
    if factories_file is not None:
        factories = Factories.from_wire(factories.references, factories_file.read_bytes())
    if env_factory:
        factories.env = env_factory
    if model_factory:
        factories.model = model_factory
    if cfg is not None and not no_preflight:
        from zrl.preflight import preflight

        preflight(cfg, factories)  # a bad env id or model fails here, not in every role
    broker = Broker(bind, cfg, keys=_load_keys(keys), factories=factories)
    install_stop_signals(broker.stop)
    broker.run()


def _load_experiment(config: Path | None, overrides: list[str] | None) -> tuple[Any, Any]:
    """A YAML config, or an experiment script with its factories."""
    from zrl.config import load_config
    from zrl.factories import Factories

    if config is None:
        return None, Factories()
    if config.suffix == ".py":
        from zrl.experiment import load_experiment

        experiment = load_experiment(config)
        return experiment.resolved_config(overrides), experiment.factories
    return load_config(config, overrides), Factories()


def _load_resumable(run_dir: Path, overrides: list[str] | None) -> tuple[Any, Any]:
    from zrl.config import load_config
    from zrl.factories import FACTORIES_FILE, Factories

    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir} is not a zrl run directory (no config.yaml)")
    cfg = load_config(run_dir / "config.yaml", overrides)
    pickled = run_dir / FACTORIES_FILE
    factories = Factories.from_wire({}, pickled.read_bytes()) if pickled.is_file() else Factories()
    return cfg, factories


def _load_keys(directory: Path | None, name: str = "client") -> Any:
    if directory is None:
        return None
    from zrl.transport.security import load_keys

    return load_keys(directory, name)


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
) -> None:
    from zrl.roles import role_class
    from zrl.runtime import install_stop_signals, setup_logging

    setup_logging(log_level)
    cls = role_class(name)
    role = cls(
        broker,
        index=index,
        connect_timeout=timeout,
        advertise=advertise,
        keys=_load_keys(keys, key_name),
        checkpoint_root=checkpoint_root,
        local_factories={
            kind: ref for kind, ref in (("env", env_factory), ("model", model_factory)) if ref
        },
    )
    install_stop_signals(role.request_stop)
    role.run()


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
        log_level: LogOpt = "INFO",
    ) -> None:
        _start_role(
            name, broker, index, log_level, connect_timeout, advertise, keys, key_name,
            checkpoint_root, env_factory, model_factory,
        )  # fmt: skip

    command.__doc__ = help_text
    start_app.command(name)(command)


for _name, _help in (
    (
        "actor",
        "Run an actor (an A3C worker for algo a3c): vector envs, batched inference, experience out.",
    ),
    ("replay", "Run a replay shard: tables, rate limiter, batches to `batches`."),
    (
        "params",
        "Run the parameter server: versioned weights (A3C: applies the workers' gradients).",
    ),
    ("learner", "Run a learner (DQN, DDPG, SAC, IMPALA or PPO, as the config's algo says)."),
    ("evaluator", "Run the evaluator: greedy episodes with the latest weights."),
):
    _add_role_command(_name, _help)


# --- status -----------------------------------------------------------------------------


def _age(seconds: float) -> str:
    return f"{seconds:.1f}s"


@app.command()
def status(
    broker: BrokerOpt = "tcp://127.0.0.1:5555",
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw status as JSON.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait.")] = 5.0,
    keys: KeysOpt = None,
    key_name: KeyNameOpt = "client",
) -> None:
    """Show the roles registered with a broker."""
    import zmq
    from rich.table import Table

    from zrl.display import make_console
    from zrl.roles.base import RoleError, registry_request
    from zrl.transport import protocol as P

    try:
        reply = registry_request(
            zmq.Context.instance(), broker, P.Message(P.STATUS), timeout,
            _load_keys(keys, key_name),
        )  # fmt: skip
    except RoleError as exc:
        if keys is not None:
            raise
        # CURVE gives a client without keys no answer at all, not a refusal: say so.
        raise RoleError(
            f"{exc}; a broker started with --keys does not answer clients without keys: "
            "pass --keys DIR (the directory from `zrl keys init`)"
        ) from None
    if as_json:
        typer.echo(json.dumps(reply.meta, indent=2, default=str))
        return
    b = reply.meta.get("broker", {})
    roles: list[dict[str, Any]] = reply.meta.get("roles", [])
    table = Table(
        title=f"zrl broker {b.get('bind')} — {b.get('experiment') or 'no experiment'} "
        f"(up {b.get('uptime', 0):.0f}s)"
    )
    numeric = {"pid", "heartbeat", "restarts", "in", "out", "dropped", "gaps", "rss MB"}
    for col in ("role", "id", "host", "address", "pid", "state", "heartbeat", "restarts",
                "in", "out", "dropped", "gaps", "rss MB"):  # fmt: skip
        table.add_column(col, justify="right" if col in numeric else "left")
    colors = {"alive": "green", "dead": "red", "stopped": "yellow", "starting": "cyan"}
    for r in roles:
        state = r["state"]
        rss = r.get("info", {}).get("rss_mb")
        table.add_row(
            r["role"], r["id"], r["host"], r.get("address", ""), str(r["pid"]),
            f"[{colors.get(state, 'white')}]{state}[/]", _age(r["age"]), str(r["restarts"]),
            str(r["msgs_in"]), str(r["msgs_out"]), str(r["dropped"]), str(r.get("gaps", 0)),
            f"{rss:.0f}" if isinstance(rss, int | float) else "-",
        )  # fmt: skip
    console = make_console()
    console.print(table)
    hosts: dict[str, int] = {}
    for r in roles:
        if r["state"] == "alive":
            where = f"{r['host']} ({r['address']})" if r.get("address") else r["host"]
            hosts[where] = hosts.get(where, 0) + 1
    if hosts:
        console.print("alive per host: " + ", ".join(f"{h}: {n}" for h, n in sorted(hosts.items())))


# --- config -----------------------------------------------------------------------------


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
    from zrl.config import config_to_yaml, load_config

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
    from zrl.factories import Factories
    from zrl.preflight import check_env, check_model, describe_space

    cfg, factories = _load_experiment(config, overrides)
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


# --- keys -------------------------------------------------------------------------------


@keys_app.command("init")
def keys_init(
    directory: Annotated[Path, typer.Argument(help="Where to write the keys.")],
    force: Annotated[bool, typer.Option("--force", help="Replace existing keys.")] = False,
) -> None:
    """Make a server keypair, a client keypair and the allow-list (copy DIR to trusted hosts)."""
    from zrl.transport.security import init_keys

    d = init_keys(directory, force=force)
    typer.echo(f"wrote CurveZMQ keys to {d}; start every role and the broker with --keys {d}")


@keys_app.command("add")
def keys_add(
    directory: Annotated[Path, typer.Argument(help="An existing key directory.")],
    name: Annotated[str, typer.Argument(help="Name of the new client (e.g. a host name).")],
) -> None:
    """Add (and authorize) another client keypair, e.g. one per host."""
    from zrl.transport.security import add_client

    secret = add_client(directory, name)
    typer.echo(f"wrote {secret}; it is authorized in {directory}/authorized/")


# --- run / eval / plot ------------------------------------------------------------------


@app.command()
def run(
    config: Annotated[
        Path | None, typer.Argument(help="YAML config, or a Python experiment script.")
    ] = None,
    overrides: SetOpt = None,
    resume: Annotated[
        Path | None,
        typer.Option("--resume", help="Continue a run directory from its last checkpoints."),
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="Where to write logs, metrics, the model.")
    ] = None,
    inproc: Annotated[
        bool, typer.Option("--inproc", help="Every role as a thread of this process (debugging).")
    ] = False,
    port: Annotated[
        int | None, typer.Option("--port", help="Broker base port (default: free).")
    ] = None,
    keys: KeysOpt = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow a non-loopback broker.host without keys.")
    ] = False,
    log_level: LogOpt = "INFO",
) -> None:
    """Run an experiment locally: broker and every role, live status, run directory."""
    from zrl.run import Supervisor

    if resume is not None:
        if config is not None or run_dir is not None:
            raise UserError("--resume RUN_DIR takes the config and run directory from RUN_DIR")
        cfg, factories = _load_resumable(resume, overrides)
        run_dir = resume
        if keys is None and (resume / "keys").is_dir():
            keys = resume / "keys"
    elif config is None:
        raise UserError("give a CONFIG (YAML or script), or --resume RUN_DIR")
    else:
        cfg, factories = _load_experiment(config, overrides)
    sup = Supervisor(
        cfg, run_dir=run_dir, inproc=inproc, port=port, log_level=log_level, keys_dir=keys,
        factories=factories, insecure=insecure, resume=resume is not None,
    )  # fmt: skip
    summary = sup.run()
    if summary.get("failed"):  # roles kept crashing: summary.json says which and why
        raise typer.Exit(1)


@app.command("eval")
def eval_run(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `zrl run`.")],
    episodes: Annotated[int, typer.Option("--episodes", "-n")] = 10,
    seed: Annotated[int, typer.Option("--seed")] = 12345,
) -> None:
    """Play the saved policy of a run greedily and print the returns."""
    from zrl.evaluation import evaluate_run_dir

    returns = evaluate_run_dir(run_dir, episodes=episodes, seed=seed)
    for i, r in enumerate(returns):
        typer.echo(f"episode {i}: return {r:.1f}")
    import numpy as np

    typer.echo(f"mean {np.mean(returns):.1f} +- {np.std(returns):.1f} over {len(returns)} episodes")


@app.command()
def plot(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `zrl run`.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="PNG path.")] = None,
) -> None:
    """Write a PNG of a run's learning curve (evaluation return against env steps and time)."""
    from zrl.metrics import plot_run

    path = plot_run(run_dir, out)
    typer.echo(f"wrote {path}")


def honour_stop_signals() -> None:
    """SIGINT and SIGTERM stop every command, whatever this process inherited: a job started
    with ``&`` by a non-interactive shell inherits SIGINT as ignored. Ctrl-C and SIGTERM
    raise KeyboardInterrupt (exit code 130) until a command installs its own handlers."""
    import signal

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt)


def main() -> None:
    """Entry point: user errors become one line and exit code 2."""
    try:  # typer >= 0.20 vendors click
        from typer._click.exceptions import UsageError
    except ImportError:  # pragma: no cover - older typer on real click
        from click.exceptions import UsageError  # type: ignore[no-redef,assignment]

    from zrl.config import ConfigError
    from zrl.roles.base import RoleError

    honour_stop_signals()
    try:
        code = app(standalone_mode=False)
    except UsageError as exc:
        if exc.format_message():  # empty when the help was shown for a bare command group
            typer.echo(f"error: {exc.format_message()} (see zrl --help)", err=True)
        sys.exit(2)
    except (ConfigError, RoleError, UserError, OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
