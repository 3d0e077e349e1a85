"""The package's folders are its layers, and its imports point down only.

The rules are import-linter contracts in ``pyproject.toml`` (``.ci/run`` runs ``lint-imports``);
import-linter's graph (grimp) holds every import statement, those inside functions and those
under ``if TYPE_CHECKING:`` (annotations) included. These tests show that
the contracts hold, that they catch a planted upward import and a planted import of one
algorithm package by another, that every algorithm package is in every contract that lists
them, that ``docs/architecture.md`` draws the layers of the contract, and that no import loop
exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
import tomllib

LINT = (
    "import sys; from importlinter.cli import lint_imports_command; "
    "sys.exit(lint_imports_command())"
)
REPO = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the ``zrl`` package found under ``root``, with the repository's
    contracts."""
    return subprocess.run(
        [sys.executable, "-c", LINT, "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "zrl", tmp_path / "zrl", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_every_top_level_module_is_in_a_layer() -> None:
    layers = {m.strip() for layer in CONFIG["contracts"][0]["layers"] for m in layer.split("|")}
    top = {
        f"zrl.{p.stem}" if p.is_file() else f"zrl.{p.name}"
        for p in (REPO / "zrl").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    assert top == layers, f"not in a layer: {sorted(top - layers)}; gone: {sorted(layers - top)}"


def documented_layers() -> list[str]:
    """The layers of the block under "## Layers" in ``docs/architecture.md``: each line's first
    column, a name ending in ``|`` joined with the next line's."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split("\n## Layers\n", 1)[1].split("```", 2)[1]
    layers: list[str] = []
    for line in block.splitlines():
        first = re.split(r"\s{2,}", line, maxsplit=1)[0].strip()
        if not first:
            continue
        if layers and layers[-1].endswith("|"):
            layers[-1] = f"{layers[-1]} {first}"
        else:
            layers.append(first)
    return layers


def test_the_architecture_page_lists_the_layers_of_the_contract() -> None:
    """``docs/architecture.md`` draws the layer contract: the same layers in the same order."""
    contract_layers = [
        " | ".join(m.strip().removeprefix("zrl.") for m in layer.split("|"))
        for layer in CONFIG["contracts"][0]["layers"]
    ]
    assert documented_layers() == contract_layers


def contract(name_starts: str) -> dict:
    (found,) = [c for c in CONFIG["contracts"] if c["name"].startswith(name_starts)]
    return found


def test_every_algorithms_module_is_in_a_layer_and_every_algorithm_in_every_list() -> None:
    """The layers inside ``zrl.algos`` name all of its modules, and every algorithm package
    (a folder with an ``__init__.py`` besides ``api`` and ``kernel``) is in the independence
    contract and the forbidden list: a new algorithm left out of one would go unchecked."""
    algos = REPO / "zrl" / "algos"
    children = {
        p.stem if p.is_file() else p.name
        for p in algos.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    inside = contract("Inside algos")
    layered = {m.strip() for layer in inside["layers"] for m in layer.replace(":", "|").split("|")}
    assert children == layered, f"not in a layer: {sorted(children - layered)}"
    packages = {f"zrl.algos.{name}" for name in children - {"api", "kernel", "models", "registry"}}
    assert (algos / "models.py").is_file() and (algos / "registry.py").is_file()
    assert set(contract("An algorithm is one folder")["modules"]) == packages
    assert set(contract("Generic roles")["forbidden_modules"]) == packages


def test_the_contracts_hold() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line"),
    [
        # at module level, an upward import across layers
        ("zrl/envs/planted.py", "import zrl.roles.base\n"),
        # inside a function: it counts the same
        ("zrl/config/planted.py", "def f():\n    from zrl.run import supervisor\n"),
        # for annotations only: it counts the same (the layer names what is above it)
        (
            "zrl/config/planted.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from zrl.algos import api\n",
        ),
        # a generic role naming an algorithm package
        ("zrl/roles/planted.py", "from zrl.algos.appo import config\n"),
        # an algorithm package importing a sibling: an algorithm is one folder
        ("zrl/algos/appo/planted.py", "from zrl.algos import impala\n"),
        ("zrl/algos/qmix/planted.py", "def f():\n    from zrl.algos.r2d2 import losses\n"),
        # the kernel importing an algorithm package above it
        ("zrl/algos/kernel/planted.py", "from zrl.algos.sac import config\n"),
        # an algorithm reaching into replay instead of the codecs (allowed by the layers)
        ("zrl/algos/apex_dqn/planted.py", "def f():\n    from zrl.replay import frames\n"),
    ],
)
def test_a_planted_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str):
    root = copy_of_the_package(tmp_path)
    (root / module).write_text(line)
    result = lint_imports(root)
    assert result.returncode != 0, result.stdout
    assert (
        "BROKEN" in result.stdout and module.removesuffix(".py").replace("/", ".") in result.stdout
    )


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


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    sys.path.insert(0, str(root))
    try:
        g = grimp.build_graph("zrl", exclude_type_checking_imports=True, cache_dir=None)
    finally:
        sys.path.remove(str(root))
    return {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}


def test_there_is_no_import_loop_counting_imports_inside_functions() -> None:
    graph = import_graph()
    assert "zrl.run.supervisor" in graph and graph["zrl.run.supervisor"]  # the graph was read
    cycle = find_cycle(graph)
    assert cycle is None, "import loop: " + " -> ".join(cycle or [])


def test_a_loop_through_a_function_level_import_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
