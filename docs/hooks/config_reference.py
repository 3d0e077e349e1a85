"""An MkDocs hook that writes the config reference into ``docs/configs.md`` at build time.

The reference is generated from the config classes themselves: every top-level key of
``zrl.config.experiment.config_schema()`` (the sections every algorithm shares and the
algorithms' own, in the order ``zrl config show`` prints them), each section's fields with their
type, default and bounds from pydantic, and the doc line under each field from the class's
source. So the page cannot drift from the code. ``tests/test_docs.py`` renders it too.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

MARKER = "<!-- config-reference -->"
"""Where in ``docs/configs.md`` the generated reference goes."""

_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def field_docs(cls: type) -> dict[str, str]:
    """The string literal under each annotated field of ``cls`` and its bases (the base's doc
    where a subclass gives none)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is BaseModel or not issubclass(klass, BaseModel):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt, after in zip(body.body, body.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _section_class(annotation: Any) -> type[BaseModel] | None:
    """The section model an annotation holds (``X``, ``list[X]``, ``X | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _section_class(arg)
        if found is not None:
            return found
    return None


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        if issubclass(annotation, BaseModel):
            return "section"
        return annotation.__name__
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is not None and args:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(map(_type_name, args))}]"
    return str(annotation).replace("typing.", "")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        if _section_class(field.annotation) is not None and not typing.get_args(field.annotation):
            return "(section)"
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.is_required():
        return "required"
    else:
        value = field.default
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str) and not value:
        return '`""`'
    return f"`{value}`"


def _bounds(field: FieldInfo) -> str:
    parts = []
    for meta in field.metadata:
        for attr, sign in _BOUNDS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)


def _cell(text: str) -> str:
    """A doc string as one markdown table cell: reST ``code`` as `code`, one line, pipes
    escaped."""
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    return " ".join(text.split()).replace("|", "\\|")


def _section_table(model: type[BaseModel], key: str, out: list[str]) -> None:
    """The table of ``model``'s fields under the heading ``key``, then its nested sections."""
    docs = field_docs(model)
    anchor = key.replace("[]", "").replace(".", "-")
    out.append(f"### `{key}` {{#{anchor}}}\n")
    if model.__doc__ and model.__doc__ is not BaseModel.__doc__:
        out.append(_cell(inspect.cleandoc(model.__doc__)) + "\n")
    out.append("| key | type | default | bounds | meaning |")
    out.append("| --- | --- | --- | --- | --- |")
    nested = []
    for name, field in model.model_fields.items():
        sub = _section_class(field.annotation)
        if sub is not None:
            nested.append((name, field, sub))
        row = [
            f"`{name}`",
            _type_name(field.annotation),
            _default(field),
            _bounds(field),
            _cell(docs.get(name, "")),
        ]
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    for name, field, sub in nested:
        suffix = "[]" if typing.get_origin(field.annotation) is list else ""
        _section_table(sub, f"{key}.{name}{suffix}", out)


def render_reference() -> str:
    """The generated reference: the top-level keys, then one table per section."""
    from zrl.config.experiment import ExperimentConfig, algo_sections, config_schema

    schema = config_schema()
    users: dict[str, list[str]] = {}
    for algo, sections in algo_sections().items():
        for section in sections:
            users.setdefault(section, []).append(algo)
    specific = {s for s, algos in users.items() if len(algos) < len(algo_sections())}
    top_docs = field_docs(ExperimentConfig)
    out = ["## Top-level keys\n", "| key | type | read by | meaning |", "| --- | --- | --- | --- |"]
    for key, annotation in schema.items():
        section = _section_class(annotation)
        kind = f"[section](#{key})" if section is not None else _type_name(annotation)
        if typing.get_origin(annotation) is list and section is not None:
            kind = f"list of [sections](#{key})"
        readers = ", ".join(f"`{a}`" for a in users[key]) if key in specific else "every algo"
        doc = top_docs.get(key) or (inspect.cleandoc(section.__doc__ or "") if section else "")
        out.append(f"| `{key}` | {kind} | {readers} | {_cell(doc)} |")
    out.append("\n## Sections\n")
    for key, annotation in schema.items():
        section = _section_class(annotation)
        if section is not None:
            _section_table(
                section, key + ("[]" if typing.get_origin(annotation) is list else ""), out
            )
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: replace the marker in the configs page with the generated reference."""
    if MARKER in markdown:
        return markdown.replace(MARKER, render_reference())
    return markdown
