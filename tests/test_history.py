"""Readable history: every commit subject is at most 72 characters.

``.githooks/commit-msg`` refuses a longer one when it is made (``git config core.hooksPath
.githooks``, CONTRIBUTING.md); this checks the commits already made after :data:`BASE`, the
commit from which the rule holds, with the hook's own rule, so a clone without the hook is
caught here. Outside a git checkout, or in one that lacks :data:`BASE` (a shallow clone), the
history test skips.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / ".githooks" / "commit-msg"
BASE = "cfeaaffd256ff6221133168ec4107bc914813a87"
"""The last commit before the rule: older subjects are as they were."""


def load_hook() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("commit_msg_hook", str(HOOK))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=60
    )


def test_commit_subjects_after_the_base_are_at_most_72_characters() -> None:
    if shutil.which("git") is None or git("rev-parse", "--is-inside-work-tree").returncode:
        pytest.skip("not in a git checkout")
    if git("cat-file", "-e", f"{BASE}^{{commit}}").returncode:
        pytest.skip(f"the checkout lacks the base commit {BASE[:12]} (a shallow clone?)")
    # --ancestry-path: the commits that descend from the base, not older ones merged later.
    log = git("log", "--ancestry-path", "--format=%h %s", f"{BASE}..HEAD")
    assert log.returncode == 0, log.stderr
    limit = load_hook().MAX_SUBJECT
    long = [line for line in log.stdout.splitlines() if len(line.split(" ", 1)[1]) > limit]
    assert not long, f"commit subjects over {limit} characters:\n" + "\n".join(long)


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        ("Derive the schemas from a few options\n\n" + "a long body line " * 20, False),
        ("x" * 72 + "\n", False),
        ("x" * 73 + "\n", True),
        ("é" * 72 + "\n", False),  # characters, not bytes
        ("# a comment line " * 10 + "\nShort subject\n", False),
        ("A subject that goes on\nwithout a blank line " + "and on " * 8 + "\n", True),
        ("\n\nShort after blank lines\n# ------------------------ >8 ---\n" + "x" * 99, False),
    ],
)
def test_the_hook_refuses_a_subject_over_72_characters(
    tmp_path: Path, message: str, refused: bool
) -> None:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(HOOK), str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == int(refused), result.stderr
    assert ("at most 72" in result.stderr) == refused
