"""``zrl.utils.durable``: a replaced file is the old one or the whole new one, and both the file
and the rename are fsync'd before the write counts as done."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from zrl.utils.durable import atomic_write, atomic_write_bytes, atomic_write_text, temporary_path


class Boom(Exception):
    pass


def test_a_write_that_raises_midway_leaves_the_old_file(tmp_path: Path):
    path = tmp_path / "learner-0.pt"
    atomic_write_bytes(path, b"old checkpoint")
    with pytest.raises(Boom), atomic_write(path) as f:
        f.write(b"half of the new")
        raise Boom
    assert path.read_bytes() == b"old checkpoint"
    assert not temporary_path(path).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learner-0.pt"]


def test_a_first_write_that_raises_leaves_no_file(tmp_path: Path):
    path = tmp_path / "summary.json"
    with pytest.raises(Boom), atomic_write(path) as f:
        f.write(b"{")
        raise Boom
    assert list(tmp_path.iterdir()) == []


def test_the_file_and_then_its_directory_are_fsynced(tmp_path: Path, monkeypatch):
    synced: list[tuple[str, bool]] = []  # (what the fd is, whether the new name existed yet)
    real_fsync = os.fsync
    path = tmp_path / "replay-0.snapshot"

    def fsync(fd: int) -> None:
        mode = os.fstat(fd).st_mode
        synced.append(("dir" if stat.S_ISDIR(mode) else "file", path.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    # The data is on disk before the rename makes it the file; the rename after.
    assert synced == [("file", False), ("dir", True)]


def test_the_directory_fsynced_is_the_files_own(tmp_path: Path, monkeypatch):
    opened: list[str] = []
    real_open = os.open

    def os_open(p: str | os.PathLike[str], flags: int, *args: int) -> int:
        opened.append(os.fspath(p))
        return real_open(p, flags, *args)

    monkeypatch.setattr(os, "open", os_open)
    (tmp_path / "checkpoints").mkdir()
    atomic_write_bytes(tmp_path / "checkpoints" / "league.json", b"{}")
    assert os.fspath(tmp_path / "checkpoints") in opened


def test_torch_save_and_np_savez_write_through_it(tmp_path: Path):
    with atomic_write(tmp_path / "model.pt") as f:
        torch.save({"w": torch.arange(3)}, f)
    assert torch.load(tmp_path / "model.pt", weights_only=True)["w"].tolist() == [0, 1, 2]
    # np.savez given a path would add ".npz"; given the open file it writes this very name.
    with atomic_write(tmp_path / "s.snapshot") as f:
        np.savez(f, a=np.ones(2))
    with np.load(tmp_path / "s.snapshot") as z:
        assert z["a"].tolist() == [1.0, 1.0]


def test_a_stale_temporary_file_is_replaced(tmp_path: Path):
    path = tmp_path / "league_snapshots.npz"
    temporary_path(path).write_bytes(b"left by a writer killed mid-write")
    atomic_write_bytes(path, b"whole")
    assert path.read_bytes() == b"whole" and not temporary_path(path).exists()


def test_text_is_utf8(tmp_path: Path):
    atomic_write_text(tmp_path / "s.json", "résumé")
    assert (tmp_path / "s.json").read_bytes() == "résumé".encode()
