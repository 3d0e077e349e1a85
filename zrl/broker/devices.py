"""The broker's device threads: the stream devices, and the thread the topic bus runs in.

Sockets (per stream S; see ``broker_endpoints`` for the ports):

- PULL ``S_in`` / PUSH ``S_out``: load-balanced pipelines (experience, batches, ...) in a
  ``zmq.proxy_steerable`` running in C in its own thread; no stream byte passes through
  Python. PUSH semantics: a full queue blocks the producer (back-pressure).
- per device, an inproc PAIR pair: TERMINATE on it ends the device.

Device sockets have no timeouts: ``zmq_proxy`` gives up for good on the first EAGAIN,
losing the message in flight and the whole device, so a full PUSH side blocks instead. A
device blocked there never reads TERMINATE; the broker's own context ends it (``ctx.term()``
wakes it with ETERM).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import zmq

from zrl.transport.security import Keys
from zrl.transport.sockets import make_socket

# A device's own loop instead of zmq.proxy_steerable: (frontend, backend, control) -> None,
# returning when TERMINATE arrives on control.
DeviceLoop = Callable[[zmq.Socket, zmq.Socket, zmq.Socket], None]


class Devices:
    """The device threads of one broker, each with its control socket."""

    def __init__(self, ctx: zmq.Context, keys: Keys | None, max_message_bytes: int) -> None:
        self.ctx = ctx
        self.keys = keys
        self.max_message_bytes = max_message_bytes
        self._threads: list[threading.Thread] = []
        self._controls: list[zmq.Socket] = []

    def socket(
        self,
        kind: int,
        hwm: int,
        kernel_buffer: int | None = None,
        *,
        max_message_bytes: int | None = None,
    ) -> zmq.Socket:
        # No timeouts: zmq_proxy gives up for good on the first EAGAIN, losing the message in
        # flight and the whole device. A full PUSH side must block (back-pressure) instead.
        return make_socket(
            self.ctx,
            kind,
            sndhwm=hwm,
            rcvhwm=hwm,
            rcvtimeo_ms=-1,
            sndtimeo_ms=-1,
            max_message_bytes=max_message_bytes or self.max_message_bytes,
            kernel_buffer_bytes=kernel_buffer,
            keys=self.keys,
            server=True,
        )

    def start(
        self,
        name: str,
        frontend: zmq.Socket,
        backend: zmq.Socket,
        loop: DeviceLoop | None = None,
    ) -> None:
        """Run a device (``zmq.proxy_steerable``, or ``loop``) between two bound sockets in
        its own thread; it closes them when it ends."""
        ctrl_addr = f"inproc://zrl-broker-ctrl-{id(self)}-{name}"
        ctrl_server = make_socket(self.ctx, zmq.PAIR, rcvtimeo_ms=-1)
        ctrl_server.bind(ctrl_addr)
        ctrl_client = make_socket(self.ctx, zmq.PAIR)
        ctrl_client.connect(ctrl_addr)
        self._controls.append(ctrl_client)

        def device() -> None:
            try:
                if loop is not None:
                    loop(frontend, backend, ctrl_server)
                    return
                while True:
                    try:
                        zmq.proxy_steerable(frontend, backend, None, ctrl_server)
                        return  # TERMINATE
                    except zmq.Again:
                        # With CURVE, a connection's first message can make a socket report
                        # readable before a part is there; zmq_proxy gives up on that EAGAIN
                        # before forwarding anything, so going back into the proxy loses nothing.
                        continue
            except zmq.ContextTerminated:
                pass
            finally:
                for s in (frontend, backend, ctrl_server):
                    s.close(linger=0)

        t = threading.Thread(target=device, name=f"zrl-device-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def close(self) -> None:
        for ctrl in self._controls:
            try:
                ctrl.send(b"TERMINATE", flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        # A device blocked on a full PUSH side never reads TERMINATE; with its own context
        # the broker's ctx.term() wakes it. With a shared context we can only stop waiting.
        for t in self._threads:
            t.join(timeout=1.0)
        for ctrl in self._controls:
            ctrl.close(linger=0)
        self._controls.clear()
        self._threads.clear()
