"""Actor throughput benchmark: env steps/s of a real zrl actor against a bare loop.

(1) A bare loop in its own process, 1 torch thread, no messaging: the actor's vector env
    (``zrl.envs.vector.make_vector_env``) and, every vector step, the same batched Q forward
    (``zrl.nets.discrete.build_q_network``, same seed) and Ape-X epsilon-greedy as the Ape-X DQN
    policy's ``act`` (``zrl.algos.apex_dqn.policy.ApexDQNPolicy``). Not included: the actor's
    trajectory buffers, episode bookkeeping, n-step returns and initial priorities (a second
    forward per trajectory), encoding and sending. As a second reference, the real generic
    ``Actor.setup`` + ``Actor.collect`` (with the algorithm's policy, as a running actor builds
    it) in a loop with sockets stubbed out separates the actor's own compute from its messaging.
(2) ``python -m zrl start actor`` pushing to a real broker and replay shard
    (``python -m zrl start replay``), no learner, params or evaluator, with the config
    ``configs/cartpole_apex_dqn.yaml`` plus ``replay.samples_per_insert: 0`` (inserts are
    never rate-limited) and a replay capacity larger than the run. Steps/s comes from the
    actor's own ``env_steps`` and timestamps on the ``metrics`` topic.

The references run half their time before and half after the actor so load drifts on a
shared machine hit both alike. Both count valid steps only (NEXT_STEP autoreset steps excluded), as
the actor does. Run from the repo root::

    python benchmarks/actor_throughput.py --seconds 20
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zrl.transport.endpoints import free_port_range

TARGET = 0.8
REPO = Path(__file__).resolve().parent.parent
BASE_CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
REPLAY_CAPACITY = 2_000_000
WARMUP_S = 3.0
START_TIMEOUT_S = 60.0


# --- the bare loop (child process, spawn) -----------------------------------------------


def reference_loops(spec: dict[str, Any], cmds: Any, out: Any) -> None:
    """The no-messaging references, in one process; each command on ``cmds`` is
    (kind, seconds) with kind "bare" or "collect", answered with {"steps", "elapsed"}."""
    import numpy as np
    import torch

    from zrl.algos.kernel.exploration import apex_epsilons
    from zrl.config.experiment import ExperimentConfig
    from zrl.envs.vector import make_vector_env
    from zrl.nets.discrete import build_q_network
    from zrl.roles.actor import Actor
    from zrl.utils.runtime import actor_seed, limit_torch_threads

    cfg = ExperimentConfig.model_validate(spec)
    limit_torch_threads(1)
    seed = actor_seed(cfg.seed, 0)
    torch.manual_seed(cfg.seed)  # as Actor.setup: same initial weights, same policy
    rng = np.random.default_rng(seed)
    envs = make_vector_env(cfg.env)
    E = envs.num_envs
    model = build_q_network(
        envs.single_observation_space, envs.single_action_space, cfg.model.hidden, cfg.model.dueling
    )
    model.eval()
    num_actions = int(envs.single_action_space.n)  # type: ignore[attr-defined]
    eps = apex_epsilons(max(cfg.roles.actors, 1) * E, cfg.actor.epsilon, cfg.actor.epsilon_alpha)
    eps = eps[:E].astype(np.float32)
    obs, _ = envs.reset(seed=seed)
    obs = np.asarray(obs, dtype=np.float32).reshape(E, -1)
    needs_reset = np.zeros(E, dtype=bool)

    def bare(duration: float) -> tuple[int, float]:
        nonlocal obs, needs_reset
        steps = 0
        clock = time.perf_counter
        t0 = clock()
        end = t0 + duration
        with torch.no_grad():
            while True:
                q = model(torch.from_numpy(obs)).numpy()
                greedy = q.argmax(axis=1)
                explore = rng.random(E) < eps
                random_actions = rng.integers(0, num_actions, size=E)
                a = np.where(explore, random_actions, greedy)
                next_obs, _r, term, trunc, _ = envs.step(a)
                obs = np.asarray(next_obs, dtype=np.float32).reshape(E, -1)
                steps += int(E - needs_reset.sum())
                needs_reset = np.asarray(term) | np.asarray(trunc)
                t = clock()
                if t >= end:
                    return steps, t - t0

    # The real Actor.setup and Actor.collect with the sockets stubbed out (no broker).
    actor: Any = None
    actor_error = ""
    try:
        actor = Actor("tcp://127.0.0.1:9", index=0)
        actor.config = cfg
        actor.open_push = actor.open_pull = lambda *a, **k: None
        actor.open_subscriber = actor.open_publisher = lambda *a, **k: None
        actor.lookup = lambda *a, **k: []
        actor.setup()
    except Exception as exc:
        actor, actor_error = None, f"{type(exc).__name__}: {exc}"

    def collect(duration: float) -> tuple[int, float]:
        clock = time.perf_counter
        s0, t0 = actor.env_steps, clock()
        end = t0 + duration
        while True:
            actor.collect()
            t = clock()
            if t >= end:
                return actor.env_steps - s0, t - t0

    bare(1.0)
    if actor is not None:
        try:
            collect(1.0)
        except Exception as exc:
            actor, actor_error = None, f"{type(exc).__name__}: {exc}"
    out.put({"env": f"{type(envs.unwrapped).__name__} x{E}"})
    while (cmd := cmds.get()) is not None:
        kind, duration = cmd
        if kind == "collect" and actor is None:
            out.put({"error": actor_error})
            continue
        before = schedstat(os.getpid())
        steps, elapsed = (bare if kind == "bare" else collect)(duration)
        after = schedstat(os.getpid())
        res: dict[str, Any] = {"steps": steps, "elapsed": elapsed}
        if before and after:
            res["on_cpu"] = after[0] - before[0]
            res["waiting"] = after[1] - before[1]
        out.put(res)
    envs.close()


# --- processes --------------------------------------------------------------------------


def stop_process(p: Any, timeout: float = 5.0) -> None:
    """Stop one process we started, by its PID: SIGTERM (a clean stop), then SIGKILL."""
    if isinstance(p, subprocess.Popen):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout)
    elif p.pid is not None and p.is_alive():
        p.terminate()
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join(timeout)


def schedstat(pid: int) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting for one) of a process's main thread."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            on_cpu, waiting, _ = f.read().split()
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return None


def zrl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "zrl", *args, "--log-level", "WARNING"]


def write_config(path: Path, num_envs: int | None) -> Any:
    import yaml

    from zrl.config.experiment import config_from_dict

    data = yaml.safe_load(BASE_CONFIG.read_text())
    overrides = [
        "replay.samples_per_insert=0",
        f"replay.capacity={REPLAY_CAPACITY}",
        "roles.actors=1",
        "roles.replay=1",
        "roles.params=0",
        "roles.learners=0",
        "roles.evaluator=0",
    ]
    if num_envs is not None:
        overrides.append(f"env.num_envs={num_envs}")
    cfg = config_from_dict(data, overrides)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return cfg


def measure_actor(
    started: list[Any], cfg_path: Path, seconds: float, log_dir: Path
) -> dict[str, Any]:
    import zmq

    from zrl.roles.registry_client import registry_request
    from zrl.transport import protocol as P
    from zrl.transport.endpoints import broker_endpoints
    from zrl.transport.sockets import Channel, TransportStats, make_socket

    cfg_streams = ["experience", "batches", "priorities", "gradients"]
    base = free_port_range(3 + 2 * len(cfg_streams))
    addr = f"tcp://127.0.0.1:{base}"

    def spawn(name: str, *args: str) -> subprocess.Popen:
        log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115
        p = subprocess.Popen(zrl_cmd(*args), stdout=subprocess.DEVNULL, stderr=log)
        started.append(p)
        return p

    broker = spawn("broker", "start", "broker", "--bind", addr, "--config", str(cfg_path))
    ctx = zmq.Context.instance()
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if broker.poll() is not None:
            return {"error": f"broker exited; see {log_dir / 'broker.log'}"}
        try:
            registry_request(ctx, addr, P.Message(P.STATUS), timeout=0.5)
            break
        except Exception:
            if time.monotonic() > deadline:
                return {"error": "broker did not answer"}
    endpoints = broker_endpoints(addr, cfg_streams)
    sock = make_socket(ctx, zmq.SUB, rcvhwm=10_000, rcvtimeo_ms=200)
    sock.setsockopt(zmq.SUBSCRIBE, b"metrics")
    sock.connect(endpoints["topics_out"])
    sub = Channel(sock, "metrics", "bench", TransportStats(), topics=True)
    procs = {
        "replay": spawn("replay", "start", "replay", "--broker", addr, "--index", "0"),
        "actor": spawn("actor", "start", "actor", "--broker", addr, "--index", "0"),
    }
    try:
        actor: list[tuple[float, int]] = []  # (role's time, env_steps)
        replay: list[tuple[float, int]] = []  # (role's time, inserts)
        blocked = 0.0
        sched0: dict[str, tuple[float, float] | None] = {}
        wall0 = time.monotonic()
        first_steps_at: float | None = None
        t_measure_start = t_end = None
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            now = time.monotonic()
            for name, p in procs.items():
                if p.poll() is not None:
                    return {"error": f"{name} exited with {p.returncode}; see {log_dir}"}
            if first_steps_at is None and now > deadline:
                return {"error": "the actor reported no env steps"}
            if t_end is not None and now >= t_end:
                break
            got = sub.recv()
            if got is None:
                continue
            m = got[1].meta
            if m.get("role") == "actor" and isinstance(m.get("env_steps"), int):
                if first_steps_at is None and m["env_steps"] > 0:
                    first_steps_at = now
                    t_measure_start = now + WARMUP_S
                    t_end = t_measure_start + seconds
                if t_measure_start is not None and now >= t_measure_start:
                    if not actor:
                        sched0 = {n: schedstat(p.pid) for n, p in procs.items()}
                        wall0 = time.monotonic()
                    actor.append((float(m["time"]), m["env_steps"]))
                    blocked = max(blocked, float(m.get("blocked_s", 0.0)))
            elif m.get("role") == "replay" and isinstance(m.get("inserts"), int):
                if t_measure_start is not None and now >= t_measure_start:
                    replay.append((float(m["time"]), m["inserts"]))
        sched1 = {n: schedstat(p.pid) for n, p in procs.items()}
        wall = time.monotonic() - wall0
        final = registry_request(ctx, addr, P.Message(P.STATUS), timeout=2.0).meta
    finally:
        sub.close()
    if len(actor) < 2:
        return {"error": "too few actor metrics"}
    res: dict[str, Any] = {
        "steps": actor[-1][1] - actor[0][1],
        "elapsed": actor[-1][0] - actor[0][0],
        "blocked_s": blocked,
    }
    if len(replay) >= 2:
        res["inserts_per_s"] = (replay[-1][1] - replay[0][1]) / (replay[-1][0] - replay[0][0])
    res["sched"] = {
        n: ((sched1[n][0] - sched0[n][0]) / wall, (sched1[n][1] - sched0[n][1]) / wall)  # type: ignore[index]
        for n in procs
        if sched0.get(n) and sched1.get(n)
    }
    rows = {r["id"]: r for r in final.get("roles", [])}
    res["dropped"] = sum(r.get("dropped", 0) for r in rows.values())
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seconds",
        type=float,
        default=20.0,
        help="measured seconds of each of the two (bare, actor)",
    )
    parser.add_argument(
        "--num-envs",
        type=int,
        default=None,
        help="envs per actor (default: the config's env.num_envs)",
    )
    args = parser.parse_args()

    import gymnasium
    import numpy as np
    import torch

    import zrl

    tmp = Path(tempfile.mkdtemp(prefix="zrl-bench-actor-"))
    cfg_path = tmp / "config.yaml"
    cfg = write_config(cfg_path, args.num_envs)
    mpc = mp.get_context("spawn")
    cmds, out = mpc.Queue(), mpc.Queue()
    started: list[Any] = []
    half, quarter = args.seconds / 2, args.seconds / 4
    ref: dict[str, list[dict[str, Any]]] = {"bare": [], "collect": []}

    def reference(kind: str, duration: float) -> None:
        cmds.put((kind, duration))
        ref[kind].append(out.get(timeout=duration + 60))

    try:
        refs = mpc.Process(
            target=reference_loops, daemon=True, args=(cfg.model_dump(mode="json"), cmds, out)
        )
        started.append(refs)
        refs.start()
        env_name = out.get(timeout=START_TIMEOUT_S)["env"]
        reference("bare", half)
        reference("collect", quarter)
        zrl_res = measure_actor(started, cfg_path, args.seconds, tmp)
        for p in [p for p in started if p is not refs]:
            stop_process(p)  # actor, replay and broker first: the references run alone
        reference("collect", quarter)
        reference("bare", half)
        cmds.put(None)
    finally:
        for p in reversed(started):
            try:
                stop_process(p)
            except Exception:
                pass

    if "error" not in zrl_res:
        shutil.rmtree(tmp, ignore_errors=True)  # config and role logs: kept when something failed

    def summary(results: list[dict[str, Any]]) -> dict[str, float] | None:
        ok = [r for r in results if "error" not in r]
        if not ok:
            return None
        steps, elapsed = sum(r["steps"] for r in ok), sum(r["elapsed"] for r in ok)
        out = {"rate": steps / elapsed, "parts": [r["steps"] / r["elapsed"] for r in ok]}
        if all("on_cpu" in r for r in ok):
            out["on_cpu"] = sum(r["on_cpu"] for r in ok) / elapsed
            out["waiting"] = sum(r["waiting"] for r in ok) / elapsed
        return out

    bare, coll = summary(ref["bare"]), summary(ref["collect"])
    print(
        f"zrl {zrl.__version__} | torch {torch.__version__} | gymnasium {gymnasium.__version__} "
        f"| numpy {np.__version__} | python {sys.version.split()[0]} | {os.cpu_count()} cpus"
    )
    print()
    print(
        f"{cfg.env.id}: {env_name}, 1 torch thread; steps = valid env steps (autoreset steps "
        f"excluded), as the actor counts them; CPU shares are of the main thread"
    )
    w = 50
    print(f"{'':<{w}} {'steps/s':>9} {'on CPU':>7} {'wait CPU':>8} {'steps/CPU-s':>11}")

    def row(
        label: str, rate: float, on_cpu: float | None, waiting: float | None, note: str = ""
    ) -> None:
        cpu = f"{on_cpu:>7.0%} {waiting:>8.0%} {rate / on_cpu:>11,.0f}" if on_cpu else f"{'':>28}"
        print(f"{label:<{w}} {rate:>9,.0f} {cpu}  {note}")

    if bare is None:
        print("bare loop: error")
        return
    row(
        "bare loop (env + batched Q forward + eps-greedy)",
        bare["rate"],
        bare.get("on_cpu"),
        bare.get("waiting"),
        f"({bare['parts'][0]:,.0f} before, {bare['parts'][-1]:,.0f} after)",
    )
    if coll is not None:
        row(
            "Actor.collect() loop, no sockets (reference)",
            coll["rate"],
            coll.get("on_cpu"),
            coll.get("waiting"),
            f"({coll['rate'] / bare['rate']:.2f} of bare)",
        )
    else:
        errors = [r["error"] for r in ref["collect"] if "error" in r]
        print(
            f"{'Actor.collect() loop, no sockets (reference)':<{w}} {'n/a':>9}  "
            f"{errors[0] if errors else ''}"
        )
    ratio = cpu_ratio = float("nan")
    if "error" in zrl_res:
        print(f"{'zrl actor -> broker -> replay':<{w}} {'error':>9}  {zrl_res['error']}")
    else:
        rate = zrl_res["steps"] / zrl_res["elapsed"]
        ratio = rate / bare["rate"]
        on_cpu, waiting = zrl_res["sched"].get("actor", (None, None))
        row(
            "zrl actor -> broker -> replay",
            rate,
            on_cpu,
            waiting,
            f"({zrl_res['elapsed']:.1f} s after {WARMUP_S:g} s warm-up)",
        )
        if on_cpu and bare.get("on_cpu"):
            cpu_ratio = (rate / on_cpu) / (bare["rate"] / bare["on_cpu"])
        if "replay" in zrl_res["sched"]:
            r_cpu, r_wait = zrl_res["sched"]["replay"]
            print(f"{'  replay shard main thread':<{w}} {'':>9} {r_cpu:>7.0%} {r_wait:>8.0%}")
        ins = zrl_res.get("inserts_per_s")
        print(
            f"{'  replay inserts, transitions/s':<{w}} {'n/a' if ins is None else f'{ins:,.0f}':>9}"
        )
        print(
            f"{'  longest actor wait (ack window / full stream), s':<{w}} "
            f"{zrl_res['blocked_s']:>9.1f}"
        )
        print(f"{'  malformed messages dropped, all roles':<{w}} {zrl_res['dropped']:>9}")
    print()
    print(f"actor / bare: {ratio:.2f} wall clock, {cpu_ratio:.2f} per main-thread CPU second")
    print(
        f"target: actor keeps >= {TARGET:.0%} of the bare loop: "
        f"{'MET' if ratio >= TARGET else 'NOT MET'}"
    )


if __name__ == "__main__":
    main()
