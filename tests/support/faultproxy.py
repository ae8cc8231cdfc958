"""The suite's fault injector: an HTTP/1.1 proxy in front of an S3 endpoint, used by tests/faults/.

`FaultProxy(upstream_port, plan)` listens on 127.0.0.1:<port> and forwards every request to the
upstream S3 server, except that, as the plan says, it

- answers ``503 SlowDown`` or ``500 InternalError`` with a proper S3 XML error body,
- resets the connection (TCP RST), either before answering or half-way through the response body,
- answers slowly (sleeps before forwarding).

Each decision is a pure function of (seed, method, request target, Range header, how many times that
request was seen), so a run is reproducible however requests interleave across connections, and a
retried request draws a fresh decision (as a real transient fault would).

HTTP/1.1 is parsed well enough to keep connections alive: request bodies are read by Content-Length or
chunked encoding, ``Expect: 100-continue`` is answered here, responses are relayed by Content-Length,
chunked encoding or until close. After an injected error whose request body was not read, the proxy
answers ``Connection: close`` and closes, so the client never sees a stray body as the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

MAX_HEAD = 64 * 1024
CHUNK = 64 * 1024

# What a fault decision can be.
PASS = "pass"
SLOWDOWN = "503 SlowDown"
INTERNAL = "500 InternalError"
RESET = "reset"
RESET_MID_BODY = "reset mid-body"
SLOW = "slow"


@dataclass(frozen=True)
class FaultPlan:
    """How often each fault happens, per request. Rates add up to at most 1."""

    seed: int = 0
    error_rate: float = 0.0  # 503 SlowDown or 500 InternalError, half each
    reset_rate: float = 0.0  # connection reset, half before the response and half mid-body
    slow_rate: float = 0.0  # the answer is delayed by slow_s
    slow_s: float = 0.3
    # Only requests this predicate accepts are faulted (default: all). Arguments: method, path.
    applies: Callable[[str, str], bool] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        rates = (self.error_rate, self.reset_rate, self.slow_rate)
        if any(r < 0 for r in rates) or sum(rates) > 1.0 + 1e-9:
            raise ValueError(f"fault rates must be >= 0 and add up to at most 1, got {rates}")

    @property
    def total_rate(self) -> float:
        return self.error_rate + self.reset_rate + self.slow_rate


def draw(seed: int, method: str, request: str, attempt: int) -> float:
    """A uniform number in [0, 1) fixed by the seed, the request and its attempt number (pure)."""
    digest = hashlib.blake2b(f"{seed}\0{method}\0{request}\0{attempt}".encode(), digest_size=8).digest()
    return struct.unpack(">Q", digest)[0] / 2**64


def decide(plan: FaultPlan, method: str, path: str, attempt: int, request: str | None = None) -> str:
    """The fault (or PASS) for the `attempt`-th time a request is seen (pure). `request` tells requests
    to the same path apart (query, Range); `applies` sees the path."""
    if plan.applies is not None and not plan.applies(method, path):
        return PASS
    u = draw(plan.seed, method, request or path, attempt)
    edge = plan.error_rate
    if u < edge:
        return SLOWDOWN if u < edge / 2 else INTERNAL
    if u < edge + plan.reset_rate:
        # Mid-body resets only make sense where there is a body worth cutting: GETs.
        return RESET_MID_BODY if method == "GET" and u >= edge + plan.reset_rate / 2 else RESET
    if u < edge + plan.reset_rate + plan.slow_rate:
        return SLOW
    return PASS


def error_response(status: int, code: str, message: str, resource: str, *, close: bool) -> bytes:
    """A complete S3-style XML error response."""
    body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<Resource>{_xml_escape(resource)}</Resource><RequestId>iobatch-faultproxy</RequestId></Error>").encode()
    reason = {503: "Service Unavailable", 500: "Internal Server Error"}.get(status, "Error")
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            f"x-amz-request-id: iobatch-faultproxy\r\nConnection: {'close' if close else 'keep-alive'}\r\n\r\n")
    return head.encode() + body


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@dataclass
class Head:
    """A parsed request or status line plus headers (names lower-cased, order kept)."""

    start: str
    headers: list[tuple[str, str]]

    def get(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def encode(self, drop: tuple[str, ...] = ()) -> bytes:
        lines = [self.start] + [f"{k}: {v}" for k, v in self.headers if k not in drop]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class BadRequest(Exception):
    pass


def parse_head(raw: bytes) -> Head:
    """Bytes up to and including the blank line -> Head (pure)."""
    text = raw.decode("latin-1").rstrip("\r\n")
    lines = text.split("\r\n")
    if not lines or not lines[0]:
        raise BadRequest("empty request line")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(f"malformed header line {line!r}")
        headers.append((name.strip().lower(), value.strip()))
    return Head(lines[0], headers)


async def _read_head(reader: asyncio.StreamReader) -> Head | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise BadRequest("connection closed inside a header") from None
        return None
    except asyncio.LimitOverrunError:
        raise BadRequest("header too large") from None
    return parse_head(raw)


async def _read_body(reader: asyncio.StreamReader, head: Head) -> bytes:
    """The whole message body as sent on the wire (chunked framing kept)."""
    if (head.get("transfer-encoding") or "").lower().endswith("chunked"):
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            out += size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    trailer = await reader.readuntil(b"\r\n")
                    out += trailer
                    if trailer == b"\r\n":
                        return bytes(out)
            out += await reader.readexactly(size + 2)
    length = int(head.get("content-length") or 0)
    return await reader.readexactly(length) if length else b""


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN: SO_LINGER with a zero timeout."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """`with FaultProxy(upstream_port, FaultPlan(seed=1, error_rate=0.05)) as proxy: proxy.endpoint`."""

    def __init__(self, upstream_port: int, plan: FaultPlan, *, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.plan = plan
        self.port = 0
        self.counts: Counter[str] = Counter()  # decision -> how many times it was applied
        self.connections = 0  # client connections accepted: keep-alive shows as fewer than requests
        self._seen: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> int:
        return sum(self.counts.values())

    @property
    def injected(self) -> int:
        return self.requests - self.counts[PASS]

    def _decide(self, method: str, path: str, request: str) -> str:
        with self._lock:
            attempt = self._seen[(method, request)]
            self._seen[(method, request)] += 1
            decision = decide(self.plan, method, path, attempt, request)
            self.counts[decision] += 1
        return decision

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        with self._lock:
            self.connections += 1
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    return
                method, _, rest = head.start.partition(" ")
                target = rest.rpartition(" ")[0]
                path = target.split("?")[0]
                # Ranged GETs of one object (children reading their slice of a manifest) are different requests.
                decision = self._decide(method, path, f"{target} {head.get('range') or ''}")
                expects = (head.get("expect") or "").lower() == "100-continue"
                if decision in (SLOWDOWN, INTERNAL):
                    # Answer at once; the body (if any) is unread unless the client waits for 100-continue.
                    has_body = bool(head.get("transfer-encoding")) or int(head.get("content-length") or 0) > 0
                    close = has_body and not expects
                    status, code, message = ((503, "SlowDown", "Please reduce your request rate.")
                                             if decision == SLOWDOWN else
                                             (500, "InternalError", "We encountered an internal error. "
                                              "Please try again."))
                    writer.write(error_response(status, code, message, path, close=close or expects))
                    await writer.drain()
                    if close or expects:
                        return
                    continue
                if decision == RESET:
                    _abort(writer)
                    return
                if expects:
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await writer.drain()
                body = await _read_body(reader, head)
                if decision == SLOW:
                    await asyncio.sleep(self.plan.slow_s)
                if upstream is None:
                    upstream = await asyncio.open_connection(*self.upstream)
                up_reader, up_writer = upstream
                up_writer.write(head.encode(drop=("expect",)) + body)
                await up_writer.drain()
                client_keep, upstream_keep = await self._relay_response(up_reader, writer, method,
                                                                        cut=decision == RESET_MID_BODY)
                if not upstream_keep:
                    # Connection is hop-by-hop: the client's connection outlives the upstream's.
                    upstream[1].close()
                    upstream = None
                if not client_keep:
                    return
                if (head.get("connection") or "").lower() == "close":
                    return
        except (BadRequest, ValueError):
            with contextlib.suppress(Exception):
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError,
                asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            if upstream is not None:
                with contextlib.suppress(Exception):
                    upstream[1].close()

    async def _relay_response(self, up: asyncio.StreamReader, client: asyncio.StreamWriter, method: str, *,
                              cut: bool) -> tuple[bool, bool]:
        """Copy one response upstream -> client; return whether (client, upstream) connections stay open.

        `Connection` is a hop-by-hop header: the client is told keep-alive whenever the body's length is
        known, whatever the upstream does with its own connection."""
        while True:
            head = await _read_head(up)
            if head is None:
                raise ConnectionResetError("upstream closed")
            status = int(head.start.split(" ")[1])
            if status != 100:
                break
        length = head.get("content-length")
        chunked = (head.get("transfer-encoding") or "").lower().endswith("chunked")
        upstream_keep = (head.get("connection") or "").lower() != "close"
        framed = chunked or length is not None or method == "HEAD" or status in (204, 304)
        head.headers = [(k, v) for k, v in head.headers if k not in ("connection", "keep-alive")]
        head.headers.append(("connection", "keep-alive" if framed else "close"))
        client.write(head.encode())
        if method == "HEAD" or status in (204, 304):
            await client.drain()
            return True, upstream_keep
        if chunked:
            body = await _read_body(up, head)
            if cut:
                client.write(body[: len(body) // 2])
                await client.drain()
                _abort(client)
                return False, False
            client.write(body)
        elif length is not None:
            remaining = int(length)
            half = remaining // 2
            sent = 0
            while remaining:
                data = await up.read(min(CHUNK, remaining))
                if not data:
                    raise ConnectionResetError("upstream closed mid-body")
                if cut and sent + len(data) > half:
                    client.write(data[: max(0, half - sent)])
                    await client.drain()
                    _abort(client)
                    return False, False
                client.write(data)
                sent += len(data)
                remaining -= len(data)
                await client.drain()
        else:
            while data := await up.read(CHUNK):
                client.write(data)
            await client.drain()
            return False, False
        await client.drain()
        return True, upstream_keep

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, limit=MAX_HEAD)
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()

        loop.run_until_complete(start())
        loop.run_forever()
        # Let open handlers see their connections closed before the loop goes away.
        tasks = list(asyncio.all_tasks(loop))
        for task in tasks:
            task.cancel()
        with contextlib.suppress(BaseException):
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(5):
            raise RuntimeError("the fault proxy did not start")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        loop = self._loop
        if loop is not None:
            if self._server is not None:
                loop.call_soon_threadsafe(self._server.close)
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=5)
