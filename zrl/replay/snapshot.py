"""Nested state (dicts of arrays and plain scalars) to and from one numpy ``.npz`` file.

Replay snapshots use this instead of pickle: ``checkpoint.dir`` reaches a role in the
broker's WELCOME, so whatever a snapshot loader reads must not be able to run code.
``np.load(allow_pickle=False)`` reads only raw arrays; the structure and the scalars
travel as one JSON string (entry ``__state__``), with each array replaced by a
reference ``{"__array__": "a<i>"}`` to its own entry.

Loading reads nothing it has not bounded first: every entry's size from the zip directory and
every array's shape from its ``.npy`` header (which must account for exactly the entry's
bytes) before its data, within the caller's ``max_bytes``; a structure at most ``MAX_DEPTH``
deep. A zip bomb, a header that declares terabytes, or JSON nested a million deep is a
:class:`SnapshotError`, not a MemoryError or RecursionError.
"""

from __future__ import annotations

import json
import math
import threading
import time
import zipfile
from pathlib import Path
from typing import IO, Any

import numpy as np

from zrl.utils.durable import atomic_write

STATE_KEY = "__state__"
ARRAY_REF = "__array__"
MAX_DEPTH = 32
"""Nesting of the saved structure at most (a replay snapshot's is 5 deep)."""
MAX_STATE_BYTES = 1 << 22
"""Size of the ``__state__`` entry (the structure and scalars as JSON, 4 bytes a character)."""
READ_CHUNK_BYTES = 1 << 20


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

    Tuples come back as lists. A path is written durably (``zrl.utils.durable.atomic_write``): a
    crash mid-write leaves the snapshot that was there."""
    arrays: dict[str, np.ndarray] = {}
    tree = _flatten(state, arrays, "state")
    entries = {STATE_KEY: np.array(json.dumps(tree)), **arrays}
    if isinstance(file, (str, Path)):
        with atomic_write(file) as f:
            np.savez(f, **entries)  # type: ignore[arg-type]
    else:
        np.savez(file, **entries)  # type: ignore[arg-type]


class BackgroundSave:
    """``save_state(path, state)`` in a thread of its own, started at once. The caller must
    leave every array ``state`` holds untouched until :meth:`done` says it is written (a
    replay shard holds its table still meanwhile and keeps heartbeating: a snapshot of a full
    1M-row table takes seconds). The thread's error, if any, is in ``error``."""

    def __init__(self, path: str | Path, state: dict[str, Any]) -> None:
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.seconds: float | None = None
        self._thread = threading.Thread(
            target=self._save, args=(path, state), name="snapshot-writer", daemon=True
        )
        self._thread.start()

    def _save(self, path: str | Path, state: dict[str, Any]) -> None:
        try:
            save_state(path, state)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller in done()
            self.error = exc
        finally:
            self.seconds = time.monotonic() - self.started

    def done(self, timeout: float | None = 0.0) -> bool:
        """Whether the write has ended (waiting up to ``timeout`` seconds for it; None: until
        it has)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


def _depth(tree: Any) -> int:
    """How deep ``tree`` (dicts and lists from JSON) nests, without recursion."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                return depth
            todo.extend(
                (v, depth + 1) for v in (value.values() if isinstance(value, dict) else value)
            )
    return deepest


def _read_array(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: str | Path) -> np.ndarray:
    """One ``.npy`` entry, its declared shape checked against the entry's size first."""
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise SnapshotError(f"{path}: entry {info.filename!r} is .npy version {version}")
        if dtype.hasobject:
            raise SnapshotError(f"{path}: entry {info.filename!r} holds objects (a pickle)")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes != info.file_size - f.tell():
            raise SnapshotError(
                f"{path}: entry {info.filename!r} declares {dtype} {shape} ({nbytes} bytes) "
                f"in {info.file_size - f.tell()} bytes"
            )
        buffer, done = bytearray(nbytes), 0
        while done < nbytes:
            got = f.read(min(nbytes - done, READ_CHUNK_BYTES))
            if not got:
                raise SnapshotError(f"{path}: entry {info.filename!r} is cut short")
            buffer[done : done + len(got)] = got
            done += len(got)
    return np.frombuffer(buffer, dtype).reshape(shape, order="F" if fortran_order else "C")


def load_state(path: str | Path, max_bytes: int | None = None) -> dict[str, Any]:
    """Read a file written by :func:`save_state`. Never unpickles: a pickle (or an object
    array inside the archive) raises :class:`SnapshotError` naming the file, as does a file
    whose arrays hold more than ``max_bytes`` together (None: no bound), read from the zip
    directory before any array is."""
    try:
        with zipfile.ZipFile(path) as zf:
            entries = {}
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise SnapshotError(f"{path}: unexpected entry {info.filename!r}")
                entries[info.filename[: -len(".npy")]] = info
            state_entry = entries.pop(STATE_KEY, None)
            if state_entry is None:
                raise SnapshotError(f"{path} is not a zrl snapshot (no {STATE_KEY} entry)")
            if state_entry.file_size > MAX_STATE_BYTES:
                raise SnapshotError(
                    f"{path}: its {STATE_KEY} entry has {state_entry.file_size} bytes, more "
                    f"than {MAX_STATE_BYTES}"
                )
            held = sum(info.file_size for info in zf.infolist()) - state_entry.file_size
            if max_bytes is not None and held > max_bytes:
                raise SnapshotError(
                    f"{path} holds {held} bytes of arrays, more than the {max_bytes} this "
                    "table can hold"
                )
            tree = json.loads(str(_read_array(zf, state_entry, path)))
            if _depth(tree) > MAX_DEPTH:
                raise SnapshotError(f"{path}: its state nests more than {MAX_DEPTH} deep")
            arrays = {name: _read_array(zf, info, path) for name, info in entries.items()}
    except SnapshotError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a damaged file trips on: it is unreadable
        raise SnapshotError(f"{path} is not a readable zrl snapshot: {exc}") from None
    state = _unflatten(tree, arrays)
    if not isinstance(state, dict):
        raise SnapshotError(f"{path} is not a zrl snapshot (its state is not a mapping)")
    return state
