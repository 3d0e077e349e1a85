"""Files that survive a crash and a power cut: written whole, or not at all.

Every checkpoint, snapshot and run-directory file that replaces an earlier one is written
through :func:`atomic_write`: into ``<name>.tmp`` beside it, flushed and ``fsync``'d, renamed
over the old one with ``os.replace``, and then the directory is ``fsync``'d.

Why both fsyncs: ``os.replace`` alone is atomic against a crash of the process, not of the
machine. Without the file's fsync, the rename can reach the disk before the data does (ext4
with ``delalloc``, xfs), and after a power cut the checkpoint is empty or zero-filled, with
the old one already gone. Without the directory's fsync, the rename itself may be lost, and
a resumed run starts from the previous checkpoint while the files written beside it (a
replay snapshot, the run's summary) are newer.

A fixed ``.tmp`` name rather than a unique one: a writer killed mid-write leaves one stale
temporary file, which the next write replaces, not one more file per crash. Each file has
one writer (a role writes its own checkpoint), so two writers never share a temporary name.
No sockets.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

TMP_SUFFIX = ".tmp"


def temporary_path(path: Path) -> Path:
    """Where :func:`atomic_write` writes ``path`` before the rename."""
    return path.with_name(path.name + TMP_SUFFIX)


def fsync_directory(directory: Path) -> None:
    """Make the directory's entries (a rename into it) durable."""
    if os.name != "posix":  # only POSIX can open a directory to fsync it
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new contents into (``torch.save(obj, f)``,
    ``np.savez(f, ...)``, ``f.write(data)``). ``path`` is replaced only when the block ends
    without an exception, and only once the data and the rename are on disk; if it raises,
    ``path`` keeps its old contents and the temporary file is removed."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data``, durably (see :func:`atomic_write`)."""
    with atomic_write(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` in UTF-8, durably (see :func:`atomic_write`)."""
    atomic_write_bytes(path, text.encode())
