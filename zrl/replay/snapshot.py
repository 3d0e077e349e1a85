"""Nested state (dicts of arrays and plain scalars) to and from one numpy ``.npz`` file.

Replay snapshots use this instead of pickle: ``checkpoint.dir`` reaches a role in the
broker's WELCOME, so whatever a snapshot loader reads must not be able to run code.
``np.load(allow_pickle=False)`` reads only raw arrays; the structure and the scalars
travel as one JSON string (entry ``__state__``), with each array replaced by a
reference ``{"__array__": "a<i>"}`` to its own entry.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import IO, Any

import numpy as np

from zrl.durable import atomic_write

STATE_KEY = "__state__"
ARRAY_REF = "__array__"


class SnapshotError(ValueError):
    """A snapshot file that is not one this module wrote (or is damaged)."""


def _flatten(value: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise SnapshotError(f"{where}: object arrays cannot be saved without pickle")
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {ARRAY_REF: name}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if ARRAY_REF in value:
            raise SnapshotError(f"{where}: the key {ARRAY_REF!r} is reserved")
        return {str(k): _flatten(v, arrays, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_flatten(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise SnapshotError(f"{where}: {type(value).__name__} is neither an array nor a scalar")


def _unflatten(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, dict):
        if set(value) == {ARRAY_REF}:
            name = value[ARRAY_REF]
            if name not in arrays:
                raise SnapshotError(f"the state names an array {name!r} the file lacks")
            return arrays[name]
        return {k: _unflatten(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_unflatten(v, arrays) for v in value]
    return value


def save_state(file: str | Path | IO[bytes], state: dict[str, Any]) -> None:
    """Write ``state`` (nested dicts/lists of arrays, ints, floats, strings, bools, None).

    Tuples come back as lists. A path is written durably (``zrl.durable.atomic_write``): a
    crash mid-write leaves the snapshot that was there."""
    arrays: dict[str, np.ndarray] = {}
    tree = _flatten(state, arrays, "state")
    entries = {STATE_KEY: np.array(json.dumps(tree)), **arrays}
    if isinstance(file, (str, Path)):
        with atomic_write(file) as f:
            np.savez(f, **entries)  # type: ignore[arg-type]
    else:
        np.savez(file, **entries)  # type: ignore[arg-type]


def load_state(path: str | Path) -> dict[str, Any]:
    """Read a file written by :func:`save_state`. Never unpickles: a pickle (or an object
    array inside the archive) raises :class:`SnapshotError` naming the file."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise SnapshotError(f"{path} is not a zrl snapshot (a bare array, not an archive)")
        with loaded as npz:
            if STATE_KEY not in npz.files:
                raise SnapshotError(f"{path} is not a zrl snapshot (no {STATE_KEY} entry)")
            arrays = {name: npz[name] for name in npz.files if name != STATE_KEY}
            tree = json.loads(str(npz[STATE_KEY]))
    except SnapshotError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        # np.load refuses a pickle with ValueError ("allow_pickle=False"): never unpickled.
        raise SnapshotError(f"{path} is not a readable zrl snapshot: {exc}") from None
    state = _unflatten(tree, arrays)
    if not isinstance(state, dict):
        raise SnapshotError(f"{path} is not a zrl snapshot (its state is not a mapping)")
    return state
