"""Array schemas of zrl's data messages and the one validator they share.

A :class:`Schema` lists the array frames one message kind carries on one path (``zrl.transport
.messages`` declares every one), each an :class:`Array`: its dtype(s), a name per axis and
whether its values must be finite. :func:`validate` checks a received message against one,
naming the array, what was expected and what came. Dims with the same name have the same size
message-wide; the observation dim ``O`` spans every trailing axis.

Sockets: none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from zrl.transport import protocol as P

ANY = "*"
OBS = "O"
"""The observation dim: it spans every trailing axis of the observation's shape (one axis,
the width, for vector observations; ``(4, 84, 84)`` for an Atari frame stack), so it must be
the last dim of an array. Its size is a tuple; ``validate(..., O=n)`` means ``(n,)``."""


@dataclass(frozen=True)
class Array:
    """One array frame of a message kind."""

    dtype: str | tuple[str, ...] | None  # numpy dtype name(s); None: any the protocol carries
    dims: tuple[str, ...]  # a name per axis, the same name the same size message-wide; "*": any
    finite: bool = False  # every value finite (float arrays)

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtype names allowed; empty: any."""
        return (self.dtype,) if isinstance(self.dtype, str) else self.dtype or ()

    @property
    def dtype_text(self) -> str:
        return " or ".join(self.dtypes) or "any"

    def dtype_ok(self, dtype: np.dtype) -> bool:
        return not self.dtypes or any(dtype == np.dtype(name) for name in self.dtypes)


@dataclass(frozen=True)
class Schema:
    """The array frames one message kind carries on one path (exactly these, no others)."""

    kind: str
    name: str
    arrays: Mapping[str, Array]
    doc: str


def schema(kind: str, name: str, doc: str, **arrays: Array) -> Schema:
    """A message kind's schema: its arrays in the order given (the order of the docs)."""
    return Schema(kind, name, MappingProxyType(arrays), doc)


# What differs when a dim's sizes differ between two arrays, for the error message.
_DIM_WORDS = {
    "E": "env counts",
    "T": "lengths",
    "O": "widths",
    "A": "action widths",
    "B": "batch sizes",
    "N": "lengths",
    "S": "frame counts",
    "P": "positions",
    "R": "state widths",
}


Size = int | tuple[int, ...]  # a tuple for the observation dim


def _size(size: Size) -> str:
    """``4`` for a width, ``(4, 84, 84)`` for an image shape."""
    return str(size[0]) if isinstance(size, tuple) and len(size) == 1 else str(size)


def _shape(dims: tuple[str, ...], sizes: Mapping[str, Size]) -> str:
    return "(" + ", ".join(f"{d}={_size(sizes[d])}" if d in sizes else d for d in dims) + ")"


def _dim_sizes(name: str, spec: Array, arr: np.ndarray, what: str) -> list[tuple[str, Size]]:
    """(dim, size) per dim of ``spec`` for ``arr``; ProtocolError on a wrong rank."""
    variadic = spec.dims[-1:] == (OBS,)
    if arr.ndim < len(spec.dims) or (not variadic and arr.ndim != len(spec.dims)):
        expected = f"at least {len(spec.dims)}" if variadic else str(len(spec.dims))
        raise P.ProtocolError(
            f"{what} array {name!r} has rank {arr.ndim}, expected {expected} "
            f"{_shape(spec.dims, {})}"
        )
    head = len(spec.dims) - 1 if variadic else len(spec.dims)
    out: list[tuple[str, Size]] = list(zip(spec.dims[:head], arr.shape[:head], strict=True))
    if variadic:
        out.append((OBS, tuple(arr.shape[head:])))
    return out


def validate(msg: P.Message, schema: Schema, **sizes: Size) -> dict[str, Any]:
    """Check ``msg`` against ``schema``: its kind, exactly the schema's arrays, each one's
    dtype, rank and finiteness, and one size per dim name across the arrays (and equal to
    ``sizes[name]`` where given, e.g. ``O=obs_shape``). Returns the dim sizes {name: size}
    (the observation dim ``O`` as a shape tuple).

    A dim the arrays disagree on is blamed on the array(s) in the minority (the first
    array's size wins a tie). Raises :class:`~zrl.transport.protocol.ProtocolError` naming
    the array, what was expected and what came."""
    unknown = set(sizes) - {d for a in schema.arrays.values() for d in a.dims} - {ANY}
    if unknown:
        raise TypeError(f"schema {schema.name!r} has no dims {sorted(unknown)}")
    if isinstance(sizes.get(OBS), int):
        sizes[OBS] = (int(sizes[OBS]),)  # type: ignore[arg-type]
    what = f"{msg.kind} ({schema.name}) from {msg.sender or '?'}"
    if msg.kind != schema.kind:
        raise P.ProtocolError(f"{what}: kind {msg.kind!r}, expected {schema.kind!r}")
    for name in schema.arrays:
        if name not in msg.arrays:
            raise P.ProtocolError(f"{what} lacks array {name!r}")
    for name in msg.arrays:
        if name not in schema.arrays:
            raise P.ProtocolError(
                f"{what} carries unexpected array {name!r}, expected only {sorted(schema.arrays)}"
            )
    # Every (dim, size) seen, in schema order: the reference size of a dim is the given one,
    # else the one most arrays agree on.
    seen: dict[str, list[tuple[str, Size]]] = {}
    shapes: dict[str, list[tuple[str, Size]]] = {}
    for name, spec in schema.arrays.items():
        arr = msg.arrays[name]
        if not spec.dtype_ok(arr.dtype):
            raise P.ProtocolError(
                f"{what} array {name!r} has dtype {arr.dtype}, expected {spec.dtype_text}"
            )
        shapes[name] = _dim_sizes(name, spec, arr, what)
        for dim, size in shapes[name]:
            if dim != ANY:
                seen.setdefault(dim, []).append((name, size))
    bound: dict[str, Size] = {}
    for dim, uses in seen.items():
        if dim in sizes:
            bound[dim] = sizes[dim]
        else:
            counts = [size for _, size in uses]
            bound[dim] = max(counts, key=lambda n: (counts.count(n), -counts.index(n)))
    for name, spec in schema.arrays.items():
        arr = msg.arrays[name]
        for dim, size in shapes[name]:
            if dim == ANY or size == bound[dim]:
                continue
            expected = f"{what} array {name!r} has shape {arr.shape}, expected " + _shape(
                spec.dims, bound
            )
            if dim in sizes:
                raise P.ProtocolError(
                    f"{expected}: dim {dim} must be {_size(sizes[dim])}, not {_size(size)}"
                )
            ref = next(other for other, n in seen[dim] if n == bound[dim])
            raise P.ProtocolError(
                f"{expected}: {ref} and {name} {_DIM_WORDS.get(dim, 'sizes')} differ "
                f"(dim {dim}: {_size(bound[dim])} vs {_size(size)})"
            )
    for name, spec in schema.arrays.items():
        arr = msg.arrays[name]
        if spec.finite and arr.dtype.kind in "fc":
            ok = np.isfinite(arr)
            if not ok.all():
                bad = ~ok
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                raise P.ProtocolError(
                    f"{what} array {name!r} holds NaN or inf, expected finite values "
                    f"({int(bad.sum())} of {arr.size} are not; the first, {arr[where]}, "
                    f"at {list(where)})"
                )
    return bound
