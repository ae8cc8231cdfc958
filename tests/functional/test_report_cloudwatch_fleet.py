"""`report --from-cloudwatch` at fleet size: 20,000 children's EMF documents in CloudWatch Logs (moto server),
read page by page (FilterLogEvents gives at most 10,000 events a call), and the straggler still found.

The documents are the sidecar's real EMF (profiling.emf through aws-embedded-metrics), one log stream per
child as the awslogs driver writes them.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import boto3
import pytest

from profiling import emf
from profiling.metrics import MIB, StageProfile
from profiling.report import find_bad_apples, load_cloudwatch, render_html

pytestmark = pytest.mark.untimed  # runs beside the guest's boots (tests/conftest.py)

moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install 'moto[server]')")

GROUP = "/aws/batch/iobatch-fleet"
CHILDREN = 20_000
SLOW = 12_345
STREAMS = 40  # children per stream: CHILDREN / STREAMS, as many hosts' profilers would


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def logs() -> Iterator[object]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    try:
        yield boto3.client("logs", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{server._port}",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
    finally:
        server.stop()


def download(child: int, now: float) -> StageProfile:
    rate = 150.0 * (0.85 + 0.3 * ((child * 7919) % 101) / 100) * (0.1 if child == SLOW else 1.0)
    duration = 100 / rate
    ended = now - 1800 + (child // 1000) * 60 + (child % 1000) * 0.01
    return StageProfile(
        stage="download", outcome="ok", started_at=ended - duration, duration_s=duration,
        read_bytes=100 * MIB, write_bytes=100 * MIB, device_write_latency_ms=3.0, peak_dirty_bytes=250 * MIB,
        properties={"Pipeline": "iobatch", "JobId": f"job-9:{child}", "ArrayIndex": str(child),
                    "InstanceId": f"i-{child // 8:05x}", "InstanceType": "m5.large", "VolumeType": "st1"},
    )


def test_20000_childrens_documents_are_paged_and_the_straggler_found(logs: object) -> None:
    client: object = logs
    now = time.time()
    client.create_log_group(logGroupName=GROUP)  # type: ignore[attr-defined]
    per_stream = CHILDREN // STREAMS
    for stream in range(STREAMS):
        events = []
        for child in range(stream * per_stream, (stream + 1) * per_stream):
            (doc,) = emf.serialize(download(child, now))
            events.append({"timestamp": json.loads(doc)["_aws"]["Timestamp"], "message": doc})
        name = f"iobatch/profiler/{stream}"
        client.create_log_stream(logGroupName=GROUP, logStreamName=name)  # type: ignore[attr-defined]
        for start in range(0, len(events), 250):  # PutLogEvents: at most 1 MiB a call
            client.put_log_events(logGroupName=GROUP, logStreamName=name,  # type: ignore[attr-defined]
                                  logEvents=sorted(events[start:start + 250], key=lambda e: e["timestamp"]))
    calls: list[int] = []
    client.meta.events.register("after-call.cloudwatch-logs.FilterLogEvents",  # type: ignore[attr-defined]
                                lambda **kwargs: calls.append(len(kwargs["parsed"].get("events", []))))
    pages: list[tuple[int, int]] = []
    data = load_cloudwatch(client, GROUP, since_s=3600, now=now, progress=lambda p, e: pages.append((p, e)))
    assert len(calls) >= 2 and max(calls) <= 10_000  # paged: no call returned everything
    assert pages[-1] == (len(calls), CHILDREN) and [p for p, _ in pages] == list(range(1, len(calls) + 1))
    assert not data.complete and data.child_count() == CHILDREN
    apples = find_bad_apples(data)
    assert [(a.stage, a.scope, a.name) for a in apples] == [("download", "child", f"child {SLOW}")]
    page = render_html(data)
    assert f"data-name='child {SLOW}'" in page and "id=no-timelines" in page
    assert len(page) < 2_000_000
