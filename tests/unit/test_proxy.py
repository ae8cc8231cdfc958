"""The throttling proxy: its token bucket, and its rate raised for connections already open."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from pipeline.local.proxy import ThrottledProxy, TokenBucket


def test_token_bucket_paces_to_the_rate() -> None:
    bucket = TokenBucket(1000.0, burst=100.0, now=0.0)
    assert bucket.delay_for(100, 0.0) == 0.0
    assert bucket.delay_for(500, 0.0) == pytest.approx(0.5)
    # after waiting out the debt, the bucket refills at the rate
    assert bucket.delay_for(100, 0.6) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        TokenBucket(0)


def test_a_proxy_held_slow_lets_its_open_connections_go_when_its_rate_is_raised() -> None:
    """set_rate changes the rate of the connections already open (the task rehearsal holds eight children in their
    download, then lets them go): 256 KiB at 16 KiB/s would take 16 s."""
    payload = bytes(256 * 1024)
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(payload)

    threading.Thread(target=serve, daemon=True).start()
    with server, ThrottledProxy(server.getsockname()[1], 16 * 1024) as proxy, \
            socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
        received = client.recv(1 << 20)  # the first chunk, at the slow rate
        started = time.monotonic()
        proxy.set_rate(64 << 20)
        while len(received) < len(payload):
            chunk = client.recv(1 << 20)
            assert chunk, "the proxy closed early"
            received += chunk
        assert time.monotonic() - started < 2  # a wait begun at the slow rate (4 s a chunk) is cut short too
    with pytest.raises(ValueError):
        proxy.set_rate(0)
