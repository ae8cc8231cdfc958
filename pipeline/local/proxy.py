"""A TCP proxy on loopback that can slow a connection down, to make one child a measurable bad apple.

`ThrottledProxy(upstream_port, rate_bps)` forwards 127.0.0.1:<port> to 127.0.0.1:<upstream_port> and
limits each direction to `rate_bps` bytes per second in all: one token bucket per direction, shared by
every connection (s5cmd opens several at once; a per-connection limit would multiply the rate). It runs
in a daemon thread with its own asyncio loop, and stops with its `with` block.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from types import TracebackType

CHUNK = 64 * 1024


class TokenBucket:
    """Pure rate arithmetic: how long to wait before sending `n` more bytes at `rate` bytes/s."""

    def __init__(self, rate_bps: float, burst: float | None = None, now: float | None = None) -> None:
        if rate_bps <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate_bps
        self.capacity = burst if burst is not None else max(float(CHUNK), rate_bps / 10)
        self.tokens = self.capacity
        self.stamp = time.monotonic() if now is None else now

    def delay_for(self, n: int, now: float) -> float:
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class ThrottledProxy:
    def __init__(self, upstream_port: int, rate_bps: float, *, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.rate_bps = rate_bps
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._ready = threading.Event()
        self._buckets = {"up": TokenBucket(rate_bps), "down": TokenBucket(rate_bps)}
        self._rate_changed: asyncio.Event | None = None  # made in the proxy's loop; set (and replaced) by set_rate
        self._thread = threading.Thread(target=self._run, name="throttled-proxy", daemon=True)

    def set_rate(self, rate_bps: float) -> None:
        """Both directions at `rate_bps` from now on (a test holds children in their download, then lets them go)."""
        if rate_bps <= 0:
            raise ValueError("rate must be positive")
        for bucket in self._buckets.values():  # in place: every open connection holds its direction's bucket
            bucket.rate = rate_bps
            bucket.capacity = max(float(CHUNK), rate_bps / 10)
        if self._loop is not None:  # wake the connections waiting at the old rate: their wait is recomputed
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self._rate_changed is not None:
            self._rate_changed.set()
        self._rate_changed = asyncio.Event()

    async def _pace(self, bucket: TokenBucket, n: int) -> None:
        """Wait until `n` bytes may go at the bucket's rate; a rate changed meanwhile applies at once."""
        delay = bucket.delay_for(n, time.monotonic())
        while delay > 0:
            assert self._rate_changed is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rate_changed.wait(), delay)
            delay = bucket.delay_for(0, time.monotonic())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, bucket: TokenBucket) -> None:
        try:
            while data := await reader.read(CHUNK):
                await self._pace(bucket, len(data))
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(self._pipe(client_reader, up_writer, self._buckets["up"]),
                             self._pipe(up_reader, client_writer, self._buckets["down"]))

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def start() -> None:
            self._wake()
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()

        loop.run_until_complete(start())
        loop.run_forever()
        loop.close()

    def __enter__(self) -> ThrottledProxy:
        self._thread.start()
        if not self._ready.wait(5):
            raise RuntimeError("the throttling proxy did not start")
        return self

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=5)
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=5)
