"""The ``zrl`` command line: start roles, run experiments, inspect them.

Every command turns bad input into a one-line ``error: ...`` and exit code 2;
tracebacks are for bugs only. ``zrl start`` is ``zrl.cli.start``, ``zrl host``
``zrl.cli.host``, ``zrl config`` ``zrl.cli.config``, and what the commands share
``zrl.cli.common``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from zrl.cli.common import (
    HELP_MARKUP,
    BrokerOpt,
    KeyNameOpt,
    KeysOpt,
    LogOpt,
    ScriptOpt,
    SetOpt,
    TrustRunDirOpt,
    UserError,
    fail,
    load_keys,
    run_dir_trust,
    run_head,
)
from zrl.cli.config import config_app
from zrl.cli.host import host
from zrl.cli.start import start_app
from zrl.utils.version import __version__

app = typer.Typer(
    help="zrl: distributed reinforcement learning on ZeroMQ.",
    rich_markup_mode=HELP_MARKUP,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
keys_app = typer.Typer(
    help="CurveZMQ keys: authenticate and encrypt every socket.",
    rich_markup_mode=HELP_MARKUP,
    no_args_is_help=True,
)
app.add_typer(start_app, name="start")
app.add_typer(config_app, name="config")
app.add_typer(keys_app, name="keys")
app.command("host")(host)


@app.command()
def version() -> None:
    """Print the zrl and protocol versions."""
    from zrl.transport.protocol import PROTOCOL_VERSION

    typer.echo(f"zrl {__version__} (protocol {PROTOCOL_VERSION})")


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
    logs: Annotated[
        str | None,
        typer.Option(
            "--logs",
            metavar="ROLE_ID",
            help="Where ROLE_ID logs, and its last lines, as its host agent (zrl host) reports.",
        ),
    ] = None,
) -> None:
    """Show the roles registered with a broker."""
    import zmq
    from rich.table import Table

    from zrl.roles.registry_client import NoAnswer, read_status, refuses_handshake
    from zrl.run.display import (
        ROLE_COUNTS,
        colored_state,
        inference_line,
        league_line,
        make_console,
        pbt_line,
        role_counts,
        stall_text,
    )

    ctx: zmq.Context = zmq.Context.instance()
    client_keys = load_keys(keys, key_name)
    try:
        reply = read_status(ctx, broker, timeout, client_keys)
    except NoAnswer as exc:
        # CURVE gives a client without (the right) keys no answer at all, not a refusal:
        # say so, but only when the broker is there and refused the handshake.
        if not refuses_handshake(ctx, broker, min(timeout, 2.0), client_keys):
            raise
        cure = (
            "a broker started with --keys does not answer clients without keys: pass --keys "
            "DIR (the directory from `zrl keys init`)"
            if keys is None
            else f"the broker refused the keys in {keys}: they are not the ones it allows"
        )
        raise NoAnswer(f"{exc}; {cure}") from None
    roles: list[dict[str, Any]] = reply.get("roles", [])
    if logs is not None:
        _print_logs(roles, logs)
        return
    if as_json:
        typer.echo(json.dumps(reply, indent=2, default=str))
        return
    b = reply.get("broker", {})
    table = Table(
        title=f"zrl broker {b.get('bind')} — {b.get('experiment') or 'no experiment'} "
        f"(up {b.get('uptime', 0):.0f}s)"
    )
    numeric = {"pid", "heartbeat", *ROLE_COUNTS}
    for col in ("role", "id", "host", "address", "pid", "state", "heartbeat", *ROLE_COUNTS):
        table.add_column(col, justify="right" if col in numeric else "left")
    for r in roles:
        table.add_row(
            r["role"],
            r["id"],
            r["host"],
            r.get("address", ""),
            str(r["pid"]),
            colored_state(r),
            _age(r["age"]),
            *role_counts(r),
        )
    console = make_console()
    console.print(table)
    hosts: dict[str, int] = {}
    for r in roles:
        if r["state"] == "alive":
            where = f"{r['host']} ({r['address']})" if r.get("address") else r["host"]
            hosts[where] = hosts.get(where, 0) + 1
    if hosts:
        console.print("alive per host: " + ", ".join(f"{h}: {n}" for h, n in sorted(hosts.items())))
    for r in roles:
        line = league_line(r.get("info", {})) if r["role"] == "league" else ""
        if r["role"] == "inference":
            line = inference_line(r.get("info", {}))
        if r["role"] == "pbt":
            line = pbt_line(r.get("info", {}))
        if r["role"] == "host" and r["state"] == "alive":
            line = _host_line(r.get("info", {}))
        line = stall_text(r) or line
        if line:
            console.print(f"{r['id']}: {line}")


def _host_line(info: dict[str, Any]) -> str:
    """A host agent's children in one line: ``actor-0 running, replay-0 restarting (2)``."""
    children = [c for c in info.get("children") or [] if isinstance(c, dict)]
    return ", ".join(
        f"{c.get('id')} {c.get('state')}" + (f" ({c['restarts']})" if c.get("restarts") else "")
        for c in children
    )


def _print_logs(rows: list[dict[str, Any]], role_id: str) -> None:
    """``zrl status --logs ROLE_ID``: the host, log path and last lines its agent reported."""
    from zrl.run.host_agent import find_child_report

    found = find_child_report(rows, role_id)
    if found is None:
        raise UserError(
            f"no host agent (zrl host) lists {role_id}: a role started by hand logs where it "
            "was started, and one of `zrl run` in its run directory (RUN_DIR/logs/"
            f"{role_id}.log)"
        )
    agent, child = found
    typer.echo(
        f"{role_id}: {child.get('state')} on host {agent.get('host')}, pid "
        f"{child.get('pid')}, {child.get('restarts')} restarts (host agent "
        f"{agent.get('id')}, {agent.get('state')})"
    )
    typer.echo(f"log: {child.get('log')}  (on {agent.get('host')})")
    tail = child.get("tail")
    if isinstance(tail, list) and tail:
        typer.echo("last lines reported:")
        for line in tail:
            typer.echo(f"  | {line}")


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
        bool,
        typer.Option(
            "--insecure",
            help=(
                "Run without keys (by default a run makes its own in RUN_DIR/keys): any "
                "process that reaches the broker's ports can then read and send its traffic."
            ),
        ),
    ] = False,
    log_level: LogOpt = "INFO",
    script: ScriptOpt = None,
    trust_run_dir: TrustRunDirOpt = False,
) -> None:
    """Run an experiment locally: broker and every role, live status, run directory. With
    --resume, a run made from a script needs --script PATH (or --trust-run-dir)."""
    from zrl.run.zygote import Zygote

    # First thing: the zygote's imports (torch: the longest wait of the start-up) overlap ours
    # and the config's checks. Killed if they fail; the supervisor stops it otherwise.
    zygote = Zygote()
    if not inproc:
        zygote.start(None)
    try:
        run_head(
            config,
            overrides,
            run_dir,
            resume,
            keys,
            "give a CONFIG (YAML or script), or --resume RUN_DIR",
            script=script,
            trust_run_dir=trust_run_dir,
            inproc=inproc,
            port=port,
            log_level=log_level,
            insecure=insecure,
            zygote=zygote if zygote.proc is not None else None,
        )
    finally:
        zygote.kill()  # a no-op once the supervisor has stopped it


@app.command("eval")
def eval_run(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `zrl run`.")],
    episodes: Annotated[int, typer.Option("--episodes", "-n")] = 10,
    seed: Annotated[int, typer.Option("--seed")] = 12345,
    opponent: Annotated[
        str | None,
        typer.Option(
            "--opponent",
            help="Turn-based multi-agent games: play against random or scripted (default random).",
        ),
    ] = None,
    video: Annotated[
        Path | None,
        typer.Option(
            "--video",
            help="Record every episode as an mp4 in this directory (needs zrl\\[video]).",
        ),
    ] = None,
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="model.pt (the weights that met the stop rule, else the best evaluated), "
            "model_best.pt or model_last.pt (the final weights).",
        ),
    ] = "model.pt",
    script: ScriptOpt = None,
    trust_run_dir: TrustRunDirOpt = False,
) -> None:
    """Play the saved policy of a run greedily and print the returns (in a turn-based game,
    also its win/draw/loss rates against the opponent). It first says which of the run's
    weights it plays: model.pt holds those that met the stop rule. A run made from a script
    needs --script PATH (or --trust-run-dir): nothing in RUN_DIR is unpickled or imported."""
    from zrl.config.multiagent import FIXED_PLAYERS
    from zrl.roles.evaluation import (
        MODEL_FILES,
        UntrustedRunDir,
        describe_saved,
        evaluate_run_dir,
        outcome_rates,
    )

    if opponent is not None and opponent not in FIXED_PLAYERS:
        raise typer.BadParameter(
            f"{opponent!r} is not one of {', '.join(FIXED_PLAYERS)}", param_hint="--opponent"
        )
    if model not in MODEL_FILES:
        raise typer.BadParameter(
            f"{model!r} is not one of {', '.join(MODEL_FILES)}", param_hint="--model"
        )
    trust = run_dir_trust(script, trust_run_dir)
    try:
        typer.echo(describe_saved(run_dir, model))
        returns = evaluate_run_dir(
            run_dir,
            episodes=episodes,
            seed=seed,
            opponent=opponent,
            video_dir=video,
            model_file=model,
            trust=trust,
        )
    except UntrustedRunDir as exc:
        fail(str(exc))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--video" if video else None) from None
    if video is not None:
        typer.echo(f"videos: {len(list(video.glob('*.mp4')))} mp4 files in {video}")
    for i, r in enumerate(returns):
        typer.echo(f"episode {i}: return {r:.1f}")
    import numpy as np

    if opponent is not None:
        rates = outcome_rates(np.asarray(returns))
        typer.echo(
            f"against {opponent}: wins {rates['win_rate']:.2f}, draws {rates['draw_rate']:.2f}, "
            f"losses {rates['loss_rate']:.2f}"
        )
    typer.echo(f"mean {np.mean(returns):.1f} +- {np.std(returns):.1f} over {len(returns)} episodes")


@app.command("export")
def export_run(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `zrl run`.")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="onnx or torchscript.")] = "onnx",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Where to write (default RUN/policy.onnx, policy.torchscript.pt)."
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Then run the file (onnxruntime / TorchScript) and zrl's forward side by side "
            "on a few steps of the run's env; fail past a difference of 1e-5.",
        ),
    ] = False,
    check_file: Annotated[
        Path | None,
        typer.Option("--check-file", help="Check this exported file against the run; write none."),
    ] = None,
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="model.pt (the weights that met the stop rule), model_best.pt or model_last.pt.",
        ),
    ] = "model.pt",
    script: ScriptOpt = None,
    trust_run_dir: TrustRunDirOpt = False,
) -> None:
    """Write a run's greedy policy as one ONNX or TorchScript file (preprocessing, input
    normalization and, for recurrent models, the state as an input and an output included);
    with --check, also compare it with zrl's own forward (exit code 1 past 1e-5). A run made
    from a script needs --script PATH (or --trust-run-dir), as for zrl eval."""
    from zrl.nets.export import FORMATS
    from zrl.roles.evaluation import MODEL_FILES
    from zrl.run.export import check_run
    from zrl.run.export import export_run as write_export

    if fmt not in FORMATS:
        raise typer.BadParameter(
            f"{fmt!r} is not one of {', '.join(FORMATS)}", param_hint="--format"
        )
    if model not in MODEL_FILES:
        raise typer.BadParameter(
            f"{model!r} is not one of {', '.join(MODEL_FILES)}", param_hint="--model"
        )
    trust = run_dir_trust(script, trust_run_dir)
    try:
        path = check_file
        if path is None:
            path, signature = write_export(run_dir, fmt, out, model, trust)  # type: ignore[arg-type]
            typer.echo(
                f"wrote {path}: inputs {', '.join(signature.inputs)} -> outputs "
                f"{', '.join(signature.outputs)}"
            )
        if not (check or check_file is not None):
            return
        report = check_run(run_dir, path, model, trust=trust)
    except (OSError, ValueError, ImportError) as exc:
        fail(str(exc))
    for line in report.lines():
        typer.echo(line)
    if not report.passed:
        raise typer.Exit(1)


@app.command()
def plot(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `zrl run`.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="PNG path.")] = None,
) -> None:
    """Write a PNG of a run's learning curve (evaluation return against env steps and time)."""
    from zrl.run.metrics import plot_run

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


_COMMAND: Any = None


def command() -> Any:
    """``app`` as the click command that parses the arguments, built once per process.
    Building it reads the signature and type hints of every command (0.2 s of CPU, more on a
    loaded machine): the zygote builds it before it forks, so no role pays for it again.
    ``app(...)`` would rebuild it at every call; with ``pretty_exceptions_enable=False`` the
    command alone behaves the same."""
    global _COMMAND
    if _COMMAND is None:
        _COMMAND = typer.main.get_command(app)
    return _COMMAND


def main() -> None:
    """Entry point: user errors become one line and exit code 2."""
    try:  # typer >= 0.20 vendors click
        from typer._click.exceptions import UsageError
    except ImportError:  # pragma: no cover - older typer on real click
        from click.exceptions import UsageError  # type: ignore[no-redef,assignment]

    from zrl.config.experiment import ConfigError
    from zrl.roles.errors import RoleError

    try:
        # Inside the try: a signal can arrive as soon as the first handler is installed.
        honour_stop_signals()
        code = command()(standalone_mode=False)
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
