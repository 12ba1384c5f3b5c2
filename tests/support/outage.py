"""A store that goes away when the test says so. On S3: a TCP forwarder in front of the real endpoint.

with Outage(endpoint) as outage:
    store = BundleStore(url, {**options, "endpoint_url": outage.endpoint})
    bundle = store.open(1)          # through the forwarder, to the real server
    outage.cut()                    # connections open through it are dropped, new ones refused
    bundle.read_bytes("x")          # sees the server gone, as after a crash or a network partition
    outage.restore()                # ... and back, on the same endpoint
    outage.stall()                  # a store that takes every request and answers none ...
    outage.wait_until_held()        # (a request waits on it now)
    outage.answer()                 # ... until now: what it held goes through

The session's S3 server keeps running for every other test.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from rlckpt.store import BundleStore
from support.permissions import mode_enforced

_CHUNK = 64 << 10


class Outage:
    """Forward 127.0.0.1:<port> to `target` (an http://host:port endpoint) until `cut()`."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"target {target!r} must be http://host:port")
        self._upstream = (parts.hostname, parts.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._port = int(self._listener.getsockname()[1])
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut = False
        self._flowing = threading.Event()  # cleared by stall(): connections are taken, bytes are held
        self._flowing.set()
        self._held = threading.Condition(self._lock)  # notified when a stall holds another request
        self._held_count = 0
        self._accepting = threading.Thread(target=self._accept, name="outage-accept", daemon=True)

    @property
    def endpoint(self) -> str:
        """The URL to give the store as its `endpoint_url`."""
        return f"http://127.0.0.1:{self._port}"

    def __enter__(self) -> Outage:
        self._accepting.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cut()
        self._accepting.join(timeout=10)

    def cut(self) -> None:
        """The server goes away: the port stops listening and every connection through it is reset."""
        with self._lock:
            self._cut = True
            doomed = [self._listener, *self._open]
            self._open.clear()
        for sock in doomed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def stall(self) -> None:
        """The server goes silent: it still accepts connections, but no byte goes either way (requests sent
        before are held too) until ``answer()``; nothing is refused or reset, so no client gives up early."""
        self._flowing.clear()

    def answer(self) -> None:
        """The silent server answers again: what was held goes through, in order."""
        self._flowing.set()

    def held(self) -> int:
        """How many times a stall has held bytes on their way (a request, or its answer), so far."""
        with self._lock:
            return self._held_count

    def wait_until_held(self, timeout: float = 60.0) -> bool:
        """Block until a stall holds bytes on their way (a call waits on the store); False after `timeout` s."""
        with self._held:
            return self._held.wait_for(lambda: self._held_count > 0, timeout)

    def _hold(self) -> None:
        with self._held:
            self._held_count += 1
            self._held.notify_all()

    def restore(self) -> None:
        """The server is back, on the same endpoint: new connections go through again (a cut is undone)."""
        self._accepting.join(timeout=10)
        with self._lock:
            self._listener = socket.create_server(("127.0.0.1", self._port))
            self._cut = False
        self._accepting = threading.Thread(target=self._accept, name="outage-accept", daemon=True)
        self._accepting.start()

    def _track(self, *socks: socket.socket) -> bool:
        with self._lock:
            if self._cut:
                return False
            self._open.update(socks)
            return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # cut: the listener is closed
            try:
                upstream = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            if not self._track(client, upstream):
                client.close()
                upstream.close()
                return
            for source, sink in ((client, upstream), (upstream, client)):
                pump = threading.Thread(
                    target=_pump, args=(source, sink, self._flowing, self._hold), name="outage-pump", daemon=True
                )
                pump.start()


def _pump(source: socket.socket, sink: socket.socket, flowing: threading.Event, hold: Callable[[], None]) -> None:
    """Copy bytes one way until either side closes (or the outage closes both), holding them while stalled
    (`hold` is told each time)."""
    try:
        while chunk := source.recv(_CHUNK):
            if not flowing.is_set():
                hold()
            flowing.wait()
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


# One attempt per request and a short connect timeout, so that a store whose server is gone refuses at once
# instead of after botocore's retries (5 attempts with back-off by default).
ONE_QUICK_ATTEMPT = {"connect_timeout": 2, "read_timeout": 10, "retries": {"total_max_attempts": 1}}


@dataclass
class VanishingStore:
    """A store that works until `away()`: from then on, for the rest of that block, it is gone."""

    store: BundleStore
    away: Callable[[], contextlib.AbstractContextManager[Any]]


@contextlib.contextmanager
def vanishing_store(url: str, options: dict[str, Any] | None) -> Iterator[VanishingStore]:
    """The store at `store_location`'s (url, options): on S3 behind an Outage (built with ONE_QUICK_ATTEMPT),
    whose `away()` cuts it for good; on local disk, `away()` denies access to the run directory for the
    block (enforced as root too)."""
    if options is None:
        local = BundleStore(url)
        yield VanishingStore(local, lambda: mode_enforced(local.root, 0o000))
        return
    with Outage(options["endpoint_url"]) as outage:
        store = BundleStore(url, {**options, "endpoint_url": outage.endpoint, "config_kwargs": ONE_QUICK_ATTEMPT})

        @contextlib.contextmanager
        def away() -> Iterator[None]:
            outage.cut()
            yield

        yield VanishingStore(store, away)
