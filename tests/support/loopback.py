"""An HTTP server on loopback for the length of a block: the stand-ins tests point a client or a script at (a web
site where S3 should be, IMDS, CloudWatch Logs, the ECS task metadata endpoint)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Quiet(BaseHTTPRequestHandler):
    """A handler that writes no line per request to stderr; alone, it answers every method 501."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1") -> Iterator[str]:
    """`handler` served on `host` at a free port, one thread a request, for the block; yields "http://host:port"."""
    server = ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
