"""``zrl host``: the per-host agent (``zrl.run.host_agent``) on the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zrl.cli.common import BrokerOpt, KeyNameOpt, KeysOpt, LogOpt
from zrl.cli.start import (
    AdvertiseOpt,
    CheckpointRootOpt,
    EnvFactoryOpt,
    EnvIdOpt,
    ModelFactoryOpt,
    TimeoutOpt,
    role_options,
    run_role,
)


def host(
    roles: Annotated[
        list[str],
        typer.Argument(
            help="The roles of this host: ROLE, ROLE=N or ROLE=N@FIRST (indices FIRST.. "
            "FIRST+N-1; without @FIRST the broker numbers them), e.g. actor=4 replay=1@0.",
            metavar="ROLE[=N[@FIRST]]",
            show_default=False,
        ),
    ],
    broker: BrokerOpt = "tcp://127.0.0.1:5555",
    log_dir: Annotated[
        Path | None,
        typer.Option(
            "--log-dir", help="One log per role here (default: ./zrl-logs/<broker host>-<port>/)."
        ),
    ] = None,
    orphan_timeout: Annotated[
        float,
        typer.Option(
            "--orphan-timeout",
            help="Stop the roles and exit non-zero when the broker has not answered this long.",
        ),
    ] = 300.0,
    keys: KeysOpt = None,
    key_name: KeyNameOpt = "client",
    advertise: AdvertiseOpt = None,
    checkpoint_root: CheckpointRootOpt = None,
    env_factory: EnvFactoryOpt = None,
    model_factory: ModelFactoryOpt = None,
    env_id: EnvIdOpt = None,
    connect_timeout: TimeoutOpt = 60.0,
    log_level: LogOpt = "INFO",
    restart_backoff: Annotated[
        str | None,
        typer.Option("--restart-backoff", hidden=True, help="Seconds, comma-separated (tests)."),
    ] = None,
    restart_budget: Annotated[
        int | None, typer.Option("--restart-budget", hidden=True, help="Restarts (tests).")
    ] = None,
) -> None:
    """Run the roles of this host: restart what crashes, stop them with the experiment."""
    from zrl.run.children import RestartPolicy
    from zrl.run.host_agent import HostAgent, default_log_dir, parse_role_specs
    from zrl.utils.runtime import setup_logging

    specs = parse_role_specs(roles)
    policy = RestartPolicy.default()
    if restart_backoff is not None or restart_budget is not None:
        backoff = policy.backoff
        if restart_backoff is not None:
            backoff = tuple(float(s) for s in restart_backoff.split(","))
        policy = RestartPolicy(backoff, policy.budget if restart_budget is None else restart_budget)
    setup_logging(log_level)
    role_args = ["--connect-timeout", f"{connect_timeout:g}"]
    for option, value in (("--keys", keys), ("--checkpoint-root", checkpoint_root)):
        if value is not None:
            role_args += [option, str(value.resolve())]
    if keys is not None:
        role_args += ["--key-name", key_name]
    if advertise is not None:  # the address the other hosts reach this host's roles at
        role_args += ["--advertise", advertise]
    refs = (
        ("--env-factory", env_factory),
        ("--model-factory", model_factory),
        ("--env-id", env_id),
    )
    for option, ref in refs:
        if ref:
            role_args += [option, ref]
    role_args += ["--log-level", log_level]
    options = role_options(
        connect_timeout, keys, key_name, checkpoint_root, env_factory, model_factory, env_id
    )
    agent = HostAgent(
        broker,
        specs,
        log_dir=(log_dir or default_log_dir(broker)).resolve(),
        role_args=role_args,
        orphan_timeout=orphan_timeout,
        restart=policy,
        advertise=advertise,
        **options,
    )
    run_role(agent)  # the broker's stop, or a signal: the children are stopped
    if agent.given_up:
        names = ", ".join(c.name for c in agent.given_up)
        typer.echo(f"error: gave up on {names} (see their logs in {agent.log_dir})", err=True)
        raise typer.Exit(1)
