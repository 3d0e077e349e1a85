"""The imports of ``zrl/`` point down only: no cycles, and no module imports a higher layer.

Each module's module-level ``import zrl...`` / ``from zrl... import ...`` statements are read
with ``ast`` (nothing is imported). Imports inside functions (the lazy ones that keep torch
out of the CLI and the supervisor) and under ``if TYPE_CHECKING:`` are not dependencies at
import time and are ignored, and so is the implicit import of a module's parent packages.
``from zrl.transport import protocol`` is an import of ``zrl.transport.protocol``;
``from zrl.algos import get_algorithm`` one of ``zrl.algos`` (its ``__init__``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ZRL = Path(__file__).resolve().parent.parent / "zrl"

# Lowest first. A module may import its own layer and the ones below. "zrl.x" names the
# module (or package __init__) zrl.x, "zrl.x.*" every module below it; the exact name wins
# over a pattern, a longer pattern over a shorter one. See docs/architecture.md, "Layers".
LAYERS: list[tuple[str, list[str]]] = [
    (
        "foundation",  # no sockets but the transport's; nothing that knows about roles
        [
            "zrl",  # __version__ (Experiment, RunFailed and Factories are lazy)
            "zrl.config",
            "zrl.config_base",  # the base of every config section (pydantic only)
            "zrl.config_sections",  # the sections every algorithm shares (pydantic only)
            "zrl.config_help",  # did-you-mean for a config that does not validate
            "zrl.multiagent.config",  # env.multiagent (pydantic only)
            "zrl.league.config",  # the league: section (pydantic only)
            "zrl.runtime",
            "zrl.durable",  # crash-safe file writes (no zrl imports)
            "zrl.factories",
            "zrl.metrics",
            "zrl.algos",  # the algorithm registry and its API, which import nothing of zrl
            "zrl.algos.api",
            "zrl.algos.api.*",
            "zrl.transport",
            "zrl.transport.*",
            "zrl.replay",
            "zrl.replay.*",
        ],
    ),
    (
        "learning",  # models, envs and the algorithms' maths and policies
        [
            "zrl.encoders",
            "zrl.models",
            "zrl.recurrent",  # LSTM/GRU cores and the recurrent networks
            "zrl.continuous_models",
            "zrl.envs",
            "zrl.pomdp",  # envs with hidden velocities
            "zrl.atari",  # Atari envs and their preprocessing
            "zrl.multiagent",  # PettingZoo envs as slots of the learning policy
            "zrl.multiagent.*",
            "zrl.league",  # the league's population, payoffs and matchmaking (pure)
            "zrl.league.*",
            "zrl.evaluation",
            "zrl.preflight",
            "zrl.algos.*",
            "zrl.replay.frames",  # n-step transitions over stored frames (zrl.algos.returns)
            "zrl.replay.assemble",  # a TRAJECTORY's table items (zrl.algos.returns)
        ],
    ),
    ("services", ["zrl.roles", "zrl.roles.*", "zrl.broker", "zrl.broker.*"]),  # a run's processes
    ("run", ["zrl.run", "zrl.run.*", "zrl.display", "zrl.zygote"]),  # `zrl run`
    (
        "entry",  # what users and tests call
        [
            "zrl.experiment",
            "zrl.cli",
            "zrl.cli_common",
            "zrl.cli_config",
            "zrl.cli_host",
            "zrl.cli_start",
            "zrl.__main__",
            "zrl.testing",
            "zrl.testing.*",
        ],
    ),
]

# Imports allowed against these rules, as (importer, imported): a debt to pay off, never a
# place for new imports. None today.
KNOWN_UPWARD: set[tuple[str, str]] = set()
# Pairs of modules allowed to import each other at module level, as (a, b) with a < b.
KNOWN_CYCLES: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(ZRL.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ZRL.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def zrl_imports(name: str) -> set[str]:
    """The zrl modules ``name`` imports at module level."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] == "zrl")
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, one level up per extra dot
                    anchor = package.split(".")[: package.count(".") + 2 - node.level]
                    base = ".".join([*anchor, *([base] if base else [])])
                if base.split(".")[0] != "zrl":
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in MODULES else base)
            elif isinstance(node, ast.If):
                if not _type_checking(node):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(ast.parse(path.read_text(), str(path)).body)
    found.discard(name)
    return found


GRAPH = {name: zrl_imports(name) for name in MODULES}


def layer_of(name: str) -> int | None:
    best: tuple[int, int] | None = None  # (how specific, layer)
    for index, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if pattern == name:
                return index
            prefix = pattern.removesuffix("*")
            if pattern.endswith(".*") and name.startswith(prefix):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return best[1] if best else None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_the_graph_is_read() -> None:
    # A parser that found nothing would pass everything below.
    assert {"zrl.run.supervisor", "zrl.factories", "zrl.broker", "zrl.cli"} <= set(MODULES)
    assert "zrl.run.children" in GRAPH["zrl.run.supervisor"]
    assert "zrl.factories" in GRAPH["zrl.broker.broker"]
    assert "zrl.transport.protocol" in GRAPH["zrl.roles.base"]
    assert "zrl.experiment" not in GRAPH["zrl"]  # under TYPE_CHECKING
    assert "zrl.display" not in GRAPH["zrl.run.supervisor"]  # inside a function


def test_there_is_no_import_cycle() -> None:
    allowed = {*KNOWN_CYCLES, *((b, a) for a, b in KNOWN_CYCLES)}
    graph = {a: {b for b in deps if (a, b) not in allowed} for a, deps in GRAPH.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(name for name in MODULES if layer_of(name) is None)
    assert not unplaced, f"place these modules in LAYERS of {__file__}: {unplaced}"


def test_imports_point_down() -> None:
    upward = []
    for name, deps in sorted(GRAPH.items()):
        mine = layer_of(name)
        for dep in sorted(deps):
            theirs = layer_of(dep)
            if mine is None or theirs is None or (name, dep) in KNOWN_UPWARD:
                continue
            if theirs > mine:
                upward.append(f"{name} ({LAYERS[mine][0]}) imports {dep} ({LAYERS[theirs][0]})")
    assert not upward, "imports up the layers:\n  " + "\n  ".join(upward)


def test_the_known_exceptions_still_exist() -> None:
    # Paid-off debts leave the lists, so nothing new hides behind them.
    stale = [(a, b) for a, b in KNOWN_UPWARD if b not in GRAPH.get(a, set())]
    stale += [(a, b) for a, b in KNOWN_CYCLES if b not in GRAPH.get(a, set())]
    assert not stale, f"no longer imported, remove from KNOWN_UPWARD/KNOWN_CYCLES: {stale}"
