"""VizDoom basic: zrl APPO against Sample Factory 2.1.1 APPO (its flagship env family), side by
side on this machine, in one run.

Both systems play the same scenario with the same settings, taken from the zrl config
(``configs/vizdoom_basic_appo.yaml``): 128x72 RGB frames, 4 tics a step, ``--envs-per-core``
envs per core (zrl: its actors share them; Sample Factory: one rollout worker per core), the
config's unroll length, batch, minibatch and epochs, everything on the CPU, for the same
``--seconds`` each, one after the other (``--repeats`` alternate which goes first). Each
side keeps its own network: zrl the config's ``nature_cnn``, Sample Factory its VizDoom
default ``convnet_simple``; and its own action set for basic (zrl: no-op + one button at a
time, 4 actions; Sample Factory: idle, left, right, attack, 4 actions).

Printed per system (the mechanics of ``benchmarks/atari.py``, whose functions run both):

- env steps/s and samples trained/s over the steady state (from ``--warmup`` s after the
  first trained batch), and the CPU cores all processes used;
- the training episode return over the last 10 % of the wall time (zrl: the actors' reported
  means; Sample Factory: its episodes, the scenario's reward scaling undone), and the first
  time the mean training return of the last 20 episodes reached ``--threshold``.

Sample Factory runs in its own venv (``python benchmarks/atari.py --build-sf-venv`` builds
it; vizdoom comes from the system site packages it sees); ``benchmarks/sf_vizdoom.py`` is its
launcher. From the repo root::

    pip install -e ".[vizdoom]"
    python benchmarks/vizdoom_vs_sf.py --seconds 120
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # atari.py beside this file

from atari import (  # noqa: E402 - the path above first
    SF,
    SF_VENV,
    ZRL,
    Run,
    final_score,
    load,
    run_sf,
    run_zrl,
    settings_from_config,
    sf_python,
    sf_venv_ok,
    time_to_return,
)

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "vizdoom_basic_appo.yaml"
SF_LAUNCHER = REPO / "benchmarks" / "sf_vizdoom.py"
RETURN_WINDOW = 20  # episodes in the mean of the time to --threshold (basic: 75 steps at most)


def first_at(run: Run, threshold: float) -> float | None:
    """Seconds from launch to the first time the mean training return of the last
    ``RETURN_WINDOW`` episodes reached ``threshold`` (``atari.time_to_return``: Sample
    Factory's single episodes and zrl's reports of several counted the same way)."""
    at = time_to_return(sorted(run.episodes), threshold, RETURN_WINDOW)
    return None if at is None else at - run.launched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="each system's wall time")
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--envs-per-core", type=int, default=4)
    parser.add_argument("--threshold", type=float, default=50.0, help="training return to time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zrl-config", type=Path, default=CONFIG)
    parser.add_argument("--sf-venv", type=Path, default=SF_VENV)
    args = parser.parse_args()
    if not sf_venv_ok(args.sf_venv):
        sys.exit(
            f"no Sample Factory venv at {args.sf_venv}: python benchmarks/atari.py --build-sf-venv"
        )
    s = settings_from_config(args.zrl_config, args.envs_per_core)
    print(f"VizDoom basic, {s.describe()}; load average {load()}", flush=True)
    rows: dict[str, list[dict[str, Any]]] = {ZRL: [], SF: []}
    for r in range(args.repeats):
        for name in (ZRL, SF) if r % 2 == 0 else (SF, ZRL):
            with tempfile.TemporaryDirectory(prefix="zrl-vizdoom-") as tmp:
                if name == ZRL:
                    run = run_zrl(s, args.zrl_config, args.seconds, args.seed + r, Path(tmp), [])
                else:
                    run = run_sf(
                        s,
                        args.seconds,
                        args.seed + r,
                        Path(tmp),
                        sf_python(args.sf_venv),
                        launcher=SF_LAUNCHER,
                    )
            if run.failed:
                sys.exit(f"{name}: {run.failed}")
            steady = run.steady(args.warmup) or {}
            row = {
                "env_steps_per_s": steady.get("env_steps_per_s"),
                "trained_per_s": steady.get("trained_per_s"),
                "total_cores": steady.get("total_cores"),
                "startup_s": steady.get("startup_s"),
                "final_return": final_score(run, args.seconds),
                "first_at_threshold_s": first_at(run, args.threshold),
                "notes": run.notes,
            }
            rows[name].append(row)
            print(f"repeat {r}: {name}: {json.dumps(row, default=float)}  load {load()}")

    def median(name: str, key: str) -> float | None:
        got = [x[key] for x in rows[name] if x[key] is not None]
        return statistics.median(got) if got else None

    def shown(value: float | None, digits: int = 0) -> str:
        return "n/a" if value is None else f"{value:,.{digits}f}"

    print(f"\nmedians of {args.repeats}, {args.seconds:.0f} s each, load average {load()}")
    print(
        "| system | env steps/s | trained/s | cores used | training return, last 10 % | "
        f"first at {args.threshold:g} |"
    )
    print("|---|---|---|---|---|---|")
    for name in (ZRL, SF):
        at = median(name, "first_at_threshold_s")
        print(
            f"| {name} | {shown(median(name, 'env_steps_per_s'))} | "
            f"{shown(median(name, 'trained_per_s'))} | {shown(median(name, 'total_cores'), 2)} | "
            f"{shown(median(name, 'final_return'), 1)} | "
            f"{'not reached' if at is None else f'{at:.0f} s'} |"
        )
    z, p = median(ZRL, "env_steps_per_s"), median(SF, "env_steps_per_s")
    ratio = None if not z or not p else z / p
    print(f"env steps/s, zrl / Sample Factory: {shown(ratio, 2)}")
    print(json.dumps({"settings": s.describe(), "runs": rows, "ratio": ratio}, default=float))


if __name__ == "__main__":
    main()
