"""Transport benchmark: what zrl's framing, validation and broker hop cost over bare ZeroMQ.

Over tcp loopback (``--transport ipc``: ipc://, what roles on the broker's host use), with
producer and consumer in separate processes, per message size:

  (a) bare pyzmq PUSH -> PULL (2 frames: 16-byte header + payload, copy=False), once
  (b) bare pyzmq PUSH -> zmq.proxy (PULL/PUSH device in its own process) -> PULL
  (c) zrl Messages (one uint8 array) sent by a Channel, decoded and validated by a Channel,
      through a real broker process (``Broker``, stream ``experience``)

(b) and (c) run ``--pairs`` times interleaved (b, c, b, c, ...), so a drift in the machine's
load hits both alike; the table gives the median msg/s and MB/s of each, and the median and
min-max of the per-pair ratios c/b, with a bootstrap 95% confidence interval of that median
(``--pairs`` 10 or more for an interval worth reading). Each cell also counts the CPU seconds
(user + system, all threads) that its producer, device and consumer processes spent in the
consumer's window: on a 2-core machine six busy threads (three processes and their I/O
threads) share two cores, so msg/s swings with the scheduler. Messages per CPU-second (what a
path costs) do not depend on who waited for a core, though kernel time still varies between
runs; the second table gives c/b of that, the third each process's share. Every socket of
(a), (b) and (c) uses the broker's stream settings (``broker.stream_hwm`` messages,
``broker.stream_buffer_bytes`` kernel buffers) so c/b isolates zrl's own cost. ``--hwm`` /
``--buffer`` sweep those two settings (a broker and a proxy per point) at ``--sweep-sizes``.
Then: a 10 MiB weights dict through the broker's topic bus to 4 subscriber processes, and the
cost of ``encode()`` + ``decode()`` against ``arr.copy()``. Run from the repo root::

    python benchmarks/transport.py                      # defaults: 5 s cells, 3 pairs
    python benchmarks/transport.py --seconds 2 --sizes 65536,1048576 --pairs 2
    python benchmarks/transport.py --sweep-only --hwm 2,4,8 --buffer 262144,1048576,4194304
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from zrl.transport.endpoints import free_port_range

TARGET_RATIO = 0.9
TARGET_MIN_SIZE = 65536
WEIGHTS_BYTES = 10 * 2**20
WEIGHTS_SUBSCRIBERS = 4
WEIGHTS_SENDS = 10
WEIGHTS_WARMUP_SENDS = 2
CODEC_SIZES = (4 * 2**10, 64 * 2**10, 2**20, 16 * 2**20, 64 * 2**20)
RESULT_TIMEOUT_S = 30.0


# --- socket options -------------------------------------------------------------------


def _opts(sock: zmq.Socket, hwm: int | None, kbuf: int | None) -> zmq.Socket:
    """The options the broker's stream devices set (None: libzmq / kernel default)."""
    sock.setsockopt(zmq.LINGER, 0)
    if hwm is not None:
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.RCVHWM, hwm)
    if kbuf is not None:
        sock.setsockopt(zmq.SNDBUF, kbuf)
        sock.setsockopt(zmq.RCVBUF, kbuf)
    return sock


# --- child processes (module level: started with the spawn method) -----------------------
# Producers and consumers run in two long-lived worker processes that take one command per
# measurement, so no measurement pays (or is disturbed by) a process start.

STOP_CHECK_EVERY = 64  # producers look at the stop flag every this many messages
SEND_TIMEOUT_MS = 100  # ... and whenever a send waited this long (a full queue)


def bare_producer(
    addr: str,
    bind: bool,
    size: int,
    hwm: int | None,
    kbuf: int | None,
    *,
    stop: Any,
    cell: int,
    window: Any,
) -> dict[str, Any]:
    ctx = zmq.Context()
    sock = _opts(ctx.socket(zmq.PUSH), hwm, kbuf)
    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    sock.bind(addr) if bind else sock.connect(addr)
    payload = np.ones(size, np.uint8)
    pack = struct.Struct("<QQ").pack
    i = 0
    try:
        while True:
            try:
                sock.send_multipart([pack(cell, i), payload], copy=False)
            except zmq.Again:
                if stop.is_set():
                    break
                continue
            i += 1
            if i % STOP_CHECK_EVERY == 0 and stop.is_set():
                break
    finally:
        sock.close(linger=0)
        ctx.term()
    return {"sent": i}


def bare_consumer(
    addr: str,
    bind: bool,
    size: int,
    hwm: int | None,
    kbuf: int | None,
    warmup: float,
    seconds: float,
    *,
    stop: Any,
    cell: int,
    window: Any,
) -> dict[str, Any]:
    ctx = zmq.Context()
    sock = _opts(ctx.socket(zmq.PULL), hwm, kbuf)
    sock.setsockopt(zmq.RCVTIMEO, int(RESULT_TIMEOUT_S * 1000))
    sock.bind(addr) if bind else sock.connect(addr)
    try:
        # A device reused across measurements may still hold messages of an earlier one:
        # the header's first 8 bytes name the measurement; only this one's are counted.
        tag = struct.pack("<Q", cell)
        while sock.recv_multipart(copy=False)[0].bytes[:8] != tag:
            pass
        clock = time.perf_counter
        end_warmup = clock() + warmup
        while clock() < end_warmup:
            sock.recv_multipart(copy=False)
        n = nbytes = 0
        t0 = clock()
        window.set()
        end = t0 + seconds
        while True:
            frames = sock.recv_multipart(copy=False)
            if frames[0].bytes[:8] == tag:
                n += 1
                nbytes += len(frames[1])
            t = clock()
            if t >= end:
                break
        return {"n": n, "bytes": nbytes, "elapsed": t - t0}
    except zmq.Again:
        return {"error": f"no message for {RESULT_TIMEOUT_S:.0f}s"}
    finally:
        sock.close(linger=0)
        ctx.term()


def proxy_device(in_addr: str, out_addr: str, hwm: int | None, kbuf: int | None) -> None:
    """(b)'s device: PULL/PUSH with the broker's stream-device options, zmq.proxy in C."""
    ctx = zmq.Context()
    front = _opts(ctx.socket(zmq.PULL), hwm, kbuf)
    back = _opts(ctx.socket(zmq.PUSH), hwm, kbuf)
    front.bind(in_addr)
    back.bind(out_addr)
    zmq.proxy(front, back)


def zrl_producer(
    addr: str, size: int, hwm: int, kbuf: int, *, stop: Any, cell: int, window: Any
) -> dict[str, Any]:
    from zrl.transport.protocol import TRAJECTORY, Message
    from zrl.transport.sockets import Channel, TransportStats, make_socket

    ctx = zmq.Context()
    # As Role.open_push: PUSH, HWM and kernel buffers of the broker's streams.
    sock = make_socket(
        ctx, zmq.PUSH, sndhwm=hwm, rcvhwm=hwm, kernel_buffer_bytes=kbuf, sndtimeo_ms=SEND_TIMEOUT_MS
    )
    sock.connect(addr)
    ch = Channel(sock, "experience", f"bench-producer-{cell}", TransportStats())
    payload = np.ones(size, np.uint8)
    i = 0
    try:
        while True:
            if not ch.send(Message(TRAJECTORY, arrays={"data": payload})):
                if stop.is_set():
                    break
                continue
            i += 1
            if i % STOP_CHECK_EVERY == 0 and stop.is_set():
                break
    finally:
        ch.close()
        ctx.term()
    return {"sent": i}


def zrl_consumer(
    addr: str,
    size: int,
    hwm: int,
    kbuf: int,
    warmup: float,
    seconds: float,
    *,
    stop: Any,
    cell: int,
    window: Any,
) -> dict[str, Any]:
    from zrl.transport.sockets import Channel, TransportStats, make_socket

    ctx = zmq.Context()
    # As Role.open_pull: PULL, HWM and kernel buffers of the broker's streams.
    sock = make_socket(
        ctx,
        zmq.PULL,
        sndhwm=hwm,
        rcvhwm=hwm,
        kernel_buffer_bytes=kbuf,
        rcvtimeo_ms=int(RESULT_TIMEOUT_S * 1000),
    )
    sock.connect(addr)
    ch = Channel(sock, "experience", "bench-consumer", TransportStats())

    def recv() -> Any:
        """The next valid message, skipping (and counting) malformed ones; None on timeout."""
        while True:
            dropped = ch.stats.dropped
            got = ch.recv()
            if got is not None or ch.stats.dropped == dropped:
                return got

    try:
        # The broker, reused across measurements, may still hold messages of an earlier one:
        # only this measurement's producer is counted.
        sender = f"bench-producer-{cell}"
        while True:
            got = recv()
            if got is None:
                return {"error": f"no valid message for {RESULT_TIMEOUT_S:.0f}s"}
            if got[1].sender == sender:
                break
        clock = time.perf_counter
        end_warmup = clock() + warmup
        while clock() < end_warmup:
            recv()
        stats0 = ch.stats.snapshot()
        n = nbytes = 0
        t0 = clock()
        window.set()
        end = t0 + seconds
        while True:
            got = recv()  # decode() validates every frame
            if got is None:
                return {"error": f"no valid message for {RESULT_TIMEOUT_S:.0f}s"}
            if got[1].sender == sender:
                n += 1
                nbytes += got[1].nbytes
            t = clock()
            if t >= end:
                break
        stats = ch.stats.snapshot()
        return {
            "n": n,
            "bytes": nbytes,
            "elapsed": t - t0,
            "dropped": stats["dropped"] - stats0["dropped"],
            "gaps": stats["gaps"] - stats0["gaps"],
        }
    finally:
        ch.close()
        ctx.term()


JOBS: dict[str, Callable[..., dict[str, Any]]] = {
    "bare_producer": bare_producer,
    "bare_consumer": bare_consumer,
    "zrl_producer": zrl_producer,
    "zrl_consumer": zrl_consumer,
}


def worker(cmds: Any, results: Any, stop: Any, window: Any) -> None:
    """Run jobs from ``cmds`` one after another until None arrives. A consumer sets
    ``window`` when its measured window opens."""
    while True:
        cmd = cmds.get()
        if cmd is None:
            return
        name, args, cell = cmd
        try:
            res = JOBS[name](*args, stop=stop, cell=cell, window=window)
        except Exception as exc:  # report, keep serving
            res = {"error": f"{type(exc).__name__}: {exc}"}
        results.put(res)


def weights_subscriber(endpoints: dict[str, str], index: int, out: Any) -> None:
    from zrl.transport.endpoints import connect_topics
    from zrl.transport.sockets import Channel, TransportStats, make_socket

    ctx = zmq.Context()
    # As Role.open_subscriber: SUB, receive HWM 1000, topic "weights", both lanes of the bus.
    sock = make_socket(ctx, zmq.SUB, rcvhwm=1000, rcvtimeo_ms=100)
    sock.setsockopt(zmq.SUBSCRIBE, b"weights")
    connect_topics(sock, endpoints)
    ch = Channel(sock, "weights", f"bench-sub-{index}", TransportStats(), topics=True)
    out.put(("up", index, 0, 0.0))
    while True:  # until the parent terminates us
        got = ch.recv()
        if got is None:
            continue
        t = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on this host
        out.put(("got", index, got[1].meta.get("id", -1), t))


# --- process management --------------------------------------------------------------


class Procs:
    """Every process this benchmark starts, stopped by PID."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def add(self, p: Any) -> Any:
        self.items.append(p)
        return p

    def stop(self, p: Any, timeout: float = 3.0) -> None:
        if isinstance(p, subprocess.Popen):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout)
        elif p.pid is not None:
            if p.is_alive():
                p.terminate()
                p.join(timeout)
                if p.is_alive():
                    p.kill()
                    p.join(timeout)
        if p in self.items:
            self.items.remove(p)

    def stop_all(self) -> None:
        for p in list(reversed(self.items)):
            try:
                self.stop(p)
            except Exception:  # keep stopping the others
                pass


BROKER_SCRIPT = """
import sys
from zrl.broker import Broker
from zrl.config.experiment import ExperimentConfig
from zrl.utils.runtime import install_stop_signals, setup_logging

setup_logging("WARNING")
cfg = ExperimentConfig()
cfg.broker.stream_hwm, cfg.broker.stream_buffer_bytes = int(sys.argv[2]), int(sys.argv[3])
cfg.broker.ipc = sys.argv[4] == "ipc"
broker = Broker(sys.argv[1], cfg)
install_stop_signals(broker.stop)
broker.run()
"""


def start_broker(
    procs: Procs, log_dir: str, hwm: int, kbuf: int, transport: str
) -> tuple[subprocess.Popen, dict[str, str]]:
    """A broker process with these stream settings; its endpoints over ``transport``."""
    from zrl.config.sections import DEFAULT_STREAMS
    from zrl.roles.registry_client import registry_request
    from zrl.transport import protocol as P
    from zrl.transport.endpoints import broker_endpoints, ipc_broker_endpoints

    base = free_port_range(3 + 2 * len(DEFAULT_STREAMS))
    addr = f"tcp://127.0.0.1:{base}"
    log = open(os.path.join(log_dir, f"broker-{base}.log"), "wb")  # noqa: SIM115
    proc = procs.add(
        subprocess.Popen(
            [sys.executable, "-c", BROKER_SCRIPT, addr, str(hwm), str(kbuf), transport],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    )
    ctx = zmq.Context.instance()
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}; see {log.name}")
        try:
            welcome = registry_request(ctx, addr, P.Message(P.STATUS), timeout=0.5)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise RuntimeError("broker did not answer within 30 s") from None
    if transport == "ipc":
        if not welcome.meta["broker"].get("ipc"):
            raise RuntimeError("the broker serves no ipc endpoints")
        eps = ipc_broker_endpoints(addr, list(DEFAULT_STREAMS))
        assert eps is not None
        return proc, eps
    return proc, broker_endpoints(addr, list(DEFAULT_STREAMS))


class Worker:
    """A long-lived process running measurement jobs (see :func:`worker`)."""

    def __init__(self, procs: Procs, mpc: Any, stop: Any, window: Any) -> None:
        self.cmds, self.results = mpc.Queue(), mpc.Queue()
        self.proc = procs.add(
            mpc.Process(target=worker, args=(self.cmds, self.results, stop, window), daemon=True)
        )
        self.proc.start()

    def submit(self, name: str, args: tuple, cell: int) -> None:
        self.cmds.put((name, args, cell))

    def result(self) -> dict[str, Any]:
        try:
            return self.results.get(timeout=RESULT_TIMEOUT_S + 30)
        except queue.Empty:
            return {"error": "no result"}


_cell = 0


def cpu_seconds(pids: list[int]) -> list[float]:
    """User + system CPU seconds of each of these processes so far, every thread included."""
    out = []
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            # After the ")" that closes the command name: utime and stime are fields 12, 13.
            fields = f.read().rsplit(")", 1)[1].split()
        out.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def run_cell(
    producer: Worker,
    consumer: Worker,
    stop: Any,
    window: Any,
    device_pid: int | None,
    prod_job: tuple[str, tuple],
    cons_job: tuple[str, tuple],
) -> dict[str, Any]:
    """One measurement: start both jobs, take the consumer's figures and the CPU seconds
    the path's processes spent in its window, stop the producer."""
    global _cell
    _cell += 1
    stop.clear()
    window.clear()
    pids = [p for p in (producer.proc.pid, device_pid, consumer.proc.pid) if p is not None]
    consumer.submit(*cons_job, cell=_cell)
    producer.submit(*prod_job, cell=_cell)
    cpu0 = cpu_seconds(pids) if window.wait(RESULT_TIMEOUT_S + 30) else None
    res = consumer.result()
    if cpu0 is not None and "error" not in res:
        # producer, device (if any), consumer
        res["cpu_parts"] = [b - a for a, b in zip(cpu0, cpu_seconds(pids), strict=True)]
        res["cpu"] = sum(res["cpu_parts"])
    stop.set()
    prod = producer.result()
    if "error" in prod and "error" not in res:
        res = prod
    return res


# --- measurements -------------------------------------------------------------------


def bare_addresses(transport: str, log_dir: str, n: int) -> list[str]:
    if transport == "ipc":
        return [f"ipc://{log_dir}/bare-{free_port_range(1)}-{i}" for i in range(n)]
    base = free_port_range(n)
    return [f"tcp://127.0.0.1:{base + i}" for i in range(n)]


def throughput(
    procs: Procs,
    mpc: Any,
    args: argparse.Namespace,
    hwm: int,
    kbuf: int,
    broker_pid: int,
    endpoints: dict[str, str],
    log_dir: str,
    sizes: list[int],
    pairs: int,
    seconds: float,
    direct: bool = True,
) -> list[dict[str, Any]]:
    """Per size: (a) once (if ``direct``), then ``pairs`` x (b, c) interleaved, so a drift
    in the machine's load hits both alike and each c has a b measured next to it."""
    warmup = min(1.0, max(0.3, 0.25 * seconds))
    stop, window = mpc.Event(), mpc.Event()
    producer, consumer = Worker(procs, mpc, stop, window), Worker(procs, mpc, stop, window)
    # (b)'s device, and the deep-queue one, live for the whole sweep point like the broker.
    proxies, started = {}, []
    for name, h, k in [("b", hwm, kbuf)] + ([("b_deep", None, None)] if args.deep else []):
        ins, outs = bare_addresses(args.transport, log_dir, 2)
        p = procs.add(mpc.Process(target=proxy_device, args=(ins, outs, h, k), daemon=True))
        p.start()
        started.append(p)
        proxies[name] = (ins, outs, p.pid)
    rows = []
    try:
        for size in sizes:
            row: dict[str, Any] = {"size": size}
            order = (["a"] if direct else []) + ["b", "c"] * pairs
            if args.deep:
                order += ["a_deep", "b_deep"]
            for name in order:
                h, k = (None, None) if name.endswith("_deep") else (hwm, kbuf)
                if name.startswith("a"):
                    (port,) = bare_addresses(args.transport, log_dir, 1)
                    res = run_cell(
                        producer,
                        consumer,
                        stop,
                        window,
                        None,
                        ("bare_producer", (port, False, size, h, k)),
                        ("bare_consumer", (port, True, size, h, k, warmup, seconds)),
                    )
                elif name.startswith("b"):
                    ins, outs, proxy_pid = proxies[name]
                    res = run_cell(
                        producer,
                        consumer,
                        stop,
                        window,
                        proxy_pid,
                        ("bare_producer", (ins, False, size, h, k)),
                        ("bare_consumer", (outs, False, size, h, k, warmup, seconds)),
                    )
                else:
                    res = run_cell(
                        producer,
                        consumer,
                        stop,
                        window,
                        broker_pid,
                        ("zrl_producer", (endpoints["experience_in"], size, hwm, kbuf)),
                        (
                            "zrl_consumer",
                            (endpoints["experience_out"], size, hwm, kbuf, warmup, seconds),
                        ),
                    )
                row.setdefault(name, []).append(res)
            rows.append(row)
    finally:
        for w in (producer, consumer):
            w.cmds.put(None)
            procs.stop(w.proc)
        for p in started:
            procs.stop(p)
    return rows


def weights_broadcast(procs: Procs, mpc: Any, endpoints: dict[str, str]) -> dict[str, Any]:
    from zrl.transport.protocol import WEIGHTS, Message
    from zrl.transport.sockets import Channel, TransportStats, make_socket

    out = mpc.Queue()
    subs = [
        procs.add(mpc.Process(target=weights_subscriber, args=(endpoints, i, out), daemon=True))
        for i in range(WEIGHTS_SUBSCRIBERS)
    ]
    ctx = zmq.Context.instance()
    # As the parameter server: PUB with send HWM 100 into the broker's XSUB.
    sock = make_socket(ctx, zmq.PUB, sndhwm=100)
    sock.connect(endpoints["topics_in"])
    pub = Channel(sock, "weights", "bench-params", TransportStats(), topics=True)
    n_arrays = 10
    per = WEIGHTS_BYTES // n_arrays // 4
    weights = {f"layer{i}.weight": np.full(per, i, np.float32) for i in range(n_arrays)}
    assert sum(a.nbytes for a in weights.values()) == WEIGHTS_BYTES
    try:
        for p in subs:
            p.start()
        # Late joiners get nothing from PUB/SUB: ping until every subscription is in place.
        seen: set[int] = set()
        deadline = time.monotonic() + 30
        while len(seen) < WEIGHTS_SUBSCRIBERS:
            if time.monotonic() > deadline:
                return {"error": "subscribers did not join"}
            pub.send(
                Message(WEIGHTS, meta={"id": -1}, arrays={"ping": np.zeros(1, np.float32)}),
                topic="weights",
                block=False,
            )
            t_end = time.monotonic() + 0.05
            while (left := t_end - time.monotonic()) > 0:
                try:
                    kind, idx, mid, _ = out.get(timeout=left)
                except queue.Empty:
                    break
                if kind == "got" and mid == -1:
                    seen.add(idx)
        time.sleep(0.2)
        while True:  # drain the pings
            try:
                out.get(timeout=0.1)
            except queue.Empty:
                break
        latencies: list[list[float]] = []  # per send: one latency per subscriber
        for i in range(WEIGHTS_WARMUP_SENDS + WEIGHTS_SENDS):
            t_send = time.monotonic()
            pub.send(
                Message(WEIGHTS, meta={"id": i, "version": i + 1}, arrays=weights), topic="weights"
            )
            arrivals: dict[int, float] = {}
            t_limit = t_send + 10
            while len(arrivals) < WEIGHTS_SUBSCRIBERS and time.monotonic() < t_limit:
                try:
                    kind, idx, mid, t = out.get(timeout=max(t_limit - time.monotonic(), 0.01))
                except queue.Empty:
                    break
                if kind == "got" and mid == i:
                    arrivals[idx] = t - t_send
            if len(arrivals) < WEIGHTS_SUBSCRIBERS:
                return {"error": f"send {i}: only {len(arrivals)} subscribers got it"}
            if i >= WEIGHTS_WARMUP_SENDS:
                latencies.append([arrivals[j] for j in range(WEIGHTS_SUBSCRIBERS)])
            time.sleep(0.05)
        return {"latencies": np.array(latencies)}
    finally:
        pub.close()
        for p in subs:
            procs.stop(p)


def codec_costs() -> list[tuple[int, float, float, bool]]:
    from zrl.transport.protocol import TRAJECTORY, Message, decode, encode

    def per_call(fn: Callable[[], Any], budget: float = 0.25, min_reps: int = 5) -> float:
        fn()
        times = []
        t_stop = time.perf_counter() + budget
        while len(times) < min_reps or time.perf_counter() < t_stop:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            if len(times) >= 20_000:
                break
        return float(np.median(times))

    rows = []
    for size in CODEC_SIZES:
        arr = np.ones(size, np.uint8)
        msg = Message(TRAJECTORY, arrays={"data": arr})
        decoded = decode(encode(msg))
        shares = bool(np.shares_memory(decoded.arrays["data"], arr))
        del decoded
        codec = per_call(lambda: decode(encode(msg)))  # noqa: B023
        copy = per_call(arr.copy)
        rows.append((size, codec, copy, shares))
    return rows


# --- statistics and output -------------------------------------------------------------


def human(n: int) -> str:
    for unit, div in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def rates(results: list[dict[str, Any]], per_cpu: bool = False) -> list[tuple[float, float] | None]:
    """Per measurement: msg/s and MB/s (10^6 payload bytes) of wall time, or per CPU-second
    of the path's processes (``per_cpu``); None if it failed."""
    out: list[tuple[float, float] | None] = []
    for r in results:
        took = r.get("cpu") if per_cpu else r.get("elapsed")
        if "error" in r or not took:
            out.append(None)
        else:
            out.append((r["n"] / took, r["bytes"] / took / 1e6))
    return out


def median_rate(results: list[dict[str, Any]], per_cpu: bool = False) -> tuple[float, float] | None:
    ok = [r for r in rates(results, per_cpu) if r is not None]
    if not ok:
        return None
    return float(np.median([r[0] for r in ok])), float(np.median([r[1] for r in ok]))


def pair_ratios(row: dict[str, Any], per_cpu: bool = False) -> list[float]:
    """c_i / b_i for each interleaved pair where both measurements succeeded."""
    b_rates, c_rates = rates(row.get("b", []), per_cpu), rates(row.get("c", []), per_cpu)
    return [
        c[0] / b[0]
        for b, c in zip(b_rates, c_rates, strict=False)
        if b is not None and c is not None and b[0] > 0
    ]


def ratio_summary(row: dict[str, Any], per_cpu: bool = False) -> tuple[float, float, float]:
    """Median, min and max of the per-pair ratios (nan if none)."""
    r = pair_ratios(row, per_cpu)
    if not r:
        return float("nan"), float("nan"), float("nan")
    return float(np.median(r)), min(r), max(r)


def cell(results: list[dict[str, Any]], per_cpu: bool = False) -> str:
    r = median_rate(results, per_cpu)
    return f"{'error':>22}" if r is None else f"{r[0]:>11,.0f} {r[1]:>10,.1f}"


def median_ci(values: list[float], level: float = 0.95, draws: int = 2000) -> tuple[float, float]:
    """A bootstrap confidence interval of the median (nan with fewer than 3 values)."""
    if len(values) < 3:
        return float("nan"), float("nan")
    rng = np.random.default_rng(0)
    v = np.asarray(values)
    medians = np.median(rng.choice(v, size=(draws, len(v)), replace=True), axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


def target_met(rows: list[dict[str, Any]], per_cpu: bool = False) -> bool:
    """Median pair ratio >= TARGET_RATIO at every size from TARGET_MIN_SIZE up."""
    checked = [r for r in rows if r["size"] >= TARGET_MIN_SIZE]
    return bool(checked) and all(ratio_summary(r, per_cpu)[0] >= TARGET_RATIO for r in checked)


def print_table(rows: list[dict[str, Any]], direct: bool, per_cpu: bool = False) -> None:
    unit = "/cpu-s" if per_cpu else "/s"
    head = (
        f"{'size':>8} | "
        + (f"{'(a) direct':^22} | " if direct else "")
        + f"{'(b) zmq.proxy':^22} | {'(c) zrl broker':^22} | {'c/b med':>7} | "
        f"{'95% CI':>11} | {'c/b min-max':>11} | target"
    )
    sub = (
        f"{'':>8} | "
        + " | ".join(f"{'msg' + unit:>11} {'MB' + unit:>10}" for _ in range(2 + direct))
        + " |"
    )
    print(head)
    print(sub)
    print("-" * len(head))
    for row in rows:
        med, lo, hi = ratio_summary(row, per_cpu)
        ci_lo, ci_hi = median_ci(pair_ratios(row, per_cpu))
        mark = ""
        if row["size"] >= TARGET_MIN_SIZE:
            mark = "met" if med >= TARGET_RATIO else "NOT met"
        a = f"{cell(row['a'], per_cpu)} | " if direct else ""
        print(
            f"{human(row['size']):>8} | {a}{cell(row['b'], per_cpu)} | "
            f"{cell(row['c'], per_cpu)} | {med:7.2f} | {ci_lo:5.2f}-{ci_hi:5.2f} | "
            f"{lo:5.2f}-{hi:5.2f} | {mark}"
        )
    if per_cpu:
        return  # the errors and drops are listed under the wall-time table
    for row in rows:
        for name in ("a", "b", "c", "a_deep", "b_deep"):
            for res in row.get(name, []):
                if "error" in res:
                    print(f"  ({name}) {human(row['size'])}: {res['error']}")
                elif res.get("dropped") or res.get("gaps"):
                    print(
                        f"  ({name}) {human(row['size'])}: {res['dropped']} dropped, "
                        f"{res['gaps']} sequence gaps"
                    )


def print_cpu_parts(rows: list[dict[str, Any]]) -> None:
    """Where (b)'s and (c)'s CPU goes: median µs per message in each process."""
    print()
    print("CPU µs per message (median over the pairs): producer / device / consumer")
    print(f"{'size':>8} | {'(b) zmq.proxy':^26} | {'(c) zrl broker':^26}")
    for row in rows:
        cols = []
        for name in ("b", "c"):
            parts = [
                [x / r["n"] * 1e6 for x in r["cpu_parts"]]
                for r in row.get(name, [])
                if r.get("cpu_parts") and r.get("n")
            ]
            if parts:
                med = np.median(np.array(parts), axis=0)
                cols.append(" / ".join(f"{x:,.0f}" for x in med))
            else:
                cols.append("-")
        print(f"{human(row['size']):>8} | {cols[0]:^26} | {cols[1]:^26}")


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def sweep(
    procs: Procs, mpc: Any, args: argparse.Namespace, log_dir: str
) -> list[tuple[int, int, list[dict[str, Any]]]]:
    """Every (broker.stream_hwm, broker.stream_buffer_bytes) pair at the sweep sizes."""
    out = []
    for hwm in args.hwm:
        for kbuf in args.buffer:
            broker, endpoints = start_broker(procs, log_dir, hwm, kbuf, args.transport)
            try:
                rows = throughput(
                    procs,
                    mpc,
                    args,
                    hwm,
                    kbuf,
                    broker.pid,
                    endpoints,
                    log_dir,
                    args.sweep_sizes,
                    args.sweep_pairs,
                    args.sweep_seconds,
                    direct=False,
                )
            finally:
                procs.stop(broker)
            out.append((hwm, kbuf, rows))
            line = " ".join(
                f"{human(r['size'])}: c/b {ratio_summary(r)[0]:.2f} "
                f"c {(median_rate(r['c']) or (0.0, 0.0))[1]:,.0f} MB/s"
                for r in rows
            )
            print(f"  swept hwm {hwm} buffer {kbuf // 1024} KiB: {line}", flush=True)
    return out


def print_sweep(
    points: list[tuple[int, int, list[dict[str, Any]]]], args: argparse.Namespace
) -> None:
    print()
    print(
        f"Sweep of broker.stream_hwm x broker.stream_buffer_bytes ({args.transport}), "
        f"{args.sweep_seconds:g} s cells, {args.sweep_pairs} interleaved pairs per size; "
        "per size: c/b median [min-max], zrl MB/s median / bare MB/s median"
    )
    sizes = args.sweep_sizes
    print(
        f"{'hwm':>4} {'buffer':>8} | "
        + " | ".join(f"{human(s):^30}" for s in sizes)
        + f" | {'mean c/b':>8} | {'mean zrl MB/s':>13}"
    )
    scored = []
    for hwm, kbuf, rows in points:
        cells, ratios, mbs = [], [], []
        for r in rows:
            med, lo, hi = ratio_summary(r)
            c = median_rate(r["c"]) or (float("nan"), float("nan"))
            b = median_rate(r["b"]) or (float("nan"), float("nan"))
            cells.append(f"{med:4.2f} [{lo:4.2f}-{hi:4.2f}] {c[1]:6,.0f}/{b[1]:6,.0f}")
            ratios.append(med)
            mbs.append(c[1])
        mr, mm = float(np.mean(ratios)), float(np.mean(mbs))
        scored.append((hwm, kbuf, mr, mm))
        print(
            f"{hwm:>4} {human(kbuf):>8} | "
            + " | ".join(f"{c:^30}" for c in cells)
            + f" | {mr:8.2f} | {mm:13,.0f}"
        )
    ok = [s for s in scored if not np.isnan(s[2])]
    if ok:
        br = max(ok, key=lambda s: s[2])
        bt = max(ok, key=lambda s: s[3])
        print(
            f"best zrl/bare ratio: hwm {br[0]}, buffer {human(br[1])} ({br[2]:.2f}); "
            f"best zrl throughput: hwm {bt[0]}, buffer {human(bt[1])} ({bt[3]:,.0f} MB/s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement cell")
    parser.add_argument(
        "--sizes",
        default="64,65536,262144,1048576,4194304",
        help="message sizes in bytes, comma separated",
    )
    parser.add_argument(
        "--pairs", type=int, default=3, help="interleaved (bare proxy, zrl broker) pairs per size"
    )
    parser.add_argument(
        "--transport",
        choices=("tcp", "ipc"),
        default="tcp",
        help="tcp loopback, or ipc:// (the broker's ipc endpoints, which roles "
        "on its host use, against a bare proxy on ipc)",
    )
    parser.add_argument(
        "--hwm",
        type=int_list,
        default=None,
        help="sweep broker.stream_hwm over these values (e.g. 2,4,8)",
    )
    parser.add_argument(
        "--buffer",
        type=int_list,
        default=None,
        help="sweep broker.stream_buffer_bytes over these values (e.g. 262144,1048576,4194304)",
    )
    parser.add_argument(
        "--sweep-sizes",
        type=int_list,
        default=[2**20, 4 * 2**20],
        help="message sizes of the sweep",
    )
    parser.add_argument("--sweep-seconds", type=float, default=2.0, help="per sweep cell")
    parser.add_argument("--sweep-pairs", type=int, default=2, help="pairs per sweep size")
    parser.add_argument(
        "--sweep-only",
        action="store_true",
        help="run the sweep only (no main table, broadcast or codec)",
    )
    parser.add_argument(
        "--skip-extras", action="store_true", help="skip the weights broadcast and the codec costs"
    )
    parser.add_argument(
        "--deep",
        action="store_true",
        help="also (a) and (b) with libzmq's default HWM (1000) and kernel-autotuned buffers",
    )
    args = parser.parse_args()
    args.sizes = int_list(args.sizes)

    import zrl
    from zrl.config.sections import BrokerConfig

    bc = BrokerConfig()
    hwm, kbuf = bc.stream_hwm, bc.stream_buffer_bytes
    args.hwm = args.hwm or ([hwm] if args.buffer else None)
    args.buffer = args.buffer or ([kbuf] if args.hwm else None)
    print(
        f"zrl {zrl.__version__} | pyzmq {zmq.__version__} | libzmq {zmq.zmq_version()} | "
        f"numpy {np.__version__} | python {sys.version.split()[0]} | {os.cpu_count()} cpus | "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    mpc = mp.get_context("spawn")
    procs = Procs()
    log_dir = tempfile.mkdtemp(prefix="zrl-bt-")  # short: ipc paths live here too
    rows: list[dict[str, Any]] = []
    points: list[tuple[int, int, list[dict[str, Any]]]] = []
    wb: dict[str, Any] = {}
    try:
        if args.hwm:
            points = sweep(procs, mpc, args, log_dir)
        if not args.sweep_only:
            broker, endpoints = start_broker(procs, log_dir, hwm, kbuf, args.transport)
            rows = throughput(
                procs,
                mpc,
                args,
                hwm,
                kbuf,
                broker.pid,
                endpoints,
                log_dir,
                args.sizes,
                args.pairs,
                args.seconds,
            )
            if not args.skip_extras:
                wb = weights_broadcast(procs, mpc, endpoints)
    finally:
        procs.stop_all()
    shutil.rmtree(log_dir, ignore_errors=True)  # kept only when the broker failed (raised above)

    if points:
        print_sweep(points, args)
    if args.sweep_only:
        return

    print()
    print(
        f"Throughput over {args.transport}, {args.seconds:g} s per cell after warm-up; every "
        f"socket HWM {hwm} msgs, SO_SNDBUF/SO_RCVBUF {human(kbuf)} (broker.stream_hwm, "
        f"broker.stream_buffer_bytes); (a) once, then {args.pairs} interleaved (b, c) pairs: "
        "medians, and c/b per pair"
    )
    print_table(rows, direct=True)
    print()
    print(
        "The same cells per CPU-second: messages over the user + system seconds of the "
        "producer, device (proxy or broker) and consumer processes in the window"
    )
    print_table(rows, direct=True, per_cpu=True)
    print_cpu_parts(rows)
    if args.deep:
        print()
        print("Deep queues: libzmq default HWM (1000 msgs), kernel-autotuned buffers")
        print(f"{'size':>8} | {'(a) direct':^22} | {'(b) zmq.proxy':^22}")
        for row in rows:
            print(f"{human(row['size']):>8} | {cell(row['a_deep'])} | {cell(row['b_deep'])}")

    if not args.skip_extras:
        print()
        print(
            f"Weights broadcast: {human(WEIGHTS_BYTES)} (10 float32 arrays) PUB -> broker "
            f"XSUB/XPUB -> {WEIGHTS_SUBSCRIBERS} SUB processes, send to decoded; "
            f"{WEIGHTS_SENDS} sends after {WEIGHTS_WARMUP_SENDS} warm-up"
        )
        if "error" in wb:
            print(f"  error: {wb['error']}")
        else:
            lat = wb["latencies"] * 1e3  # [sends, subscribers] ms
            print(f"{'subscriber':>12} | {'median ms':>9} | {'max ms':>7}")
            for j in range(WEIGHTS_SUBSCRIBERS):
                print(f"{j:>12} | {np.median(lat[:, j]):9.1f} | {lat[:, j].max():7.1f}")
            last = lat.max(axis=1)  # per send: when the slowest subscriber had it
            print(f"{'all 4 (max)':>12} | {np.median(last):9.1f} | {last.max():7.1f}")

        codec = codec_costs()
        print()
        print(
            "encode() + decode() of a message with one uint8 array vs arr.copy() (median per call)"
        )
        print(f"{'array':>8} | {'encode+decode µs':>16} | {'arr.copy() µs':>13} | shares memory")
        for size, c, cp, shares in codec:
            print(
                f"{human(size):>8} | {c * 1e6:16.1f} | {cp * 1e6:13.1f} | "
                f"{'yes' if shares else 'NO'}"
            )

    print()
    print(
        f"target: median c/b >= {TARGET_RATIO} at every size >= {human(TARGET_MIN_SIZE)}: "
        f"wall time {'MET' if target_met(rows) else 'NOT MET'}, per CPU-second "
        f"{'MET' if target_met(rows, per_cpu=True) else 'NOT MET'}  (load average now "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())})"
    )


if __name__ == "__main__":
    main()
