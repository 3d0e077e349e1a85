"""Transport benchmark: what zrl's framing, validation and broker hop cost over bare ZeroMQ.

Over tcp loopback, with producer and consumer in separate processes, per message size:

  (a) bare pyzmq PUSH -> PULL (2 frames: 16-byte header + payload, copy=False)
  (b) bare pyzmq PUSH -> zmq.proxy (PULL/PUSH device in its own process) -> PULL
  (c) zrl Messages (one uint8 array) sent by a Channel, decoded and validated by a Channel,
      through a real broker process (``python -m zrl start broker``, stream ``experience``)

Every socket of (a), (b) and (c) uses the broker's stream settings (``broker.stream_hwm``
messages, ``broker.stream_buffer_bytes`` kernel buffers) so c/b isolates zrl's own cost. Then:
a 10 MiB weights dict through the broker's topic bus to 4 subscriber processes, and the cost of
``encode()`` + ``decode()`` against ``arr.copy()``. Run from the repo root::

    python benchmarks/transport.py --seconds 2 --sizes 64,4096,65536,1048576
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

from zrl.transport.sockets import free_port_range

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
    addr: str, bind: bool, size: int, hwm: int | None, kbuf: int | None, *, stop: Any, cell: int
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
    addr: str, bind: bool, size: int, hwm: int | None, kbuf: int | None,
    warmup: float, seconds: float, *, stop: Any, cell: int,
) -> dict[str, Any]:  # fmt: skip
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
    addr: str, size: int, hwm: int, kbuf: int, *, stop: Any, cell: int
) -> dict[str, Any]:
    from zrl.transport.protocol import TRAJECTORY, Message
    from zrl.transport.sockets import Channel, TransportStats, make_socket

    ctx = zmq.Context()
    # As Role.open_push: PUSH, HWM and kernel buffers of the broker's streams.
    sock = make_socket(ctx, zmq.PUSH, sndhwm=hwm, rcvhwm=hwm, kernel_buffer_bytes=kbuf,
                       sndtimeo_ms=SEND_TIMEOUT_MS)  # fmt: skip
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
    addr: str, size: int, hwm: int, kbuf: int, warmup: float, seconds: float, *,
    stop: Any, cell: int,
) -> dict[str, Any]:  # fmt: skip
    from zrl.transport.sockets import Channel, TransportStats, make_socket

    ctx = zmq.Context()
    # As Role.open_pull: PULL, HWM and kernel buffers of the broker's streams.
    sock = make_socket(ctx, zmq.PULL, sndhwm=hwm, rcvhwm=hwm, kernel_buffer_bytes=kbuf,
                       rcvtimeo_ms=int(RESULT_TIMEOUT_S * 1000))  # fmt: skip
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
            "n": n, "bytes": nbytes, "elapsed": t - t0,
            "dropped": stats["dropped"] - stats0["dropped"],
            "gaps": stats["gaps"] - stats0["gaps"],
        }  # fmt: skip
    finally:
        ch.close()
        ctx.term()


JOBS: dict[str, Callable[..., dict[str, Any]]] = {
    "bare_producer": bare_producer,
    "bare_consumer": bare_consumer,
    "zrl_producer": zrl_producer,
    "zrl_consumer": zrl_consumer,
}


def worker(cmds: Any, results: Any, stop: Any) -> None:
    """Run jobs from ``cmds`` one after another until None arrives."""
    while True:
        cmd = cmds.get()
        if cmd is None:
            return
        name, args, cell = cmd
        try:
            res = JOBS[name](*args, stop=stop, cell=cell)
        except Exception as exc:  # report, keep serving
            res = {"error": f"{type(exc).__name__}: {exc}"}
        results.put(res)


def weights_subscriber(endpoints: dict[str, str], index: int, out: Any) -> None:
    from zrl.transport.sockets import Channel, TransportStats, connect_topics, make_socket

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


def start_broker(procs: Procs, log_dir: str) -> tuple[subprocess.Popen, str, dict[str, str]]:
    from zrl.config import DEFAULT_STREAMS
    from zrl.roles.base import registry_request
    from zrl.transport import protocol as P
    from zrl.transport.sockets import broker_endpoints

    base = free_port_range(3 + 2 * len(DEFAULT_STREAMS))
    addr = f"tcp://127.0.0.1:{base}"
    log = open(os.path.join(log_dir, "broker.log"), "wb")  # noqa: SIM115
    proc = procs.add(subprocess.Popen(
        [sys.executable, "-m", "zrl", "start", "broker", "--bind", addr, "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=log,
    ))  # fmt: skip
    ctx = zmq.Context.instance()
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}; see {log.name}")
        try:
            registry_request(ctx, addr, P.Message(P.STATUS), timeout=0.5)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise RuntimeError("broker did not answer within 30 s") from None
    return proc, addr, broker_endpoints(addr, list(DEFAULT_STREAMS))


class Worker:
    """A long-lived process running measurement jobs (see :func:`worker`)."""

    def __init__(self, procs: Procs, mpc: Any, stop: Any) -> None:
        self.cmds, self.results = mpc.Queue(), mpc.Queue()
        self.proc = procs.add(
            mpc.Process(target=worker, args=(self.cmds, self.results, stop), daemon=True)
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


def run_cell(
    producer: Worker, consumer: Worker, stop: Any,
    prod_job: tuple[str, tuple], cons_job: tuple[str, tuple],
) -> dict[str, Any]:  # fmt: skip
    """One measurement: start both jobs, take the consumer's figures, stop the producer."""
    global _cell
    _cell += 1
    stop.clear()
    consumer.submit(*cons_job, cell=_cell)
    producer.submit(*prod_job, cell=_cell)
    res = consumer.result()
    stop.set()
    prod = producer.result()
    if "error" in prod and "error" not in res:
        res = prod
    return res


# --- measurements -------------------------------------------------------------------


def throughput(
    procs: Procs, mpc: Any, args: argparse.Namespace, hwm: int, kbuf: int,
    endpoints: dict[str, str],
) -> list[dict[str, Any]]:  # fmt: skip
    warmup = min(1.0, max(0.3, 0.25 * args.seconds))
    stop = mpc.Event()
    producer, consumer = Worker(procs, mpc, stop), Worker(procs, mpc, stop)
    # (b)'s device, and the deep-queue one, live for the whole run like the broker.
    proxies = {}
    for name, h, k in [("b", hwm, kbuf)] + ([("b_deep", None, None)] if args.deep else []):
        base = free_port_range(2)
        ins, outs = f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 1}"
        procs.add(mpc.Process(target=proxy_device, args=(ins, outs, h, k), daemon=True)).start()
        proxies[name] = (ins, outs)
    rows = []
    for size in args.sizes:
        row: dict[str, Any] = {"size": size}
        # b and c twice, in ABBA order, so a drift in the machine's load hits both alike.
        order = [("a", hwm, kbuf), ("b", hwm, kbuf), ("c", hwm, kbuf), ("c", hwm, kbuf),
                 ("b", hwm, kbuf)]  # fmt: skip
        if args.deep:
            order += [("a_deep", None, None), ("b_deep", None, None)]
        for name, h, k in order:
            if name.startswith("a"):
                port = f"tcp://127.0.0.1:{free_port_range(1)}"
                res = run_cell(
                    producer,
                    consumer,
                    stop,
                    ("bare_producer", (port, False, size, h, k)),
                    ("bare_consumer", (port, True, size, h, k, warmup, args.seconds)),
                )
            elif name.startswith("b"):
                ins, outs = proxies[name]
                res = run_cell(
                    producer,
                    consumer,
                    stop,
                    ("bare_producer", (ins, False, size, h, k)),
                    ("bare_consumer", (outs, False, size, h, k, warmup, args.seconds)),
                )
            else:
                res = run_cell(producer, consumer, stop,
                               ("zrl_producer", (endpoints["experience_in"], size, hwm, kbuf)),
                               ("zrl_consumer", (endpoints["experience_out"], size, hwm, kbuf,
                                                 warmup, args.seconds)))  # fmt: skip
            row.setdefault(name, []).append(res)
        rows.append(row)
    for w in (producer, consumer):
        w.cmds.put(None)
    return rows


def weights_broadcast(procs: Procs, mpc: Any, endpoints: dict[str, str]) -> dict[str, Any]:
    from zrl.transport.protocol import WEIGHTS, Message
    from zrl.transport.sockets import Channel, TransportStats, make_socket

    out = mpc.Queue()
    subs = [
        procs.add(mpc.Process(target=weights_subscriber,
                              args=(endpoints, i, out), daemon=True))
        for i in range(WEIGHTS_SUBSCRIBERS)
    ]  # fmt: skip
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
            pub.send(Message(WEIGHTS, meta={"id": -1}, arrays={"ping": np.zeros(1, np.float32)}),
                     topic="weights", block=False)  # fmt: skip
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
            pub.send(Message(WEIGHTS, meta={"id": i, "version": i + 1}, arrays=weights),
                     topic="weights")  # fmt: skip
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


# --- output -------------------------------------------------------------------------


def human(n: int) -> str:
    for unit, div in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def rate(results: list[dict[str, Any]]) -> tuple[float, float] | None:
    """Mean msg/s and MB/s (10^6 payload bytes) over the measurements that succeeded."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return None
    return (
        float(np.mean([r["n"] / r["elapsed"] for r in ok])),
        float(np.mean([r["bytes"] / r["elapsed"] / 1e6 for r in ok])),
    )


def cell(results: list[dict[str, Any]]) -> str:
    r = rate(results)
    return f"{'error':>20}" if r is None else f"{r[0]:>10,.0f} {r[1]:>9,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--sizes", default="64,4096,65536,1048576",
                        help="message sizes in bytes, comma separated")  # fmt: skip
    parser.add_argument("--deep", action="store_true",
                        help="also (a) and (b) with libzmq's default HWM (1000) and "
                        "kernel-autotuned buffers")  # fmt: skip
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    import zrl
    from zrl.config import BrokerConfig

    bc = BrokerConfig()
    hwm, kbuf = bc.stream_hwm, bc.stream_buffer_bytes
    print(
        f"zrl {zrl.__version__} | pyzmq {zmq.__version__} | libzmq {zmq.zmq_version()} | "
        f"numpy {np.__version__} | python {sys.version.split()[0]} | {os.cpu_count()} cpus"
    )
    mpc = mp.get_context("spawn")
    procs = Procs()
    log_dir = tempfile.mkdtemp(prefix="zrl-bench-transport-")
    try:
        _broker, _addr, endpoints = start_broker(procs, log_dir)
        rows = throughput(procs, mpc, args, hwm, kbuf, endpoints)
        wb = weights_broadcast(procs, mpc, endpoints)
    finally:
        procs.stop_all()
    shutil.rmtree(log_dir, ignore_errors=True)  # kept only when the broker failed (raised above)
    codec = codec_costs()

    print()
    print(f"Throughput, tcp loopback, {args.seconds:g} s per cell after warm-up; every socket "
          f"HWM {hwm} msgs, SO_SNDBUF/SO_RCVBUF {kbuf // 1024} KiB (broker.stream_hwm, "
          f"broker.stream_buffer_bytes); b and c: mean of 2 runs in ABBA order")  # fmt: skip
    head = (f"{'size':>8} | {'(a) direct':^20} | {'(b) zmq.proxy':^20} | {'(c) zrl broker':^20} "
            f"| {'c/b':>5} | {'c/a':>5}")  # fmt: skip
    sub = f"{'':>8} | " + " | ".join(f"{'msg/s':>10} {'MB/s':>9}" for _ in range(3)) + " |       |"
    print(head)
    print(sub)
    print("-" * len(head))
    met = True
    for row in rows:
        ra, rb, rc = rate(row["a"]), rate(row["b"]), rate(row["c"])
        cb = rc[0] / rb[0] if rc and rb else float("nan")
        ca = rc[0] / ra[0] if rc and ra else float("nan")
        if row["size"] >= TARGET_MIN_SIZE and not cb >= TARGET_RATIO:
            met = False
        print(f"{human(row['size']):>8} | {cell(row['a'])} | {cell(row['b'])} | {cell(row['c'])} "
              f"| {cb:5.2f} | {ca:5.2f}")  # fmt: skip
    for row in rows:
        for name in ("a", "b", "c", "a_deep", "b_deep"):
            for res in row.get(name, []):
                if "error" in res:
                    print(f"  ({name}) {human(row['size'])}: {res['error']}")
                elif res.get("dropped") or res.get("gaps"):
                    print(f"  ({name}) {human(row['size'])}: {res['dropped']} dropped, "
                          f"{res['gaps']} sequence gaps")  # fmt: skip
    if args.deep:
        print()
        print("Deep queues: libzmq default HWM (1000 msgs), kernel-autotuned buffers")
        print(f"{'size':>8} | {'(a) direct':^20} | {'(b) zmq.proxy':^20}")
        for row in rows:
            print(f"{human(row['size']):>8} | {cell(row['a_deep'])} | {cell(row['b_deep'])}")

    print()
    print(f"Weights broadcast: {human(WEIGHTS_BYTES)} (10 float32 arrays) PUB -> broker "
          f"XSUB/XPUB -> {WEIGHTS_SUBSCRIBERS} SUB processes, send to decoded; "
          f"{WEIGHTS_SENDS} sends after {WEIGHTS_WARMUP_SENDS} warm-up")  # fmt: skip
    if "error" in wb:
        print(f"  error: {wb['error']}")
    else:
        lat = wb["latencies"] * 1e3  # [sends, subscribers] ms
        print(f"{'subscriber':>12} | {'median ms':>9} | {'max ms':>7}")
        for j in range(WEIGHTS_SUBSCRIBERS):
            print(f"{j:>12} | {np.median(lat[:, j]):9.1f} | {lat[:, j].max():7.1f}")
        last = lat.max(axis=1)  # per send: when the slowest subscriber had it
        print(f"{'all 4 (max)':>12} | {np.median(last):9.1f} | {last.max():7.1f}")

    print()
    print("encode() + decode() of a message with one uint8 array vs arr.copy() (median per call)")
    print(f"{'array':>8} | {'encode+decode µs':>16} | {'arr.copy() µs':>13} | shares memory")
    for size, c, cp, shares in codec:
        print(
            f"{human(size):>8} | {c * 1e6:16.1f} | {cp * 1e6:13.1f} | {'yes' if shares else 'NO'}"
        )

    print()
    print(
        f"target c/b >= {TARGET_RATIO} for >= {human(TARGET_MIN_SIZE)}: "
        f"{'MET' if met and any(r['size'] >= TARGET_MIN_SIZE for r in rows) else 'NOT MET'}"
    )


if __name__ == "__main__":
    main()
