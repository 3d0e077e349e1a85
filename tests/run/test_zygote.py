"""The zygote's protocol (``zrl.run.zygote``), with a stand-in for its imports: a zygote started
before the run directory exists keeps its stderr until it is told its log file, and a role
forked from it gets the environment the request adds (the broker's stop token)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zrl.run.zygote import ForkedRole, become_subreaper
from zrl.testing.processes import kill_pids

# The zygote of `zrl run`, less its imports (seconds of torch): preload writes to stderr as an
# import's warning would, and the role prints what it was started with instead of running.
STAND_IN = """
import os, sys, types
import zrl.run.zygote as z
ENTRY = types.SimpleNamespace(
    command=lambda: None,
    main=lambda: print("role", sys.argv[1:], os.environ.get("ZRL_STOP_TOKEN")),
)
def preload(entry):
    print("a warning while importing", file=sys.stderr)
    return ENTRY
z.preload = preload
z.serve(log_later=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks need a subreaper")
def test_a_zygote_started_early_logs_later_and_passes_the_environment(tmp_path: Path):
    assert become_subreaper()  # as the supervisor is: forked roles become our children
    zygote = subprocess.Popen(
        [sys.executable, "-c", STAND_IN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert zygote.stdin and zygote.stdout
    try:
        assert json.loads(zygote.stdout.readline()) == {"ready": True}
        log = tmp_path / "zygote.log"
        zygote.stdin.write(json.dumps({"log": str(log)}) + "\n")  # not answered
        role_log = tmp_path / "broker.log"
        request = {
            "argv": ["start", "broker"],
            "log": str(role_log),
            "env": {"ZRL_STOP_TOKEN": "t"},
        }
        zygote.stdin.write(json.dumps(request) + "\n")
        zygote.stdin.flush()
        role = ForkedRole(int(json.loads(zygote.stdout.readline())["pid"]))
        assert role.wait(timeout=10) == 0
        assert role_log.read_text() == "role ['start', 'broker'] t\n"
        zygote.stdin.write("not json\n")  # answered with an error, not fatal
        zygote.stdin.flush()
        assert "error" in json.loads(zygote.stdout.readline())
        zygote.stdin.close()
        assert zygote.wait(timeout=10) == 0
        # What it wrote to stderr before it knew its log file is there.
        assert log.read_text() == "a warning while importing\n"
    finally:
        if zygote.poll() is None:
            kill_pids([zygote.pid])
