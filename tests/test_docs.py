"""The README stays a front door, its links resolve, and the generated config reference covers
every config section (``docs/hooks/config_reference.py``, rendered as ``mkdocs build`` does)."""

from __future__ import annotations

import importlib.util
import re
import typing
from pathlib import Path
from types import ModuleType

from zrl.config.experiment import config_schema

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MAX_README_BYTES = 12 * 1024

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _hook() -> ModuleType:
    path = REPO / "docs" / "hooks" / "config_reference.py"
    spec = importlib.util.spec_from_file_location("config_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_at_most_12_kb() -> None:
    size = len(README.read_bytes())
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes; move detail into docs/"


def test_readme_relative_links_resolve() -> None:
    text = re.sub(r"```.*?```", "", README.read_text(), flags=re.S)
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (REPO / path).exists():
            broken.append(target)
    assert not broken, f"README.md links to files that do not exist: {broken}"


def test_config_reference_covers_every_section() -> None:
    hook = _hook()
    page = (REPO / "docs" / "configs.md").read_text()
    assert hook.MARKER in page, "docs/configs.md lost the marker the reference replaces"
    reference = hook.render_reference()
    for key, annotation in config_schema().items():
        assert f"| `{key}` |" in reference, f"top-level key {key} missing from the reference"
        section = hook._section_class(annotation)
        if section is None:
            continue
        suffix = "[]" if typing.get_origin(annotation) is list else ""
        assert f"### `{key}{suffix}`" in reference, f"section {key} has no table"
        for field in section.model_fields:
            assert f"| `{field}` |" in reference, f"{key}.{field} missing from the reference"


def test_field_docs_are_read_from_the_source() -> None:
    from zrl.config.sections import StopConfig

    docs = _hook().field_docs(StopConfig)
    assert docs, "no field docs found in StopConfig"
    assert all(isinstance(v, str) and v for v in docs.values())


def test_the_dict_config_example_of_the_scripts_page_builds_its_config() -> None:
    section = (REPO / "docs" / "scripts.md").read_text().split("## The config as a dict", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert match is not None, "docs/scripts.md lost its dict config example"
    namespace: dict[str, typing.Any] = {"__name__": "docs_example"}  # not __main__: no run
    exec(compile(match.group(1), "docs/scripts.md", "exec"), namespace)  # noqa: S102
    cfg = namespace["experiment"].resolved_config()
    assert (cfg.algo, cfg.env.id, cfg.seed, cfg.roles.replay) == ("ppo", "CartPole-v1", 1, 0)
    assert cfg.learner.lr == 0.001 and cfg.stop.eval_return == 475
