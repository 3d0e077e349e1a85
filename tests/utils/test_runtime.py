"""zrl.utils.runtime: the per-process set-up every role process makes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from zrl.utils.runtime import keep_freed_memory

# A child allocates a 100 MB array and frees it, and prints what glibc's mallinfo2 says:
# the bytes in mmapped blocks while the array lives, and the free bytes the heap keeps after.
MALLINFO = """
import ctypes, sys
import numpy as np
from zrl.utils.runtime import keep_freed_memory

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = Info
on = keep_freed_memory(None if sys.argv[1] == "none" else int(sys.argv[1]))
a = np.ones(25_000_000, np.float32)
mapped = mallinfo2().hblkhd
del a
print(on, mapped, mallinfo2().fordblks)
"""
MB = 2**20


def heap_after_a_big_array(mb: str) -> tuple[bool, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", MALLINFO, mb], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    return out[0] == "True", int(out[1]), int(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_big_blocks_come_from_the_heap_and_stay_there_for_reuse() -> None:
    on, mapped, kept = heap_after_a_big_array("1024")
    assert on and mapped < 10 * MB and kept >= 95 * MB  # on the heap; freed, still there
    off, mapped, kept = heap_after_a_big_array("none")
    assert not off and mapped >= 95 * MB and kept < 50 * MB  # glibc: mapped, then unmapped
    on, _, kept = heap_after_a_big_array("16")
    assert on and kept < 50 * MB  # past the limit the heap gives memory back


def test_none_leaves_malloc_alone() -> None:
    assert keep_freed_memory(None) is False
