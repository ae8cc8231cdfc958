"""Instance identity from IMDSv2 (token first, then the token on every read), against a local stand-in."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from profiling.identity import instance_identity

TOKEN = "tok-123"
ECS = {"ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/x"}


class _Imds(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return None

    def _send(self, code: int, body: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self._send(200, TOKEN)
        else:
            self._send(400, "")

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
            self._send(401, "")  # IMDSv2 only: no token, no answer
            return
        answers = {"/latest/meta-data/instance-id": "i-0123456789abcdef0",
                   "/latest/meta-data/instance-type": "m5.xlarge"}
        if self.path in answers:
            self._send(200, answers[self.path])
        else:
            self._send(404, "")


@pytest.fixture()
def imds() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Imds)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/latest"
    server.shutdown()
    server.server_close()


def test_in_a_container_the_identity_comes_from_imdsv2(imds: str) -> None:
    assert instance_identity(ECS, base_url=imds) == ("i-0123456789abcdef0", "m5.xlarge")


def test_outside_ecs_it_is_the_host_name_and_local(imds: str) -> None:
    assert instance_identity({}, base_url=imds) == (socket.gethostname(), "local")


def test_an_unreachable_imds_gives_unknown_quickly() -> None:
    # A closed port on loopback: refused at once, as a blocked hop limit would time out (0.5 s) instead.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert instance_identity(ECS, base_url=f"http://127.0.0.1:{port}/latest") == ("unknown", "unknown")
