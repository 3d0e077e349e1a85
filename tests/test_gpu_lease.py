"""``benchmarks/gpu_host.py --lease`` (``benchmarks/gpu_lease.sh``): its parts against
made-up inputs (nvidia-smi's CSV, process titles, pytest's closing line, a hand-made wheel, a
fake ``nvidia-smi``), and its dry run on this CPU machine end to end (slow)."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
import torch

from tests.helpers.benchmarks import load_benchmark

REPO = Path(__file__).resolve().parents[1]
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"

gpu_host = load_benchmark("gpu_host")
atari = gpu_host.atari


def make_wheel(folder: Path, name: str, version: str = "0.1") -> Path:
    """A pure-Python wheel of one module ``name`` (``VALUE = 1``), made by hand, and the
    folder's requirements.txt pinning it."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}"
    files = {
        f"{name}.py": b"VALUE = 1\n",
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        ).encode(),
        f"{dist}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")

    record = "".join(f"{p},sha256={digest(d)},{len(d)}\n" for p, d in files.items())
    files[f"{dist}.dist-info/RECORD"] = (record + f"{dist}.dist-info/RECORD,,\n").encode()
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
    (folder / "requirements.txt").write_text(f"{name}=={version}\n")
    return path


def test_smi_csv_is_read_with_its_header_and_units() -> None:
    text = (
        "timestamp, utilization.gpu [%], memory.used [MiB]\n"
        "2026/11/27 10:00:00.000, 45 %, 1234 MiB\n"
        "2026/11/27 10:00:00.500, 97 %, 2048 MiB\n"
        "garbled\n"
    )
    assert gpu_host.parse_smi_csv(text) == ([45.0, 97.0], [1234.0, 2048.0])
    assert gpu_host.parse_smi_csv("") == ([], [])


def test_gpu_sampler_reads_nvidia_smi_running_in_the_background(tmp_path, monkeypatch) -> None:
    """A stand-in ``nvidia-smi`` that prints a header and a line every 0.1 s until stopped."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'echo "timestamp, utilization.gpu [%], memory.used [MiB]"\n'
        'while true; do echo "2026/11/27 10:00:00.000, 50 %, 100 MiB"; sleep 0.1; done\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with gpu_host.GpuSampler(tmp_path / "gpu.csv") as g:
        time.sleep(0.6)
    assert g.values and g.mean == 50.0 and g.memory_max == 100.0
    assert (tmp_path / "gpu.csv").read_text().startswith("timestamp, utilization.gpu")
    assert gpu_host.gpu_text(g).startswith("50 % (")

    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with gpu_host.GpuSampler() as none:
        pass
    assert none.mean is None and gpu_host.gpu_text(none) == "n/a (no nvidia-smi)"


def test_processes_are_named_by_what_they_run() -> None:
    label = gpu_host.proc_label
    assert label(["/usr/bin/python3 -m zrl start actor --index 3 --broker tcp://x"]) == "zrl actor"
    assert label(["python", "-m", "zrl", "run", "configs/pong_appo.yaml"]) == "zrl run"
    assert label(["python", "-m", "zrl.run.zygote", "--entry=x"]) == "zrl zygote"
    assert label(["python", "benchmarks/sf_pong.py", "--out", "x"]) == "Sample Factory"
    spawned = ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"]
    assert label(spawned) == "Sample Factory worker"
    assert label(["/usr/bin/nvidia-smi", "-lms", "500"]) == "nvidia-smi"
    assert label([]) == "?"


def test_pytest_counts_read_the_closing_line() -> None:
    line = "=== 3 failed, 58 passed, 2 skipped, 113 deselected, 1 error in 31.2s ==="
    assert gpu_host.pytest_counts(line) == {
        "failed": 3,
        "passed": 58,
        "skipped": 2,
        "deselected": 113,
        "error": 1,
    }


def test_the_cuda_tests_are_the_modules_that_ask_for_a_gpu() -> None:
    files = {p.relative_to(REPO).as_posix() for p in gpu_host.cuda_test_files()}
    assert {
        "tests/nets/test_encoders.py",
        "tests/algos/test_appo.py",
        "tests/algos/test_batches.py",
        "tests/roles/test_inference.py",
    } <= files
    assert not files & {"tests/test_gpu_host_bench.py", "tests/test_gpu_lease.py"}


def test_the_plugin_keeps_only_the_tests_that_need_a_gpu(tmp_path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / f"{gpu_host.CUDA_ONLY_PLUGIN}.py").write_text(gpu_host.CUDA_ONLY_TEXT)
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_x.py").write_text(
        "import pytest\n\n"
        '@pytest.mark.skipif(True, reason="needs a GPU")\n'
        "def test_gpu_here():\n    pass\n\n"
        '@pytest.mark.skipif(False, reason="needs a CUDA device")  # as on a GPU host\n'
        "def test_gpu_there():\n    pass\n\n"
        '@pytest.mark.skipif(True, reason="checks the answer without a GPU")\n'
        "def test_inverse():\n    pass\n\n"
        "def test_plain():\n    pass\n"
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["-p", gpu_host.CUDA_ONLY_PLUGIN, "test_x.py"]
    env = os.environ | {"PYTHONPATH": str(plugins)}
    proc = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert gpu_host.pytest_counts(last) == {"passed": 1, "skipped": 1, "deselected": 2}


def test_wheels_install_offline_from_their_folder_alone(tmp_path) -> None:
    folder = tmp_path / "wheels"
    make_wheel(folder, "lease_probe")
    rc, text = gpu_host.install_wheels(folder, tmp_path / "site", HERE, tmp_path / "pip.log")
    assert rc == 0, text
    assert (tmp_path / "site" / "lease_probe.py").read_text() == "VALUE = 1\n"
    assert "--no-index" in (tmp_path / "pip.log").read_text()
    # A pin the folder has no wheel for: pip fails, it looks nowhere else.
    (folder / "requirements.txt").write_text("lease_probe==0.1\nlease-missing==1.0\n")
    rc, text = gpu_host.install_wheels(folder, tmp_path / "site2", HERE, tmp_path / "pip2.log")
    assert rc != 0 and "lease-missing" in text


def test_g1_rates_are_the_steady_window_else_the_stepping() -> None:
    S = atari.Sample
    steady = atari.Run("zrl", launched=0.0)
    steady.samples = [S(float(t), 100 * t, 50 * max(0, t - 5), 0.2 * t, t) for t in range(3, 30)]
    got = gpu_host.run_rates(steady, warmup=5.0)
    assert got is not None and got["basis"].startswith("steady")
    assert got["env_steps_per_s"] == pytest.approx(100.0)
    assert got == {**steady.steady(5.0), "basis": got["basis"]}

    # Nothing trained (a short CPU run): env steps/s from the first step to the last that moved.
    stepping = atari.Run("zrl", launched=0.0)
    stepping.samples = [S(4.0, 0, 0, 0, 0), S(6.0, 100, 0, 0, 1), S(10.0, 500, 0, 0, 3)]
    stepping.samples += [S(11.0, 500, 0, 0, 3)]  # the stop
    got = gpu_host.run_rates(stepping, warmup=0.0)
    assert got is not None and got["basis"].startswith("from the first env step")
    assert got["env_steps_per_s"] == pytest.approx(100.0)
    assert got["startup_s"] == 6.0 and got["window_s"] == 4.0

    assert gpu_host.run_rates(atari.Run("zrl", launched=0.0), warmup=0.0) is None


def test_a_run_stops_seconds_after_its_first_env_step_or_at_its_cap() -> None:
    now = time.time()
    run = atari.Run("zrl", launched=now - 20)
    run.samples = [atari.Sample(now - 8, 0, 0, 0, 0), atari.Sample(now - 5, 64, 0, 0, 0)]
    assert not gpu_host.stop_after_stepping(10.0, 60.0)(run)
    assert gpu_host.stop_after_stepping(4.0, 60.0)(run)
    assert gpu_host.stop_after_stepping(10.0, 15.0)(atari.Run("zrl", launched=now - 20))


def test_shown_command_leaves_out_the_sets_a_later_one_overrides() -> None:
    cmd = [sys.executable, "-m", "zrl", "run", str(REPO / "configs" / "pong_appo.yaml")]
    cmd += ["--set", "env.num_envs=16", "--set", "seed=0", "--set", "env.num_envs=8"]
    got = gpu_host.shown_command(cmd)
    assert got == "zrl run configs/pong_appo.yaml --set seed=0 --set env.num_envs=8"


def test_proc_cpu_counts_the_processes_it_started(tmp_path) -> None:
    burn = "import time\nt = time.time()\nwhile time.time() < t + 1.5:\n    pass\n"
    with gpu_host.ProcCpu(tmp_path / "cpu.csv", every=0.2) as pc:
        subprocess.run([sys.executable, "-c", burn], check=True, timeout=60)
    summary = pc.summary()
    child = Path(sys.executable).name
    assert summary[child]["processes"] == 1 and summary[child]["cores"] > 0
    assert "gpu_host.py" in summary
    with open(tmp_path / "cpu.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["label"] for r in rows} >= {child, "gpu_host.py"}
    assert gpu_host.cpu_text(summary).split(" cores: ")[0].replace(".", "").isdigit()


@pytest.mark.slow
@pytest.mark.waits  # fixed-length steps: the rates it checks are only > 0
def test_the_dry_run_goes_through_every_step_and_writes_its_results(tmp_path) -> None:
    """The lease's dry run on this CPU machine, shortened: wheels made here installed offline
    (Sample Factory's folder holds a stand-in, which does not import: its run is left out,
    saying so), the CUDA tests (skipped here), (g3) and zrl's (g1) on the CPU, the bare env;
    the results folder holds the table, the figures and the logs, with numbers in them."""
    wheels, out = tmp_path / "wheels", tmp_path / "out"
    make_wheel(wheels / "zrl", "lease_probe")
    make_wheel(wheels / "sf", "lease_sf_probe")
    (wheels / "python-version").write_text(HERE + "\n")
    cmd = [sys.executable, "benchmarks/gpu_host.py", "--lease", "--dry-run", "--out", str(out)]
    cmd += ["--work", str(tmp_path / "work"), "--wheels", str(wheels)]
    cmd += ["--g3-seconds", "4", "--g1-seconds", "5", "--ceiling-seconds", "2"]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=280)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "lease.log",
        "logs.tar.gz",
        "report.json",
        "table.md",
    ]

    report = json.loads((out / "report.json").read_text())
    steps = report["steps"]
    assert report["dry_run"] and not report["failed"]
    assert steps["wheels"]["native"] and steps["wheels"]["seconds"] > 0
    assert steps["tests"]["rc"] == 0 and steps["tests"]["counts"].get("deselected", 0) > 0
    if not torch.cuda.is_available():
        assert steps["tests"]["counts"].get("skipped", 0) > 0
    assert steps["g3"]["samples_per_s"] > 0 and steps["g3"]["batches"] >= 1
    assert steps["zrl"]["rates"]["env_steps_per_s"] > 0
    assert any(k.startswith("zrl ") for k in steps["zrl"]["cpu"])
    assert "learner.device=cpu --set roles.actors=auto" in steps["zrl"]["command"]
    assert "sf" not in steps  # its stand-in does not import
    assert steps["ceiling"]["env_steps_per_s"] > 0
    assert report["elapsed_s"] <= took

    table = (out / "table.md").read_text()
    assert re.search(r"\| \(g3\) learner intake \| [\d,]+ samples/s on cpu", table)
    assert re.search(r"\| \(g1\) zrl, the README's GPU line .*\| [\d,]+ env steps/s", table)
    assert re.search(r"\| \(g1\) Sample Factory .* \| not run \(does not import", table)
    assert re.search(r"\| \(g1\) bare AtariVectorEnv, 16 envs \| [\d,]+ env steps/s", table)
    assert re.search(r"learner intake, samples/s: [\d,]+ +target >= 50,000", table)
    assert re.search(r"lease wall time, seconds: \d+ +target <= 360: MET", table)
    assert "(g3) the learner's intake alone" in (out / "lease.log").read_text()

    with tarfile.open(out / "logs.tar.gz") as tar:
        names = set(tar.getnames())
        progress = tar.extractfile("logs/g1-zrl/zrl/progress.csv")
        assert progress is not None
        rows = list(csv.DictReader(progress.read().decode().splitlines()))
    assert {
        "logs/pip-zrl.log",
        "logs/pip-sf.log",
        "logs/cuda-tests.log",
        "logs/cpu-g3.csv",
        "logs/g1-zrl/zrl.log",
        "logs/cpu-g1-zrl.csv",
        "logs/cpu-ceiling.csv",
    } <= names
    assert not [n for n in names if "keys" in n.split("/")]  # a run's keys stay behind
    assert int(float(rows[-1]["env_steps"])) > 0
